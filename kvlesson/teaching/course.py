"""Make an nbgrader course of the lessons: one assignment per lesson, graded by the lessons' own checkers.

    python -m kvlesson.teaching.course course/              # every lesson that has an exercise
    python -m kvlesson.teaching.course course/ 03 04        # lessons by number or name
    python -m kvlesson.teaching.course course/ --points 2   # points per exercise (1 unless told)

It writes course/nbgrader_config.py and course/source/<lesson>/<lesson>.ipynb, the layout nbgrader reads, and
never touches notebooks/. In each source notebook:
  - a code cell holding `### BEGIN SOLUTION` blocks (markers checked as the student tool checks them) becomes an
    nbgrader solution cell; generate_assignment replaces each block with `raise NotImplementedError("your turn")`;
  - the checker cell right after it becomes a locked test cell worth `points`, its last expression (the verdict
    `v`) rewritten as `print(v.require())`, which prints a PASS and raises AssertionError with the checker's message
    and hint for a NOT YET; autograde counts that as a failed test, and the feedback shows the hint;
  - a markdown cell tagged `answer` becomes the student tool's one line saying where to read it.
Every other cell is left as the lesson has it: the lessons read an exercise through `checks.yours_or_ours`, so an
unsolved exercise fails its own test cell and nothing else.

Use it for a class whose work you collect and grade; for copies to hand out with no grading (and no nbgrader on
anyone's machine but yours), use `python -m kvlesson.teaching.student` (docs/instructor_guide.md says when).
"""
import argparse
import ast
import math
import sys
from pathlib import Path

from kvlesson.teaching.student import (
    ANSWER_STUB,
    ANSWER_TAG,
    CLEAR_SOLUTIONS,
    NOTEBOOKS,
    check_markers,
    read_lessons,
    refuse_to_write_into,
    refused_or_written,
    write_notebooks,
)

POINTS = 1  # per exercise, unless told otherwise
# nbgrader's limit on one cell's run time during autograde; its own default (30 s) leaves no margin for the float64
# measurements of lessons 10 and 11 on a slow or busy machine. 600 s is what the guide's nbconvert command gives.
CELL_TIMEOUT = 600
CONFIG = '''\
# nbgrader's settings for the kvlesson course, written by `python -m kvlesson.teaching.course`.
# Run every nbgrader command from this folder (docs/instructor_guide.md walks through the whole flow).
c = get_config()  # noqa: F821  (nbgrader defines it)
c.CourseDirectory.course_id = "kvlesson"
# how the lessons mark a solution, and what a student copy holds instead (the same as the student tool's)
{clear}
c.Execute.timeout = {timeout}  # seconds per cell during autograde
# The exchange, where release_assignment, fetch_assignment, submit and collect meet: nbgrader's default,
# /usr/local/share/nbgrader/exchange, made once by an administrator and writable by every account. Another folder
# goes here AND into every student's ~/.jupyter/nbgrader_config.py: a student's nbgrader never reads this file.
# c.Exchange.root = "/srv/nbgrader/exchange"
'''


def course_notebook(nb, name="notebook", points=POINTS):
    """A lesson -> (its nbgrader source notebook, number of exercises); the lesson is left untouched.

    ValueError naming the cell when a marker is broken, or when an exercise is not followed by a code cell whose
    last line is a checker's verdict.
    """
    import nbformat

    if not isinstance(points, (int, float)) or isinstance(points, bool) or not 0 < points < math.inf:
        raise ValueError(f"points must be a positive number; got {points!r}")
    nb = nbformat.from_dict(nb)  # a deep copy
    exercises = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and ANSWER_TAG in cell.get("metadata", {}).get("tags", []):
            cell.source = ANSWER_STUB
        if cell.cell_type != "code" or not check_markers(cell.source, f"{name}, cell {i}"):
            continue
        exercises += 1
        test = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        where = f"{name}, cell {i + 1}"
        if test is None or test.cell_type != "code" or check_markers(test.source, where):
            raise ValueError(f"{name}, cell {i}: an exercise must be followed by the code cell that checks it")
        test.source = required(test.source, where)
        cell.metadata["nbgrader"] = _cell(f"exercise{exercises}", solution=True)
        test.metadata["nbgrader"] = _cell(f"exercise{exercises}_test", grade=True, locked=True, points=points)
    return nb, exercises


def required(source, where="cell"):
    """A checker cell's source with its last expression, the verdict `v`, made `print(v.require())`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{where}: a checker cell must be plain Python ({e.msg}, line {e.lineno})") from None
    last = tree.body[-1] if tree.body else None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not isinstance(last, ast.Expr) or not any("check" in ast.unparse(c.func) for c in calls):
        raise ValueError(f"{where}: a checker cell must call a checker and end with its verdict, as in "
                         f"`v = checks.check_x(f)` then `v`; got {source!r}")
    lines = source.split("\n")
    start = sum(len(line) + 1 for line in lines[:last.lineno - 1]) + _chars(lines[last.lineno - 1], last.col_offset)
    end = sum(len(line) + 1 for line in lines[:last.end_lineno - 1]) + _chars(lines[last.end_lineno - 1],
                                                                             last.end_col_offset)
    verdict = source[start:end]
    if not isinstance(last.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        verdict = f"({verdict})"
    # printed, not left as the cell's value: nbgrader reads a test cell's value as partial credit (a number) or, for
    # anything else, as full credit with a warning that later versions may call it an error
    return f"{source[:start]}print({verdict}.require()){source[end:]}"


def _chars(line, offset):
    """ast's column offsets count UTF-8 bytes; a string index counts characters."""
    return len(line.encode("utf-8")[:offset].decode("utf-8"))


def _cell(grade_id, solution=False, grade=False, locked=False, points=None):
    meta = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": locked, "task": False,
            "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return meta


def config_text():
    clear = "\n".join(f"c.ClearSolutions.{key} = {value!r}" for key, value in CLEAR_SOLUTIONS.items())
    return CONFIG.format(clear=clear, timeout=CELL_TIMEOUT)


def write_course(dest, lessons=(), src=NOTEBOOKS, points=POINTS, force=False):
    """Write the nbgrader course of `lessons` (numbers such as "03" or names such as "03_kv_cache"; every lesson
    with an exercise when none is given) into dest. Returns [(source notebook written, exercises)].

    ValueError, before anything is written, for a lesson that does not exist or has no exercise, for a broken
    lesson, when dest lies inside src, or when a file exists in dest and not `force`.
    """
    src, dest = Path(src), Path(dest)
    refuse_to_write_into(src, dest)
    found = {path.stem: nb for path, nb in read_lessons(src)}
    if lessons:
        names = [_lesson(wanted, found) for wanted in lessons]
    else:
        names = [stem for stem, nb in found.items() if any(
            c.cell_type == "code" and check_markers(c.source, f"{stem}.ipynb") for c in nb.cells)]
    made = []
    for stem in dict.fromkeys(names):
        nb, exercises = course_notebook(found[stem], f"{stem}.ipynb", points)
        if not exercises:
            raise ValueError(f"{stem} has no exercise to grade")
        made.append((dest / "source" / stem / f"{stem}.ipynb", nb, exercises))
    # the config with the notebooks, all or none: issue 33, a folder named nbgrader_config.py stopped a --force run
    # after it had replaced the instructor's source notebooks
    write_notebooks([(path, nb) for path, nb, _ in made] + [(dest / "nbgrader_config.py", config_text())], force)
    return [(path, exercises) for path, _, exercises in made]


def _lesson(wanted, found):
    matches = [stem for stem in found if stem == wanted or stem.split("_")[0] == wanted]
    if len(matches) != 1:
        raise ValueError(f"no lesson {wanted!r}; the lessons are {', '.join(found)}")
    return matches[0]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.teaching.course", description=__doc__.split("\n")[0])
    parser.add_argument("dest", help="folder for the course, e.g. course/")
    parser.add_argument("lessons", nargs="*", help="lessons by number or name (default: every one with an exercise)")
    parser.add_argument("--src", default=str(NOTEBOOKS), help="folder of lesson notebooks (default: %(default)s)")
    parser.add_argument("--points", type=float, default=POINTS, help="points per exercise (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="replace a course's files already in dest")
    args = parser.parse_args(argv)
    points = int(args.points) if float(args.points).is_integer() else args.points
    written = refused_or_written("kvlesson.teaching.course", args.dest,
                                 lambda: write_course(args.dest, args.lessons, args.src, points, args.force))
    if written is None:
        return 1
    for path, exercises in written:
        print(f"{path}: {exercises} exercise{'s' if exercises != 1 else ''}, {exercises * points:g} points")
    print(f"{Path(args.dest) / 'nbgrader_config.py'}: run nbgrader from {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
