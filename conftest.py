"""Markers for every test, so that a contributor can run the part they need (CONTRIBUTING.md):

    python -m pytest                 # everything, as CI runs it
    python -m pytest -m quick        # the quick loop: every test that needs nothing below, in under a minute

  notebooks  a lesson under strict nbval: each lesson runs once, alone, from the built wheel in a fresh venv
             (tests/test_standalone.py), which checks the lesson and the package a learner installs at once
  model      needs SmolLM2, fetched once into the user cache (the `model` fixture's tests, the lessons that load it)
  browser    JupyterLab or the site in the system's Chromium (tests/browser)
  slow       several seconds on its own: the nbgrader course, the site build, benchmarks in their smallest form,
             statistical tests, long hypothesis runs
  standalone the built wheel in a fresh venv (tests that use `standalone_python`; needs the network for pip)
  quick      set here on every test that has none of the markers above
"""
import json
import os
from functools import cache

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    # Two test processes side by side, each with a BLAS that spins one thread per core, would fight over two cores
    # (the suite ran 3x slower). So each worker, and every kernel it starts for a notebook, uses one BLAS thread.
    # No checked output depends on it: the lessons pass strict nbval with 1 thread and with 2.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # in case numpy was loaded before this file


@cache
def _loads_the_model(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return any("llama.load(" in "".join(c["source"]) for c in cells if c["cell_type"] == "code")


SLOW_KINDS = ("notebooks", "model", "browser", "slow", "standalone")


def pytest_collection_modifyitems(config, items):
    """Mark every item, then put the longest first: xdist hands out the lessons that run the real model at once
    instead of leaving one process busy at the end while the other waits."""
    for item in items:
        lesson = _lesson(item)
        if lesson is not None:
            item.add_marker(pytest.mark.notebooks)
            if _loads_the_model(lesson):
                item.add_marker(pytest.mark.model)
        elif "model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
        if "standalone_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.standalone)
        if "browser" in item.path.parts:
            item.add_marker(pytest.mark.browser)
        if item.path.suffix == ".ipynb":  # run by path: a lesson's cells in order, in one kernel, on one worker
            item.add_marker(pytest.mark.xdist_group(item.path.name))
        if not any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.quick)

    def weight(item):
        lesson = _lesson(item)
        return 2 * (lesson is not None and _loads_the_model(lesson)) + (lesson is not None) + (
            "browser" in item.path.parts)

    items.sort(key=lambda item: -weight(item))  # stable: cells and tests keep their order within a file


def _lesson(item):
    """-> the lesson notebook an item runs: a cell of it, or tests/test_standalone.py's run of it; else None."""
    if item.path.suffix == ".ipynb":
        return item.path
    lesson = getattr(getattr(item, "callspec", None), "params", {}).get("lesson")
    if lesson is not None and "standalone_python" in getattr(item, "fixturenames", ()):
        return item.config.rootpath / "notebooks" / f"{lesson}.ipynb"
    return None
