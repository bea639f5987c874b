"""`python -m kvlesson.teaching.workbook`: a learner's own unsolved copies, made without nbgrader, never replaced.

Issue 32: the README opened notebooks/, the answer key, and the only unsolved copy came from a tool that failed in a
learner's install (`ModuleNotFoundError: No module named 'nbgrader'`); running a lesson rewrote the clone.
"""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from kvlesson.teaching.student import NOTEBOOKS, write_student_copies
from kvlesson.teaching.workbook import FOLDER, main, write_workbook

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"
# a Python in which nbgrader cannot be imported, whatever is installed: a learner's install has none
WITHOUT_NBGRADER = ("import runpy, sys; sys.modules['nbgrader'] = None; "
                    "runpy.run_module('{}', run_name='__main__', alter_sys=True)")


def lessons(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(EXERCISE, execution_count=1),
                                             nbformat.v4.new_code_cell("print(f(2))", execution_count=2)])
        nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
        nbformat.write(nb, folder / name)
    return folder


def test_every_lesson_in_the_workbook_is_its_student_copy(tmp_path):
    written, kept = write_workbook(NOTEBOOKS, tmp_path / "workbook")
    student = dict(write_student_copies(NOTEBOOKS, tmp_path / "student"))
    assert kept == [] and [p.name for p, _ in written] == [p.name for p in student]
    for path, blocks in written:
        assert path.read_bytes() == (tmp_path / "student" / path.name).read_bytes()
        assert blocks == student[tmp_path / "student" / path.name]
    assert sum(blocks for _, blocks in written) >= 2 * len(written) - 4  # lesson 00's two; every other lesson >= 2


def test_the_default_folder_sits_beside_the_lessons(tmp_path):
    """workbook/ beside notebooks/: a lesson's links to ../docs/ then work from the copy, and .gitignore names it."""
    src = lessons(tmp_path / "notebooks", "01_a.ipynb")
    written, _ = write_workbook(src)
    assert [p for p, _ in written] == [tmp_path / FOLDER / "01_a.ipynb"]
    assert f"/{FOLDER}/" in (ROOT / ".gitignore").read_text().splitlines()


def test_a_learners_copy_is_never_replaced_and_new_lessons_are_added(tmp_path, capsys):
    src, mine = lessons(tmp_path / "notebooks", "01_a.ipynb"), tmp_path / "mine"
    assert main(["--src", str(src), "--into", str(mine)]) == 0
    assert "01_a.ipynb: written, 1 solution block for you to write" in capsys.readouterr().out
    work = nbformat.read(mine / "01_a.ipynb", as_version=4)
    assert "raise NotImplementedError" in work.cells[0].source and work.cells[1].outputs == []
    work.cells[0].source = "def f(x):\n    return x  # my own work"
    nbformat.write(work, mine / "01_a.ipynb")
    before = (mine / "01_a.ipynb").read_bytes()
    lessons(src, "02_b.ipynb")  # a `git pull` brings a new lesson
    assert main(["--src", str(src), "--into", str(mine)]) == 0
    out = capsys.readouterr().out
    assert "02_b.ipynb: written" in out and "kept as they are (your work): 01_a.ipynb" in out
    assert (mine / "01_a.ipynb").read_bytes() == before
    assert sorted(p.name for p in mine.iterdir()) == ["01_a.ipynb", "02_b.ipynb"]


def test_refusals_write_nothing(tmp_path, capsys):
    src = lessons(tmp_path / "notebooks", "01_a.ipynb")
    assert main(["--src", str(src), "--into", str(src / "inside")]) == 1
    assert "refusing to write into" in capsys.readouterr().err
    assert main(["--src", str(tmp_path / "nowhere")]) == 1
    assert "no lessons at" in capsys.readouterr().err and not (tmp_path / FOLDER).exists()
    (tmp_path / "mine" / "01_a.ipynb").mkdir(parents=True)  # a folder where the copy would go
    assert main(["--src", str(src), "--into", str(tmp_path / "mine")]) == 1
    assert "in the way" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["01_a.ipynb"]


@pytest.mark.parametrize("module", ["kvlesson.teaching.workbook", "kvlesson.teaching.student"])
def test_no_nbgrader_needed(tmp_path, module):
    """Both tools run where nbgrader cannot be imported (before issue 32, the student tool died there with
    ModuleNotFoundError); tests/test_standalone.py runs the workbook in a real venv without it."""
    src = lessons(tmp_path / "notebooks", "01_a.ipynb")
    args = ["--src", str(src)] if module.endswith("workbook") else [str(src), str(tmp_path / FOLDER)]
    run = subprocess.run([sys.executable, "-c", WITHOUT_NBGRADER.format(module), *args], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    copy = nbformat.read(tmp_path / FOLDER / "01_a.ipynb", as_version=4)
    assert copy.cells[0].source == 'def f(x):\n    raise NotImplementedError("your turn")'


def test_the_readmes_reading_recipe_opens_lesson_00_of_the_workbook():
    """The README's set-up: install, make the workbook, open its lesson 00 (never notebooks/, the answer key)."""
    from tests.test_readme import recipe

    install, make, lab = recipe("Read the series")
    assert install == "pip install -r requirements.txt" and make == "python -m kvlesson.teaching.workbook"
    assert lab.startswith("jupyter lab --notebook-dir=. ") and lab.endswith(f" {FOLDER}/00_start_here.ipynb")
    assert NOTEBOOKS == ROOT / "notebooks" and (NOTEBOOKS / "00_start_here.ipynb").is_file()  # the default --src
