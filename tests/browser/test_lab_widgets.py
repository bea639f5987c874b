"""The widgets of lessons 04 and 05, rendered by JupyterLab in Chromium and moved the way a learner moves them.

Each lesson is opened as a copy without outputs and run with Run > Run All Cells (see conftest.py). A test waits
for its lesson's last cell, finds the widget by the call in its cell (not by cell index: the lessons keep
changing), moves one control, and checks that what the widget shows changed with it. A callback that ignores
its control leaves the picture or the printout as it was, and the test fails.
"""
import hashlib
import re
import time

import pytest

pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")
from playwright.sync_api import expect  # noqa: E402

from tests.browser.jupyterlab import finish_run_all, kernel_idle  # noqa: E402

CHANGE_TIMEOUT_S = 20  # one redraw by the kernel; generous for a busy 2-core machine, and only reached on failure


@pytest.mark.parametrize("page", ["04_offset_mask.ipynb"], indirect=True)
def test_mask_explorer_redraws_when_T_and_S_move(page):
    finish_run_all(page)
    explorer = widget_under_cell_calling(page, "mask_explorer")
    image = explorer.locator(".widget-output img")
    expect(image, "the explorer's heatmap").to_have_count(1)
    for name, key in (("T", "ArrowRight"), ("S", "ArrowLeft")):
        slider = control(explorer, "slider", re.compile(rf"^{name}\b"))
        readout, handle = slider.locator(".widget-readout"), slider.locator(".noUi-handle")
        value, picture = readout.inner_text(), image.get_attribute("src")
        assert picture.startswith("data:image/png;base64,"), f"the heatmap is not a PNG: {picture[:40]!r}"
        handle.focus()
        handle.press(key)
        expect(readout, f"the {name} slider after {key}").not_to_have_text(value)
        moved = f"moving {name} from {value} to {readout.inner_text()}"
        wait_for(lambda: image.get_attribute("src"), lambda src, old=picture: src != old, f"the heatmap after {moved}",
                 describe_png)
        kernel_idle(page)


@pytest.mark.parametrize("page", ["05_gqa.ipynb"], indirect=True)
def test_calculator_reprices_when_the_model_changes(page):
    finish_run_all(page)
    calculator = widget_under_cell_calling(page, "calculator")
    printout = calculator.locator(".widget-output")
    select = control(calculator, "dropdown", re.compile("^model$")).locator("select")
    models = [plain(label) for label in select.locator("option").all_inner_texts()]
    current = models[select.evaluate("s => s.selectedIndex")]
    expect(printout, f"the price printed for the preselected {current!r}").to_contain_text(current)
    before = printout.inner_text()
    other = next(m for m in models if m not in before)  # so its name can only appear by a reprint
    select.select_option(index=models.index(other))
    wait_for(printout.inner_text, lambda text: other in text, f"the price printed after choosing {other!r}")


def widget_under_cell_calling(page, call):
    """The rendered widget under the first code cell whose source calls `call`."""
    source = re.compile(rf"(^|[^\w.]){re.escape(call)}\(")  # on one line of the cell; not a method, not a longer name
    cells = page.locator(".jp-CodeCell").filter(has=page.locator(".cm-line", has_text=source))
    expect(cells.first, f"a code cell calling {call}()").to_be_attached()
    widget = cells.locator(".jp-OutputArea-output .jupyter-widgets").first
    expect(widget, f"the widget {call}() returns, rendered by ipywidgets under its cell").to_be_visible()
    widget.scroll_into_view_if_needed()  # as a learner would; a failure's screenshot then shows it
    return widget


def control(widget, kind, description):
    """The one control of class widget-`kind` whose label matches `description`, e.g. the slider labelled T."""
    found = widget.locator(f".widget-{kind}").filter(has=widget.page.locator(".widget-label", has_text=description))
    expect(found, f"one {kind} labelled {description.pattern!r}").to_have_count(1)
    return found


def wait_for(read, done, what, describe=repr):
    """Polls `read()` until `done` says yes; fails naming `what` and what it still shows if that never happens."""
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    while not done(now := read()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still {describe(now)} after {CHANGE_TIMEOUT_S} s; "
                        "the widget's callback did not redraw with the new value")
        time.sleep(0.1)
    return now


def describe_png(src):
    """A data URL in a few words: its size and a digest, never the base64 itself."""
    return f"the same image ({len(src):,} characters, sha1 {hashlib.sha1(src.encode()).hexdigest()[:12]})"


def plain(label):
    """ipywidgets writes a dropdown's spaces as no-break spaces; the printout has plain ones."""
    return label.replace("\xa0", " ")
