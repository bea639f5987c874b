"""Lesson 00's interview sprint links each section it lists, and JupyterLab opens the lesson at that section.

Issue 32: the sprint listed its 23 sections as plain text. Its links carry the id JupyterLab gives a heading
(`kvlesson.teaching.syllabus.anchor`: the heading's text, spaces made hyphens); the site gives its headings the same
ids (tests/test_site.py checks every link there). Here a learner's click: lesson 00 runs, its sprint table renders,
and the link to lesson 05's "4. The decode floor" opens lesson 05 with that heading in view.
"""
import re

import pytest

pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")
from playwright.sync_api import expect  # noqa: E402

from tests.browser.jupyterlab import finish_run_all  # noqa: E402

TARGET = "4. The decode floor"


@pytest.mark.parametrize("page", ["00_start_here.ipynb"], indirect=True)
def test_a_sprint_link_opens_its_section(page):
    finish_run_all(page)
    links = page.locator(".jp-RenderedMarkdown.jp-OutputArea-output a", has_text=re.compile(r"^\d\d · "))
    expect(links.first, "the sprint's links").to_be_visible()
    assert links.count() == 23, f"the sprint links {links.count()} sections"
    link = links.filter(has_text=f"05 · {TARGET}")
    assert link.get_attribute("href").endswith("05_gqa.ipynb#4.-The-decode-floor")
    link.scroll_into_view_if_needed()
    link.click()
    heading = page.locator(".jp-NotebookPanel:visible h2", has_text=TARGET)
    expect(heading, f"lesson 05's heading {TARGET!r}").to_be_visible()
    expect(page.locator(".lm-TabBar-tab.lm-mod-current", has_text="05_gqa.ipynb").first).to_be_visible()
    box, window = heading.bounding_box(), page.viewport_size
    assert 0 <= box["y"] < window["height"], f"the heading sits at y = {box['y']:.0f}, outside the window"
