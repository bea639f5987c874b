"""Make student copies of the lessons: every solution block becomes `raise NotImplementedError`.

    python -m kvlesson.student notebooks/ student/

A solution block is the lines between `### BEGIN SOLUTION` and `### END SOLUTION` in a code cell
(the nbgrader convention). The markers and everything between them become one line,
`raise NotImplementedError("your turn")`, indented like the BEGIN marker. The outputs of an
exercise cell, and of the checker cell right after it, are cleared so a student copy never shows a
PASS the student has not earned. Every notebook is converted before any is written: one unbalanced
marker anywhere and nothing is written.
"""
import argparse
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("your turn")'


def strip_solutions(source, where="cell"):
    """Source text -> (student source, number of solution blocks). ValueError on unbalanced markers."""
    out, blocks, start = [], 0, None
    lines = source.split("\n")
    for n, line in enumerate(lines, 1):
        marker = line.strip()
        if marker == BEGIN:
            if start is not None:
                raise ValueError(f"{where}, line {n}: a second {BEGIN!r} before the {END!r} of line {start}'s block")
            start = n
            out.append(line[: len(line) - len(line.lstrip())] + STUB)
        elif marker == END:
            if start is None:
                raise ValueError(f"{where}, line {n}: {END!r} without a {BEGIN!r} before it")
            start, blocks = None, blocks + 1
        elif start is None:
            out.append(line)
    if start is not None:
        raise ValueError(f"{where}, line {start}: {BEGIN!r} is never closed by {END!r}")
    return "\n".join(out), blocks


def student_notebook(nb, name="notebook"):
    """A notebook -> (its student copy, number of solution blocks); the input is left untouched."""
    import nbformat  # here, not at the top: strip_solutions alone should not pay for importing it

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


def write_student_copies(src, dest):
    """Every *.ipynb in src -> dest, solutions stripped. Returns [(path written, solution blocks)]."""
    import nbformat

    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise ValueError(f"{src} is not a folder of notebooks")
    if dest.resolve() == src.resolve():
        raise ValueError(f"refusing to write student copies over the solutions in {src}; pick another folder")
    copies = []
    for path in sorted(src.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        copies.append((dest / path.name, *student_notebook(nb, path.name)))
    if not copies:
        raise ValueError(f"no notebooks (*.ipynb) in {src}")
    dest.mkdir(parents=True, exist_ok=True)  # only now: nothing is written if any notebook was refused
    for path, nb, _ in copies:
        nbformat.write(nb, path)
    return [(path, blocks) for path, _, blocks in copies]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.student", description=__doc__.split("\n")[0])
    parser.add_argument("src", help="folder of lesson notebooks, e.g. notebooks/")
    parser.add_argument("dest", help="folder for the student copies, e.g. student/")
    args = parser.parse_args(argv)
    try:
        written = write_student_copies(args.src, args.dest)
    except ValueError as e:
        print(f"kvlesson.student: {e}", file=sys.stderr)
        return 1
    for path, blocks in written:
        print(f"{path}: {blocks} solution block{'s' if blocks != 1 else ''} replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
