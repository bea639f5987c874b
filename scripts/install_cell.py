"""Every lesson's first code cell: on Colab it installs kvlesson from a source the project names, elsewhere it does
nothing and prints nothing.

    python scripts/install_cell.py            # which lessons' first cells differ from CELL (exit status 1 if any)
    python scripts/install_cell.py --write    # rewrite them (the source only: off Colab the cell has no output)

kvlesson is not on PyPI, and a lesson must never install a name the project does not own (issue 32: the cell ran
`pip install kvlesson[lessons]`, which anyone could register). So the cell installs a wheel the learner uploaded
beside the notebook, or else the project's repository as a pip VCS address. That address is written in one place,
pyproject.toml's [project.urls] Repository; tests/test_standalone.py keeps every lesson's cell equal to CELL with it.
Until the project has a public repository it is an address under .invalid (RFC 2606), which never resolves: pip
fails, and the cell says in one line to upload the wheel.
"""
import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TAGS = ["remove-cell"]  # a page of the site runs nothing, so it leaves the cell out
CELL = '''import glob
import os
import subprocess
import sys

# Colab starts without kvlesson, which is not on PyPI: this installs a kvlesson wheel you uploaded beside the notebook,
# else the project's repository. Anywhere else the README's set-up installed it, and this cell does nothing.
if "google.colab" in sys.modules:
    wheel = max(glob.glob("kvlesson-*.whl"), key=os.path.getmtime, default=None)
    source = f"{{wheel}}[lessons]" if wheel else "kvlesson[lessons] @ git+{repository}"
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", source]).returncode:
        raise RuntimeError(f"could not install {{source}}: upload a kvlesson wheel (kvlesson-*.whl) with Colab's Files "
                           "pane, then run this cell again")'''


def repository():
    """The project's repository, as pyproject.toml names it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["urls"]["Repository"]


def cell_text():
    return CELL.format(repository=repository())


def first_code_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the lessons whose first cell differs")
    args = parser.parse_args(argv)
    import nbformat

    want, stale = cell_text(), []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        if cell.source == want and cell.metadata.get("tags") == TAGS:
            continue
        stale.append(path.name)
        if args.write:
            cell.source, cell.metadata["tags"] = want, TAGS
            nbformat.write(nb, path)
    print(f"{'rewrote' if args.write else 'differ'}: {', '.join(stale)}" if stale else "every lesson's cell is CELL")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
