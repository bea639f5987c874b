"""Build the site: every executed lesson, the README and the instructor guide as HTML, offline and without running
a single cell (the configuration is _config.yml and _toc.yml at the repository root).

    python scripts/build_site.py                 # into _build/ (git-ignored); prints where and how long it took
    python scripts/build_site.py --out DIR       # into DIR/_build/html

Any Sphinx warning fails the build: a link to a page that is not in the book is one.
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out=ROOT, quiet=False):
    """Build the book under `out` (a fresh build, nothing reused); -> the folder of HTML pages.
    RuntimeError with the builder's own report if it fails."""
    command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",  # no `python -m` entry point
               "build", str(ROOT), "--path-output", str(out), "--all", "--warningiserror", "--keep-going"]
    run = subprocess.run(command, cwd=ROOT, capture_output=quiet, text=True)
    if run.returncode:
        said = f":\n{run.stdout[-3000:]}{run.stderr[-3000:]}" if quiet else " (its report is above)"
        raise RuntimeError(f"the site did not build; jupyter-book exited with status {run.returncode}{said}")
    return Path(out) / "_build" / "html"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="build under DIR/_build (default: the repository)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        html = build(args.out.resolve(), quiet=True)
    except RuntimeError as e:
        sys.exit(f"build_site: {e}")
    print(f"built {html / 'index.html'} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
