"""Markers for every test, so that a contributor can run the part they need (CONTRIBUTING.md):

    python -m pytest                                    # everything, as CI runs it
    python -m pytest -m "not model and not notebooks and not standalone"   # the package alone: a loop of seconds

  notebooks  a lesson run under strict nbval (every one of its cells is an item)
  model      needs SmolLM2, fetched once into the user cache (the `model` fixture's tests, lessons 08-11, 13, 14)
  browser    JupyterLab driven in the system's Chromium (tests/browser)
  slow       takes several seconds on its own: benchmarks in their smallest form, long hypothesis runs
  standalone the built wheel in a fresh venv, each lesson run alone from it (tests that use `standalone_python`)
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


def pytest_collection_modifyitems(config, items):
    """Mark every item, then put the longest files first: xdist hands out whole files in this order, so the lessons
    that run the real model start at once instead of leaving one process busy at the end while the other waits."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebooks)
            if _loads_the_model(item.path):
                item.add_marker(pytest.mark.model)
        elif "model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
        if "standalone_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.standalone)
        if "browser" in item.path.parts:
            item.add_marker(pytest.mark.browser)
    def weight(path):
        return 2 * (path.suffix == ".ipynb" and _loads_the_model(path)) + ("browser" in path.parts)

    items.sort(key=lambda item: -weight(item.path))  # stable: cells and tests keep their order within a file
