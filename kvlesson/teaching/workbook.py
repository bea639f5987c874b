"""Your own copies of the lessons to work in: every solution replaced by `raise NotImplementedError("your turn")`.

    python -m kvlesson.teaching.workbook                  # notebooks/ -> workbook/ beside it, the lessons you lack
    python -m kvlesson.teaching.workbook --into mine/     # another folder

The lessons in notebooks/ are the solved reference. Running one there would rewrite it (JupyterLab saves as you go)
and show every answer before you try; the next `git pull` of an updated lesson would then refuse. So you work in
copies: the student copies an instructor hands out (kvlesson.teaching.student makes both, with no nbgrader), in a
folder git ignores. A copy the folder lacks is written; a copy already there is your work and is never replaced.
Run it again after a `git pull` to add the lessons that are new; to start a lesson afresh, rename your copy first.
"""
import argparse
import sys
from pathlib import Path

from kvlesson.teaching.student import (
    NOTEBOOKS,
    read_lessons,
    refuse_to_write_into,
    refused_or_written,
    student_notebook,
    write_notebooks,
)

FOLDER = "workbook"  # beside notebooks/, so that a lesson's links to ../docs/ work from a copy as from the original


def write_workbook(src=NOTEBOOKS, dest=None):
    """Copy every lesson of `src` that `dest` (default: workbook/ beside src) lacks, solutions stripped.

    Returns ([(path written, solution blocks)], [path kept]): nothing already in dest is ever replaced. ValueError,
    before anything is written, as the student tool refuses (src no folder of notebooks, dest inside src, a broken
    marker), and for something other than a file where a copy would go.
    """
    src = Path(src)
    dest = src.parent / FOLDER if dest is None else Path(dest)
    if not src.is_dir():
        raise ValueError(f"no lessons at {src}: run this in a clone of the repository, or pass --src with the folder "
                         "of solved lessons")
    refuse_to_write_into(src, dest)
    lessons = read_lessons(src)
    kept = [dest / path.name for path, _ in lessons if (dest / path.name).is_file()]
    copies = [(dest / path.name, *student_notebook(nb, path.name)) for path, nb in lessons
              if dest / path.name not in kept]
    write_notebooks([(path, nb) for path, nb, _ in copies])  # refuses a folder where a copy would go
    return [(path, blocks) for path, _, blocks in copies], kept


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.teaching.workbook", description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(NOTEBOOKS), help="the solved lessons (default: %(default)s)")
    parser.add_argument("--into", help=f"folder for your copies (default: {FOLDER}/ beside the lessons)")
    args = parser.parse_args(argv)
    dest = Path(args.into) if args.into else Path(args.src).parent / FOLDER
    done = refused_or_written("kvlesson.teaching.workbook", dest, lambda: write_workbook(args.src, dest))
    if done is None:
        return 1
    written, kept = done
    for path, blocks in written:
        print(f"{path}: written, {blocks} solution block{'s' if blocks != 1 else ''} for you to write")
    if kept:
        print(f"kept as they are (your work): {', '.join(path.name for path in kept)}")
    print(f"Work in {dest}; {args.src} keeps the solved lessons, to compare with once a checker says PASS.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
