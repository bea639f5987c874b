"""Make student copies of the lessons: every solution block becomes `raise NotImplementedError("your turn")`.

    python -m kvlesson.teaching.student notebooks/ student/            # refuses to replace copies already there
    python -m kvlesson.teaching.student notebooks/ student/ --force    # replaces them (a learner's edits are lost)

A solution block is the lines between `### BEGIN SOLUTION` and `### END SOLUTION` in a code cell, the
convention of nbgrader, the classroom standard; nbgrader's own ClearSolutions preprocessor replaces each
block with the stub, indented like its BEGIN line. Around it, this tool adds what a classroom needs:
  - markers are checked first, and a broken one is reported with its file, cell and line;
  - the outputs of each exercise cell, and of the checker cell right after it, are cleared, so a student copy
    never shows a PASS the student has not earned;
  - every notebook is converted before any is written, so one broken marker anywhere writes nothing;
  - it never writes into the folder it reads, and never replaces an existing copy unless told to (--force):
    a copy in the destination may hold a learner's work.
"""
import argparse
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("your turn")'


def strip_solutions(source, where="cell"):
    """Source text -> (student source, number of solution blocks). ValueError on unbalanced markers."""
    blocks = check_markers(source, where)
    if not blocks:
        return source, 0
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    _clear_solutions().preprocess_cell(cell, {"language": "python"}, 0)
    return cell.source, blocks


def check_markers(source, where="cell"):
    """Count the solution blocks in `source`; ValueError naming `where` and the line of any broken marker.

    A marker must stand alone on its line. nbgrader treats any line that merely contains one as a marker, so a
    line such as `print("### BEGIN SOLUTION")` is refused here rather than silently cut.
    """
    blocks, start = 0, None
    for n, line in enumerate(source.split("\n"), 1):
        marker = line.strip()
        if marker == BEGIN:
            if start is not None:
                raise ValueError(f"{where}, line {n}: a second {BEGIN!r} before the {END!r} of line {start}'s block")
            start = n
        elif marker == END:
            if start is None:
                raise ValueError(f"{where}, line {n}: {END!r} without a {BEGIN!r} before it")
            start, blocks = None, blocks + 1
        elif BEGIN in line or END in line:
            raise ValueError(f"{where}, line {n}: a solution marker must stand alone on its line; got {line.strip()!r}")
    if start is not None:
        raise ValueError(f"{where}, line {start}: {BEGIN!r} is never closed by {END!r}")
    return blocks


def student_notebook(nb, name="notebook"):
    """A notebook -> (its student copy, number of solution blocks); the input is left untouched."""
    import nbformat

    nb = nbformat.from_dict(nb)  # a deep copy
    blocks, clear_next = 0, False
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source, found = strip_solutions(cell.source, f"{name}, cell {i}")
        if found or (clear_next and "check" in cell.source):
            cell.source = source
            cell.outputs, cell.execution_count = [], None
        blocks += found
        clear_next = bool(found)
    return nb, blocks


def write_student_copies(src, dest, force=False):
    """Every *.ipynb in src -> dest, solutions stripped. Returns [(path written, solution blocks)].

    ValueError, before anything is written, when src is not a folder of notebooks, when dest is src or lies
    inside it, when a notebook cannot be read or has a broken marker, or when a copy exists in dest and not
    `force`. OSError while writing is the caller's to report.
    """
    import nbformat

    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise ValueError(f"{src} is not a folder of notebooks")
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise ValueError(f"refusing to write student copies into {src}, the folder of solutions it reads; "
                         "pick a folder outside it, e.g. student/")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} exists and is not a folder")
    copies = []
    for path in sorted(src.glob("*.ipynb")):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception as e:  # nbformat raises JSON, validation and Unicode errors of several kinds
            raise ValueError(f"{path}: not a notebook nbformat can read ({type(e).__name__}: {e})") from None
        copies.append((dest / path.name, *student_notebook(nb, path.name)))
    if not copies:
        raise ValueError(f"no notebooks (*.ipynb) in {src}")
    there = [str(path) for path, _, _ in copies if path.exists()]
    if there and not force:
        more = f" and {len(there) - 3} more" if len(there) > 3 else ""
        raise ValueError(f"{', '.join(there[:3])}{more} already exist and may hold a learner's work; "
                         "nothing was written. Pick another folder, or pass --force to replace them")
    dest.mkdir(parents=True, exist_ok=True)
    for path, nb, _ in copies:
        tmp = path.with_name(f".{path.name}.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(path)  # a crash mid-write never leaves half a notebook
    return [(path, blocks) for path, _, blocks in copies]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.teaching.student", description=__doc__.split("\n")[0])
    parser.add_argument("src", help="folder of lesson notebooks, e.g. notebooks/")
    parser.add_argument("dest", help="folder for the student copies, e.g. student/")
    parser.add_argument("--force", action="store_true", help="replace copies already in dest (their edits are lost)")
    args = parser.parse_args(argv)
    try:
        written = write_student_copies(args.src, args.dest, force=args.force)
    except ValueError as e:
        print(f"kvlesson.teaching.student: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"kvlesson.teaching.student: could not write {e.filename or args.dest}: {e.strerror}", file=sys.stderr)
        return 1
    for path, blocks in written:
        print(f"{path}: {blocks} solution block{'s' if blocks != 1 else ''} replaced")
    return 0


def _clear_solutions():
    from nbgrader.preprocessors import ClearSolutions

    # enforce_metadata=False: the lessons mark solutions with the comment lines only, not nbgrader cell metadata
    return ClearSolutions(enforce_metadata=False, code_stub={"python": STUB}, begin_solution_delimeter=BEGIN,
                          end_solution_delimeter=END)


if __name__ == "__main__":
    sys.exit(main())
