"""`python -m kvlesson.teaching.student` strips solutions, clears what depends on them, refuses broken markers."""
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from kvlesson.teaching.checks import check_softmax
from kvlesson.teaching.student import (
    ANSWER_STUB,
    BEGIN,
    END,
    STUB,
    main,
    strip_solutions,
    student_notebook,
    write_student_copies,
)
from tests import helpers

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

EXERCISE = '''import numpy as np


def softmax(s):
    """[..., S] -> [..., S]"""
    ### BEGIN SOLUTION
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
    ### END SOLUTION'''


def lesson(*cells):
    """A small executed-looking notebook: (kind, source, output text) per cell."""
    nb = nbformat.v4.new_notebook()
    for n, (kind, source, text) in enumerate(cells, 1):
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
            continue
        cell = nbformat.v4.new_code_cell(source, execution_count=n)
        if text is not None:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    return nb


def test_a_block_becomes_one_raise_at_the_marker_indentation():
    src, blocks = strip_solutions(EXERCISE)
    assert blocks == 1
    assert src.endswith('    """[..., S] -> [..., S]"""\n    raise NotImplementedError("your turn")')
    assert "np.exp" not in src and "SOLUTION" not in src


def test_the_student_function_raises_and_the_checker_says_so():
    src, _ = strip_solutions(EXERCISE)
    scope = {}
    exec(src, scope)
    with pytest.raises(NotImplementedError, match="your turn"):
        scope["softmax"](None)
    assert "still raises NotImplementedError" in repr(check_softmax(scope["softmax"]))


def test_two_blocks_and_top_level_code():
    src, blocks = strip_solutions("a = 1\n### BEGIN SOLUTION\nb = 2\n### END SOLUTION\nif a:\n"
                                  "    ### BEGIN SOLUTION\n    c = 3\n    ### END SOLUTION\n")
    assert blocks == 2
    assert src == ('a = 1\nraise NotImplementedError("your turn")\nif a:\n'
                   '    raise NotImplementedError("your turn")\n')


def test_source_without_markers_is_unchanged():
    assert strip_solutions("x = 1\n# BEGIN SOLUTION is only a comment here\n") == (
        "x = 1\n# BEGIN SOLUTION is only a comment here\n", 0)


@pytest.mark.parametrize("source, words", [
    ("### BEGIN SOLUTION\nx = 1\n", "line 1: '### BEGIN SOLUTION' is never closed"),
    ("x = 1\n### END SOLUTION\n", "line 2: '### END SOLUTION' without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "line 2: a second"),
])
def test_unbalanced_markers_are_refused(source, words):
    with pytest.raises(ValueError, match=words):
        strip_solutions(source, "01_x.ipynb, cell 3")


def test_exercise_and_checker_outputs_are_cleared_the_rest_kept():
    nb = lesson(("md", "# 1. Title", None), ("code", "x = 1\nprint(x)", "1\n"),
                ("code", EXERCISE, "defined\n"), ("code", "checks.check_softmax(softmax)", "PASS: ...\n"),
                ("code", "print(2)", "2\n"))
    out, blocks = student_notebook(nb)
    assert blocks == 1
    assert [c.get("outputs") for c in out.cells[1:]] == [nb.cells[1].outputs, [], [], nb.cells[4].outputs]
    assert out.cells[2].execution_count is None and out.cells[4].execution_count == 5
    assert "SOLUTION" in nb.cells[2].source and nb.cells[3].outputs, "the input notebook must not change"


def test_a_cell_that_reads_no_exercise_keeps_its_output():
    nb = lesson(("code", EXERCISE, None), ("code", "print(np.ones(2))", "[1. 1.]\n"))
    assert student_notebook(nb)[0].cells[1].outputs == nb.cells[1].outputs


# ---- no output that depends on an exercise survives (issue 18: lesson 12's copy kept its price sheet and
# "14 of 14 solved", lesson 11's a cell that spelled out all three answers)

def kept(*sources):
    """Which code cells of a lesson keep their outputs in the student copy: a cell per source, each printing."""
    nb = lesson(*[("code", src, f"out {n}\n") for n, src in enumerate(sources)])
    return [bool(cell.outputs) for cell in student_notebook(nb)[0].cells]


SHEET = "sheet = Sheet()"
EXERCISE_F = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"


@pytest.mark.parametrize("sources, want", [
    # a name the exercise defines, then what is computed from it, then what that feeds
    ((SHEET, EXERCISE_F, "y = f(2)", "z = [y, 1]", "print(z)", "print(3)"), [True, False, False, False, False, True]),
    # a method call or an item assignment changes the object it starts from: the sheet now holds a verdict
    ((SHEET, EXERCISE_F, "sheet.check('f', f)", "print(sheet.report())"), [True, False, False, False]),
    ((SHEET, EXERCISE_F, "table = {}", "table['f'] = f(1)", "print(table)"), [True, False, True, False, False]),
    # ... but a module is not state a cell changes: np.concatenate(f(...)) leaves np clean
    (("import numpy as np", EXERCISE_F, "a = np.concatenate([f(np.ones(2))])", "print(np.zeros(1))"),
     [True, False, False, True]),
    # a name bound afresh from clean values is clean again; a conditional rebinding is not trusted
    ((EXERCISE_F, "y = f(1)", "y = 5", "print(y)"), [False, False, True, True]),
    ((EXERCISE_F, "y, z = f(1), 2", "(y, *z), w = [5, 6], 7", "print(y, z)"), [False, False, True, True]),
    ((EXERCISE_F, "y = f(1)", "if True:\n    y = 5", "print(y)"), [False, False, True, False]),
    # a function defined later that calls the exercise, and what calls that
    ((EXERCISE_F, "def g():\n    return f(1)", "print(g())"), [False, False, False]),
    # magics: a cell magic's body and a line magic's text are read for names
    ((EXERCISE_F, "%%time\nprint(f(1))", "%timeit f(2)", "%time print(1)"), [False, False, False, True]),
    # not Python: cleared once anything depends on an exercise
    (("x = (", EXERCISE_F, "y = (", "print(1)"), [True, False, False, True]),
])
def test_every_output_that_depends_on_an_exercise_is_cleared(sources, want):
    assert kept(*sources) == want


def test_a_markdown_cell_tagged_answer_is_replaced_and_others_kept():
    nb = lesson(("md", "## 2. Price it", None), ("md", "Suspect C was the newest-first cache.", None))
    nb.cells[1].metadata["tags"] = ["answer"]
    out = student_notebook(nb)[0]
    assert out.cells[0].source == "## 2. Price it" and "newest-first" not in out.cells[1].source
    assert out.cells[1].source == ANSWER_STUB and "newest-first" in nb.cells[1].source


def test_copies_are_written_and_solutions_stay_put(tmp_path):
    src, dest = tmp_path / "notebooks", tmp_path / "student"
    src.mkdir()
    nbformat.write(lesson(("code", EXERCISE, None)), src / "01_a.ipynb")
    nbformat.write(lesson(("code", "print(1)", "1\n")), src / "02_b.ipynb")
    written = write_student_copies(src, dest)
    assert [(p.name, n) for p, n in written] == [("01_a.ipynb", 1), ("02_b.ipynb", 0)]
    assert "raise NotImplementedError" in nbformat.read(dest / "01_a.ipynb", as_version=4).cells[0].source
    assert "BEGIN SOLUTION" in nbformat.read(src / "01_a.ipynb", as_version=4).cells[0].source


def test_one_broken_notebook_means_nothing_is_written(tmp_path):
    src, dest = tmp_path / "notebooks", tmp_path / "student"
    src.mkdir()
    nbformat.write(lesson(("code", EXERCISE, None)), src / "01_a.ipynb")
    nbformat.write(lesson(("code", "x = 1", None), ("code", "### BEGIN SOLUTION\nx = 2", None)), src / "02_b.ipynb")
    with pytest.raises(ValueError, match=r"02_b.ipynb, cell 1, line 1"):
        write_student_copies(src, dest)
    assert not dest.exists()


def test_refuses_to_overwrite_the_solutions_or_read_nothing(tmp_path):
    nbformat.write(lesson(("code", EXERCISE, None)), tmp_path / "01_a.ipynb")
    with pytest.raises(ValueError, match="refusing"):
        write_student_copies(tmp_path, tmp_path / ".")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no notebooks"):
        write_student_copies(tmp_path / "empty", tmp_path / "student")
    with pytest.raises(ValueError, match="not a folder"):
        write_student_copies(tmp_path / "missing", tmp_path / "student")


def test_command_line(tmp_path, capsys):
    src = tmp_path / "notebooks"
    src.mkdir()
    nbformat.write(lesson(("code", EXERCISE, None)), src / "01_a.ipynb")
    assert main([str(src), str(tmp_path / "student")]) == 0
    assert "01_a.ipynb: 1 solution block replaced" in capsys.readouterr().out
    nbformat.write(lesson(("code", "### END SOLUTION", None)), src / "02_b.ipynb")
    assert main([str(src), str(tmp_path / "again")]) == 1
    assert "without a '### BEGIN SOLUTION'" in capsys.readouterr().err


def test_runs_as_a_module(tmp_path):
    src = tmp_path / "notebooks"
    src.mkdir()
    nbformat.write(lesson(("code", EXERCISE, None)), src / "01_a.ipynb")
    done = subprocess.run([sys.executable, "-m", "kvlesson.teaching.student", str(src), str(tmp_path / "student")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "student" / "01_a.ipynb").exists()


@pytest.mark.skipif(not any(NOTEBOOKS.glob("*.ipynb")), reason="no lesson notebooks yet")
def test_every_lesson_makes_a_student_copy_that_still_parses(tmp_path):
    """The workshop command works on the real lessons, and each stripped cell is still valid Python."""
    to_python = TransformerManager().transform_cell  # cells may hold IPython magics
    for path, _ in write_student_copies(NOTEBOOKS, tmp_path):
        for n, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code":
                markers = [line for line in cell.source.split("\n") if line.strip() in (BEGIN, END)]
                assert not markers, f"{path.name}, cell {n}"
                compile(to_python(cell.source), f"{path.name}, cell {n}", "exec")


# ---- a learner's work is never overwritten


def _one_lesson(src):
    src.mkdir(exist_ok=True)
    nbformat.write(lesson(("code", EXERCISE, None)), src / "01_a.ipynb")


def test_running_again_over_a_learners_copies_refuses_and_keeps_their_work(tmp_path, capsys):
    """Before --force existed, a second run silently replaced edited copies and exited 0."""
    src, dest = tmp_path / "notebooks", tmp_path / "student"
    _one_lesson(src)
    assert main([str(src), str(dest)]) == 0
    edited = nbformat.read(dest / "01_a.ipynb", as_version=4)
    edited.cells[0].source = "def softmax(s):\n    return 'my own work'"
    nbformat.write(edited, dest / "01_a.ipynb")
    capsys.readouterr()
    assert main([str(src), str(dest)]) == 1
    err = capsys.readouterr().err
    assert "01_a.ipynb already exist" in err and "--force" in err and "nothing was written" in err
    assert "my own work" in nbformat.read(dest / "01_a.ipynb", as_version=4).cells[0].source
    assert main([str(src), str(dest), "--force"]) == 0
    assert "my own work" not in nbformat.read(dest / "01_a.ipynb", as_version=4).cells[0].source


def test_never_writes_into_the_folder_it_reads(tmp_path):
    src = tmp_path / "notebooks"
    _one_lesson(src)
    for dest in (src, src / "student", src / "." / "deeper" / "student"):
        with pytest.raises(ValueError, match="into .*the folder of solutions it reads"):
            write_student_copies(src, dest, force=True)
    assert sorted(p.name for p in src.iterdir()) == ["01_a.ipynb"]


def test_a_file_that_is_not_a_notebook_is_named(tmp_path, capsys):
    src = tmp_path / "notebooks"
    _one_lesson(src)
    (src / "02_broken.ipynb").write_text("{ this is not json")
    assert main([str(src), str(tmp_path / "student")]) == 1
    assert "02_broken.ipynb: not a notebook nbformat can read" in capsys.readouterr().err
    assert not (tmp_path / "student").exists()


def test_an_unwritable_destination_is_a_message_not_a_traceback(tmp_path, capsys, monkeypatch):
    src = tmp_path / "notebooks"
    _one_lesson(src)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "student"))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main([str(src), str(tmp_path / "student")]) == 1
    err = capsys.readouterr().err
    assert "could not write" in err and "Permission denied" in err


def test_a_marker_inside_a_line_is_refused_not_cut():
    """nbgrader would treat this line as a marker and cut the code after it; the tool refuses it instead."""
    with pytest.raises(ValueError, match="line 2: a solution marker must stand alone"):
        strip_solutions('x = 1\nprint("### BEGIN SOLUTION")\n', "01_a.ipynb, cell 0")


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_the_stripping_is_nbgraders_own_on_every_lesson(name):
    """The replacement is written here (a learner's install has no nbgrader), and equals what nbgrader's
    ClearSolutions makes of every code cell of every lesson with the course's settings (markdown is left alone: lesson
    00's prose names the markers)."""
    from nbgrader.preprocessors import ClearSolutions

    from kvlesson.teaching.student import CLEAR_SOLUTIONS

    clear = ClearSolutions(enforce_metadata=False, **CLEAR_SOLUTIONS)
    code = [c for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells if c.cell_type == "code"]
    ours = [strip_solutions(c.source)[0] for c in code]
    theirs = [clear.preprocess_cell(nbformat.from_dict(c), {"language": "python"}, 0)[0].source for c in code]
    assert ours == theirs
    assert sum(s.count(STUB) for s in ours) == sum(c.source.count(STUB) + c.source.count(BEGIN) for c in code)


def test_the_stripping_is_nbgraders_own_on_odd_layouts():
    from nbgrader.preprocessors import ClearSolutions

    from kvlesson.teaching.student import CLEAR_SOLUTIONS

    for source in (EXERCISE, f"{BEGIN}\nx = 1\n{END}", f"x = 0\n\t{BEGIN}\n\tx = 1\n\t{END}\ny = 2\n",
                   f"if a:\n    {BEGIN}\n    b = 1\n    {END}\nelse:\n        {BEGIN}\n        b = 2\n        {END}",
                   f"{BEGIN}  \nx = 1\n  {END}\n\n"):
        cell = nbformat.v4.new_code_cell(source)
        ClearSolutions(enforce_metadata=False, **CLEAR_SOLUTIONS).preprocess_cell(cell, {"language": "python"}, 0)
        assert strip_solutions(source)[0] == cell.source, source


def test_force_over_a_folder_in_the_way_writes_nothing(tmp_path, capsys):
    """Issue 19: with --force, a folder where the second copy must go stopped the run after the first copy had
    been replaced. Now every destination is checked first."""
    src, dest = tmp_path / "notebooks", tmp_path / "student"
    _one_lesson(src)
    nbformat.write(lesson(("code", "print(2)", "2\n")), src / "02_b.ipynb")
    assert main([str(src), str(dest)]) == 0
    edited = nbformat.read(dest / "01_a.ipynb", as_version=4)
    edited.cells[0].source = "my own work"
    nbformat.write(edited, dest / "01_a.ipynb")
    (dest / "02_b.ipynb").unlink()
    (dest / "02_b.ipynb").mkdir()  # a folder in the way
    capsys.readouterr()
    assert main([str(src), str(dest), "--force"]) == 1
    assert "02_b.ipynb is in the way" in capsys.readouterr().err
    assert nbformat.read(dest / "01_a.ipynb", as_version=4).cells[0].source == "my own work"
    assert sorted(p.name for p in dest.iterdir()) == ["01_a.ipynb", "02_b.ipynb"]  # no temporary file left


def test_a_write_that_fails_midway_leaves_the_old_copies(tmp_path, monkeypatch):
    src, dest = tmp_path / "notebooks", tmp_path / "student"
    _one_lesson(src)
    nbformat.write(lesson(("code", "print(2)", "2\n")), src / "02_b.ipynb")
    write_student_copies(src, dest)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    real, calls = nbformat.write, []

    def fails_on_the_second(nb, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(path))
        return real(nb, path, *args, **kwargs)

    monkeypatch.setattr(nbformat, "write", fails_on_the_second)
    with pytest.raises(OSError):
        write_student_copies(src, dest, force=True)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before


def test_a_failed_first_write_leaves_no_new_folder(tmp_path, monkeypatch):
    src, dest = tmp_path / "notebooks", tmp_path / "fresh"
    _one_lesson(src)

    def fails(*args, **kwargs):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(nbformat, "write", fails)
    with pytest.raises(OSError):
        write_student_copies(src, dest)
    assert not dest.exists()


# ---- the copies of the real lessons give no answer away

def _shown(nb):
    """Everything a student copy shows before it is run: its prose, its code and whatever outputs it kept."""
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) if isinstance(v, list) else str(v) for v in out.get("data", {}).values()]
            parts += out.get("traceback", [])
    return "\n".join(parts)


def test_no_student_copy_gives_an_answer_away(tmp_path):
    """Issue 18: lesson 12's copy kept the reference price sheet, "14 of 14 solved" and bug names in its prose."""
    solved = re.compile(r"^(?:\d\. [A-Za-z ]+?|all checked parts)\s+[1-9]\d* of \d+", re.M)  # a score sheet with work
    for path, _ in write_student_copies(NOTEBOOKS, tmp_path):
        key, copy = nbformat.read(NOTEBOOKS / path.name, as_version=4), nbformat.read(path, as_version=4)
        shown = _shown(copy)
        answers = helpers.answers_given(key, path.name)
        leaked = sorted(a for a in answers if a in shown)
        assert not leaked, f"{path.name} shows {leaked[:3]}"
        assert not solved.search(shown), f"{path.name}: {solved.search(shown)[0]!r}"
        if path.name.startswith("12_"):  # a suspect is named in prose only by the heading over its exercise
            prose = [line for cell in copy.cells if cell.cell_type == "markdown" for line in cell.source.splitlines()
                     if not line.startswith("#")]
            named = [line for line in prose if re.search(r"\bsuspects? [A-H]\b", line, re.I)]
            assert not named, f"{path.name} names a suspect in its prose: {named[0]!r}"
