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
    """Mark every item, then order them for two processes that take the next test as they finish one. The longest
    lesson goes first: the process that takes it builds the standalone venv (tests/test_standalone.py) on the way.
    The other process meanwhile takes the slow tests that need no venv, then the remaining lessons, longest first, then
    the quick tests, which fill the end evenly. (Lessons first, both processes waited for one venv.)"""
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
        if not any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.quick)

    seconds = _lesson_seconds(config.rootpath)
    longest = max(seconds, key=seconds.get, default=None)

    def order(item):
        lesson = _lesson(item)
        if lesson is not None:
            return (0, 0) if lesson.stem == longest else (2, -seconds.get(lesson.stem, 0))
        if item.get_closest_marker("standalone"):
            return (2, 0)
        return (1, 0) if item.get_closest_marker("quick") is None else (3, 0)

    items.sort(key=order)  # stable: cells and tests keep their order within a file


def _lesson_seconds(root):
    """{lesson: seconds its committed run took}, from the package's map of the lessons."""
    path = root / "kvlesson" / "teaching" / "syllabus.json"
    return {name: entry["seconds"] for name, entry in json.loads(path.read_text(encoding="utf-8")).items()}


def _lesson(item):
    """-> the lesson notebook an item runs: a cell of it, or tests/test_standalone.py's run of it; else None."""
    if item.path.suffix == ".ipynb":
        return item.path
    lesson = getattr(getattr(item, "callspec", None), "params", {}).get("lesson")
    if lesson is not None and "standalone_python" in getattr(item, "fixturenames", ()):
        return item.config.rootpath / "notebooks" / f"{lesson}.ipynb"
    return None


# tests whose costly fixtures are made once per process: kept on one process, they are made once per run
ONE_PROCESS = ("tests/browser/",  # JupyterLab and Chromium (package-scoped fixtures)
               "tests/test_site.py")  # the built site and Chromium (module-scoped)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (-p no:xdist) it is never called
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject.toml): tests handed out one by one as the processes finish them, except the
    cells of a lesson given by path, which must run in order in one kernel, and the tests of ONE_PROCESS. xdist would
    group by an xdist_group mark, but it does so by renaming the item, which pytest 9 no longer lets it do: this
    scheduler groups by path instead."""
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep pytest_collection_modifyitems's order, not the largest group first

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            if path.endswith(".ipynb"):
                return path
            return next((group for group in ONE_PROCESS if path.startswith(group)), nodeid)

    return Grouped(config, log)
