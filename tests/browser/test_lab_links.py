"""Lesson 00's interview sprint links each section it lists, and JupyterLab opens the lesson at that section.

Issue 32: the sprint listed its 23 sections as plain text. Its links carry the id JupyterLab gives a heading
(`kvlesson.teaching.syllabus.anchor`: the heading's text, spaces made hyphens); the site gives its headings the same
ids (tests/test_site.py checks every link there). Here a learner's clicks: lesson 00 runs, its sprint table renders,
and the link to lesson 05's "4. The decode floor" opens lesson 05; clicked again, it shows that heading. (JupyterLab
4.6 looks for the heading as soon as it opens a notebook, before its cells have rendered, so the first click leaves
the lesson at its top: jupyterlab/jupyterlab#15207. With the lesson open, the same link scrolls to the heading.)
"""
import re
import time
from urllib.parse import urlsplit

import pytest

pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")
from playwright.sync_api import expect  # noqa: E402

from tests.browser.jupyterlab import finish_run_all  # noqa: E402

TARGET = "4. The decode floor"
SCROLL_TIMEOUT_S = 15  # the lab scrolls once the lesson has rendered; only reached on failure


@pytest.mark.parametrize("page", ["00_start_here.ipynb"], indirect=True)
def test_a_sprint_link_opens_its_section(page):
    finish_run_all(page)
    links = page.locator(".jp-RenderedMarkdown.jp-OutputArea-output a", has_text=re.compile(r"^\d\d · "))
    expect(links.first, "the sprint's links").to_be_visible()
    assert links.count() == 23, f"the sprint links {links.count()} sections"
    link = links.filter(has_text=f"05 · {TARGET}")
    href = urlsplit(link.get_attribute("href"))  # the lab writes it as its own /files/ address, query and all
    assert href.path.endswith("/05_gqa.ipynb") and href.fragment == "4.-The-decode-floor", href
    heading = page.locator(".jp-NotebookPanel:visible h2", has_text=TARGET)
    for _ in range(2):  # open the lesson, then follow the link into it
        page.locator(".lm-TabBar-tab", has_text="00_start_here.ipynb").first.click()
        link.scroll_into_view_if_needed()
        link.click()
        expect(heading, f"lesson 05's heading {TARGET!r}").to_be_visible()
    expect(page.locator(".lm-TabBar-tab.lm-mod-current", has_text="05_gqa.ipynb").first).to_be_visible()
    height = page.viewport_size["height"]
    deadline = time.monotonic() + SCROLL_TIMEOUT_S
    while not 0 <= (y := heading.bounding_box()["y"]) < height and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 0 <= y < height, f"the heading sits at y = {y:.0f}, outside the window"
