"""The site builds offline from the committed notebooks, shows what a student copy shows, typesets its formulas
offline, keeps every output inside its box, and has no broken link.

One build (the README's command, `python scripts/build_site.py`) into a temporary folder serves every test here, with
the network closed: any proxy-aware fetch goes to a closed port. The pages are then read as files, and opened in the
system Chromium (Playwright, as tests/browser does; nothing is downloaded) with every request to the network refused.
"""
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from kvlesson.teaching.syllabus import LESSONS
from tests.browser.jupyterlab import CHROMIUM_FLAGS, find_chromium

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, so a fetch fails at once
PAGE_TIMEOUT_MS = 20_000  # bounds a hang on a busy machine; a passing run stays far below it


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's folder of HTML pages."""
    out = tmp_path_factory.mktemp("site")
    offline = {name: CLOSED for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"} | offline
    run = subprocess.run([sys.executable, "scripts/build_site.py", "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"the site did not build:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert re.fullmatch(r"built .*index\.html in \d+\.\d s\n", run.stdout), run.stdout  # where, and how long
    print(run.stdout, end="")
    return out / "_build" / "html"


class Page(HTMLParser):
    """A page's text, the ids it defines, and the local addresses it points to (href and src)."""

    def __init__(self, path):
        super().__init__()
        self.text, self.code, self.ids, self.links, self.pre = [], [], set(), [], 0
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        self.pre += tag == "pre"
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            elif name in ("href", "src") and value and not re.match(r"^([a-z][a-z0-9+.-]*:|//)", value):
                self.links.append(value)

    def handle_endtag(self, tag):
        self.pre -= tag == "pre"

    def handle_data(self, data):
        self.text.append(data)
        if self.pre:
            self.code.append(data)


def solution_lines(notebook):
    """The code lines inside a notebook's solution blocks that appear nowhere else in it (in no other line of its
    sources, as part of one, nor in an output): lines its page may not show."""
    inside, solution, elsewhere = False, set(), []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for line in "".join(cell["source"]).splitlines():
            if line.strip() in (BEGIN, END):
                inside = line.strip() == BEGIN
            elif line.strip():
                solution.add(line.strip()) if inside else elsewhere.append(line)
        for output in cell.get("outputs", []):
            elsewhere.append(json.dumps(output, ensure_ascii=False))
    elsewhere = "\n".join(elsewhere)
    return {line for line in solution if line not in elsewhere and not line.startswith("#")}


def test_every_lesson_the_readme_and_the_guide_have_a_page(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    wanted = {f"notebooks/{nb.stem}.html" for nb in NOTEBOOKS} | {"README.html", "docs/instructor_guide.html"}
    assert wanted <= pages, f"missing pages: {sorted(wanted - pages)}"
    assert [nb.stem for nb in NOTEBOOKS] == list(LESSONS)  # the glob found every lesson of the series


def test_no_local_link_is_broken(site):
    """Every local href and src of every page is a file of the site, and an anchor it names exists there."""
    # _static holds the theme's template macros (*.html files that are no pages)
    pages = {path: Page(path) for path in site.rglob("*.html") if "_static" not in path.relative_to(site).parts}
    broken, checked = [], 0
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            checked += 1
            if not target.is_file():
                broken.append(f"{path.relative_to(site)}: {link}")
            elif parts.fragment and target in pages and parts.fragment not in pages[target].ids:
                broken.append(f"{path.relative_to(site)}: {link} (no such anchor)")
    assert not broken, f"{len(broken)} of {checked} local links are broken:\n" + "\n".join(broken[:40])
    # the cross-links the sources write as notebooks/..., ../docs/... and NN_topic.ipynb became links between pages
    lesson = pages[site / "notebooks" / "04_offset_mask.html"].links
    assert "07_sliding_window.html" in lesson and "05_gqa.html" in lesson
    assert "notebooks/04_offset_mask.html" in pages[site / "README.html"].links
    assert "docs/instructor_guide.html" in pages[site / "README.html"].links
    assert "../docs/instructor_guide.html" in pages[site / "notebooks" / "00_start_here.html"].links
    assert "../notebooks/00_start_here.html" in pages[site / "docs" / "instructor_guide.html"].links
    # lesson 00's sprint, a Markdown output, links 23 sections of other lessons by the ids JupyterLab gives them
    lesson_00 = pages[site / "notebooks" / "00_start_here.html"].links
    sprint = [link for link in lesson_00 if re.match(r"\d\d_\w+\.html#", link)]
    assert len(sprint) >= 23, sprint
    assert not any(link.endswith((".ipynb", ".md")) for page in pages.values() for link in page.links)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda nb: nb.stem)
def test_no_page_shows_a_solution(site, notebook):
    page = Page(site / "notebooks" / f"{notebook.stem}.html")
    code, page = "".join(page.code), "".join(page.text)
    assert BEGIN not in code and END not in code  # lesson 00's prose names the markers; no code block may hold one
    shown = [line for line in solution_lines(notebook) if line in page]
    assert not shown, f"{notebook.name}'s page shows solution code: {shown[:5]}"


def test_no_page_shows_the_install_cell(site):
    """A page runs nothing, so the first cell of every lesson, which installs kvlesson on Colab, would only puzzle its
    reader: its `remove-cell` tag leaves it out (tests/test_standalone.py keeps the cell and its tag the same)."""
    shown = [nb.stem for nb in NOTEBOOKS if "google.colab" in (site / "notebooks" / f"{nb.stem}.html").read_text()]
    assert not shown, f"pages that show the install cell: {shown}"


def test_the_site_ships_no_notebook(site):
    """Sphinx copies each source beside its page by default: that copy would hold every solution."""
    assert not [p.relative_to(site) for p in site.rglob("*.ipynb")]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """The system Chromium through Playwright, with every fetch from the network refused: a page must stand alone."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no system Chromium (Debian: apt-get install chromium)")
    home = tmp_path_factory.mktemp("chromium")
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home)}
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env)
        try:
            yield launched
        finally:
            launched.close()


def offline_page(browser, path):
    """A page of the site opened from disk in a 1400 x 1000 window, with the network closed; -> (page, what it
    tried to fetch)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    fetched = []
    page.route(re.compile(r"^https?://"), lambda route: fetched.append(route.request.url) or route.abort())
    page.goto(path.as_uri(), wait_until="load")
    return page, fetched


@pytest.mark.browser
def test_lesson_04_in_chromium(site, browser):
    """The static mask figure loads, the checker calls are on the page, no solution is, and nothing is fetched."""
    page, fetched = offline_page(browser, site / "notebooks" / "04_offset_mask.html")
    try:
        figure = page.locator("section#explore img").first  # draw_masks under the explorer: its static twin
        figure.scroll_into_view_if_needed()
        assert figure.is_visible(), "the static mask figure is not visible"
        size = figure.evaluate("img => img.complete ? [img.naturalWidth, img.naturalHeight] : [0, 0]")
        assert min(size) > 0, f"the static mask figure did not load ({figure.get_attribute('src')})"
        unloaded = page.evaluate("[...document.images].filter(i => !i.naturalWidth).map(i => i.src)")
        assert not unloaded, f"images that did not load: {unloaded}"
        text = page.inner_text("body")
    finally:
        page.close()
    assert not fetched, f"the page asked the network for {fetched}"
    assert "sliders appear here when this cell runs with a live kernel" in text  # the widget's own fallback
    for call in ("checks.check_offset_mask(offset_mask)", "checks.check_visible_counts(visible_counts)"):
        assert call in text, f"the checker call {call} is missing"
    solutions = solution_lines(ROOT / "notebooks" / "04_offset_mask.ipynb")
    assert any("BIG[S - T : S, :S]" in line for line in solutions)  # the lesson still has the exercise this reads
    shown = [line for line in solutions if line in text]
    assert not shown, f"lesson 04's page shows solution code: {shown}"


def math_pages(site):
    """The lessons' pages that hold a formula (Sphinx marks each with the class "math")."""
    return [path for path in sorted((site / "notebooks").glob("*.html")) if 'class="math' in path.read_text()]


@pytest.mark.browser
def test_every_page_typesets_its_formulas_offline_and_keeps_its_outputs_in_their_boxes(site, browser):
    """Each lesson's page, opened once with the network closed, at a laptop's width.

    Issue 32: MathJax came from its CDN, so offline every formula showed as raw TeX. Now the site ships it: each page
    with a formula typesets all of them, and no page asks the network for anything.
    Issue 32 too: 149 output cells overflowed their box sideways (a reader had to scroll each printed table). The site
    wraps them: once the formulas are typeset, no output is wider than the box it sits in."""
    pages, with_math = sorted((site / "notebooks").glob("*.html")), math_pages(site)
    assert len(with_math) >= 5, [p.name for p in with_math]  # lessons 01, 02, 05, 10 and 14 hold formulas, at least
    untypeset, wide = [], []
    for path in pages:
        page, fetched = offline_page(browser, path)
        try:
            if path in with_math:
                page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
                page.evaluate("() => MathJax.startup.promise")
                raw = page.evaluate("""() => [...document.querySelectorAll('.math')]
                    .filter(m => !m.querySelector('mjx-container') && !m.closest('mjx-container'))
                    .map(m => m.textContent.slice(0, 60))""")
                typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
                errors = page.evaluate("() => document.querySelectorAll('mjx-merror').length")
                if not typeset or raw or errors:
                    untypeset.append(f"{path.name}: {typeset} typeset, raw TeX left: {raw[:3]}, {errors} TeX errors")
            wide += [f"{path.name}: {w}" for w in page.evaluate("""() => [...document.querySelectorAll(
                '.cell_output pre, .cell_output table, .cell_output img')]
                .filter(e => e.scrollWidth > e.closest('.cell_output').clientWidth + 1)
                .map(e => e.textContent.slice(0, 60) || e.tagName)""")]
        finally:
            page.close()
        assert not fetched, f"{path.name} asked the network for {fetched}"
    assert not untypeset, "\n".join(untypeset)
    assert not wide, f"{len(wide)} outputs run out of their box:\n" + "\n".join(wide[:20])


def plain(markdown):
    """Markdown's text as a page shows it, near enough: links as their text, no emphasis or code marks."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return " ".join(re.sub(r"[*`_#>]", "", text).split())


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda nb: nb.stem)
def test_a_page_gives_away_no_more_than_a_student_copy(site, notebook):
    """Issue 32: lesson 12's page named every suspect's bug ("Suspect G was np.tile's head pairing"), priced every
    model and summed up the answers; student copies removed them, the site did not. A page is the student copy: no
    PASS a solved exercise earns, none of lesson 12's answers, no explanation tagged `answer`."""
    import nbformat

    from tests.helpers import answers_given

    key = nbformat.read(notebook, as_version=4)
    text = " ".join("".join(Page(site / "notebooks" / f"{notebook.stem}.html").text).split())
    answers = answers_given(key, notebook.name)
    answers |= {plain(c.source)[:80] for c in key.cells if "answer" in c.metadata.get("tags", [])}
    shown = sorted(a for a in answers if " ".join(a.split()) in text)
    assert not shown, f"{notebook.name}'s page shows {shown[:3]}"
