"""Fixtures for the browser tests: one JupyterLab, one headless system Chromium, the lessons open and running.

Nothing is downloaded: Playwright drives the Chromium the system already has (Debian's `chromium`). Where
Playwright or Chromium is missing the tests skip and say which. Everything is package-scoped, so the server,
its kernels and the browser close as soon as the browser tests are done. A failing test leaves a screenshot and
the page's text in a temporary folder, and its report says where.
"""
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from tests.browser.jupyterlab import CHROMIUM_FLAGS, CHROMIUM_NAMES, CHROMIUM_PATHS, Lab, find_chromium, start_run_all

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LESSONS = ("04_offset_mask.ipynb", "05_gqa.ipynb", "00_start_here.ipynb")  # 00 links into 05 (its sprint)
STEP_TIMEOUT_MS = 20_000  # one click, or one redraw by the kernel: bounds a hang on a busy machine
EVIDENCE = []  # the folder failures are saved to, made on the first one


@pytest.fixture(scope="package")
def chromium():
    """The system Chromium's path; skips, saying why, where Playwright or Chromium is missing."""
    pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")
    path = find_chromium()
    if path is None:
        pytest.skip(f"no system Chromium: none of {CHROMIUM_NAMES} on PATH nor {CHROMIUM_PATHS} "
                    "(Debian: apt-get install chromium)")
    return path


@pytest.fixture(scope="package")
def lab(chromium, tmp_path_factory):
    """JupyterLab serving lessons 00, 04 and 05, shut down whatever happens. Waited for in `lessons`, so that
    Chromium starts while the server does."""
    server = Lab(tmp_path_factory.mktemp("jupyterlab"), [NOTEBOOKS / name for name in LESSONS])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def browser(chromium, tmp_path_factory):
    """A headless Chromium with one context (the second tab reuses the first one's cached scripts)."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=STEP_TIMEOUT_MS)
    home = tmp_path_factory.mktemp("chromium")  # its crash reports and caches, kept out of the user's home
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(STEP_TIMEOUT_MS)
        yield context
        context.close()
        browser.close()


@pytest.fixture(scope="package")
def lessons(lab, browser):
    """Each lesson in a tab of its own, with Run All started in each: the kernels work side by side."""
    lab.wait_until_up()
    tabs = {name: browser.new_page() for name in LESSONS}
    try:
        for name, tab in tabs.items():
            tab.goto(lab.url(name))
        for tab in tabs.values():
            start_run_all(tab)
    except Exception:
        for name, tab in tabs.items():
            save_evidence(tab, f"starting_{name}")
        raise
    yield tabs
    for tab in tabs.values():
        tab.close()


@pytest.fixture
def page(lessons, request):
    """The tab of the lesson a test names: @pytest.mark.parametrize("page", [lesson], indirect=True)."""
    return lessons[request.param]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing browser test leaves a screenshot and the page's text behind, and its report says where."""
    report = yield
    page = getattr(item, "funcargs", {}).get("page")
    if report.when == "call" and report.failed and page is not None:
        report.sections.append(("browser evidence", save_evidence(page, item.name)))
    return report


def save_evidence(page, name):
    if not EVIDENCE:
        EVIDENCE.append(Path(tempfile.mkdtemp(prefix="kvlesson-browser-")))
    stem = EVIDENCE[0] / re.sub(r"[^\w.-]+", "_", name)
    try:
        page.screenshot(path=f"{stem}.png")
        Path(f"{stem}.txt").write_text(page.inner_text("body"), encoding="utf-8")
    except Exception as error:  # a crashed page must not hide the failure that crashed it
        return f"could not save the page ({error!r}); evidence folder: {EVIDENCE[0]}"
    message = f"screenshot: {stem}.png\npage text: {stem}.txt"
    print(f"\n{message}", file=sys.stderr)
    return message
