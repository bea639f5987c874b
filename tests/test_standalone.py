"""Every lesson runs alone, from the built package: what a learner has who opens one notebook on a hosted service
(or anywhere else) after `pip install "kvlesson[lessons]"`, with no repository and no sibling notebook.

The quick tests keep the `lessons` extra, requirements.txt and every lesson's first cell in step. The slow one builds
the sdist and the wheel (`python -m build`, with the build tools requirements-test.txt pins), checks both with twine,
installs the wheel with its extra into a fresh venv beside nbval and pytest, then copies each lesson alone into an empty
folder and runs it there under nbval, as strictly as the repository's own run, with the repository nowhere on the path.
It needs the network (pip) and, for the lessons that load SmolLM2, the model cache the rest of the suite uses
($KVLESSON_CACHE_DIR or ~/.cache/kvlesson).
"""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kvlesson.teaching.syllabus import LESSONS

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# the kernel and the front end: requirements.txt pins them for a local set-up, and a hosted service brings its own
LOCAL_ONLY = {"ipykernel", "jupyterlab"}
SANITIZE = "nbval_sanitize.cfg"  # a test tool, not something a lesson reads: it goes beside the lesson
ONE_LESSON_TIMEOUT = 900  # seconds: lesson 11, the longest, takes about a minute; this only bounds a hang


def pins(name):
    """{canonical name: version} of the `name==version` lines of a requirements file in the repository."""
    text = (ROOT / name).read_text(encoding="utf-8")
    return {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def declared():
    """{canonical name: Requirement} of what the package asks for: its dependencies and its `lessons` extra, with
    the extras that one names of the package itself (kvlesson[serve]) spelled out."""
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    wanted, todo = {}, project["dependencies"] + extras["lessons"]
    while todo:
        r = Requirement(todo.pop())
        if canonicalize_name(r.name) == canonicalize_name(project["name"]):
            todo += [line for extra in r.extras for line in extras[extra]]
        else:
            wanted[canonicalize_name(r.name)] = r
    return wanted


def test_the_lessons_extra_and_requirements_txt_name_the_same_packages():
    """`pip install "kvlesson[lessons]"` and `pip install -r requirements.txt` must give a lesson the same packages:
    requirements.txt pins exactly what the package declares, plus the kernel and front end of a local set-up."""
    pinned, wanted = pins("requirements.txt"), declared()
    assert set(wanted) == set(pinned) - LOCAL_ONLY, (
        f"in pyproject.toml only: {sorted(set(wanted) - set(pinned))}; "
        f"in requirements.txt only: {sorted(set(pinned) - LOCAL_ONLY - set(wanted))}")
    outside = {name: f"{pinned[name]} outside {r.specifier}" for name, r in wanted.items()
               if pinned[name] not in r.specifier}
    assert not outside, f"requirements.txt pins releases its own package's bounds exclude: {outside}"


def first_code_cell(path):
    return next(c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code")


@pytest.fixture(scope="module")
def install_cell():
    """scripts/install_cell.py: every lesson's first code cell, with the repository pyproject.toml names."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import install_cell
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return install_cell


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_starts_with_the_same_install_cell(lesson, install_cell):
    """One exact text, so that no lesson's copy drifts (`python scripts/install_cell.py --write` restores it);
    locally it prints nothing, and the site leaves it out (its `remove-cell` tag): a page runs nothing."""
    cell = first_code_cell(ROOT / "notebooks" / f"{lesson}.ipynb")
    assert "".join(cell["source"]) == install_cell.cell_text(), (
        f"{lesson}'s first code cell is not scripts/install_cell.py's: run `python scripts/install_cell.py --write`")
    assert cell["metadata"].get("tags") == install_cell.TAGS and cell["outputs"] == []


def run_install_cell(text, folder, monkeypatch, colab=True, status=0):
    """Run the cell's text in `folder` as Colab would (a `google.colab` module loaded), with pip replaced by a
    stand-in that exits with `status`; -> the pip commands it ran."""
    ran = []
    monkeypatch.chdir(folder)
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: ran.append(command) or
                        subprocess.CompletedProcess(command, status))
    exec(compile(text, "install cell", "exec"), {})
    return ran


def test_on_colab_the_cell_installs_only_what_the_project_names(install_cell, tmp_path, monkeypatch, capsys):
    """Issue 32: it ran `pip install kvlesson[lessons]`, a name on PyPI the project does not own. Now: the repository
    pyproject.toml names, as a pip VCS address, or a wheel the learner uploaded (the newest, when several)."""
    text, repository = install_cell.cell_text(), install_cell.repository()
    assert repository.startswith("https://") and "kvlesson[lessons]\"" not in text
    (ran,) = run_install_cell(text, tmp_path, monkeypatch)
    assert ran[1:5] == ["-m", "pip", "install", "-q"] and ran[5:] == [f"kvlesson[lessons] @ git+{repository}"]
    for n, name in enumerate(["kvlesson-0.1.0-py3-none-any.whl", "kvlesson-0.2.0-py3-none-any.whl"]):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (1e9 + n, 1e9 + n))
    (ran,) = run_install_cell(text, tmp_path, monkeypatch)
    assert ran[5:] == ["kvlesson-0.2.0-py3-none-any.whl[lessons]"]
    assert run_install_cell(text, tmp_path, monkeypatch, colab=False) == [] and capsys.readouterr() == ("", "")


def test_a_failed_install_says_what_to_do_in_one_line(install_cell, tmp_path, monkeypatch):
    with pytest.raises(RuntimeError) as failed:
        run_install_cell(install_cell.cell_text(), tmp_path, monkeypatch, status=1)
    said = str(failed.value)
    assert "\n" not in said and f"could not install kvlesson[lessons] @ git+{install_cell.repository()}" in said
    assert "upload a kvlesson wheel (kvlesson-*.whl)" in said


def test_the_lessons_folder_holds_the_series():
    assert sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")) == list(LESSONS)


# ---- the slow part: the built wheel in a fresh venv, each lesson alone ----

def clean_env(venv=None):
    """This process's environment without what would lead a child to the repository or to this test run: a child
    in `venv` finds that venv's programs first."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("PYTEST_")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command, cwd, venv=None, timeout=600):
    """Run `command` (a list) in `cwd` -> what it printed; the test fails, showing what it said, if it fails."""
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=clean_env(venv), capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                    f"{done.stderr[-4000:]}", pytrace=False)
    return done.stdout


def make_venv(path, *requirements, constraints=None):
    """A fresh venv at `path` (no system site-packages) with `requirements` installed, as a learner's pip installs
    them (bytecode compiled: a venv without it once moved lesson 10's tracemalloc peak by a few kilobytes, which the
    lesson now rounds away); -> its folder."""
    run([sys.executable, "-m", "venv", path], cwd=path.parent)
    limit = ["-c", constraints] if constraints else []
    run([path / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *limit, *requirements],
        cwd=path.parent, venv=path)
    return path


def pinned(name, *packages):
    """`package==version` for each of `packages`, as the requirements file `name` pins it."""
    found = pins(name)
    return [f"{p}=={found[canonicalize_name(p)]}" for p in packages]


def nbval_options():
    """The repository's own nbval run, as flags: its --nbval options (pyproject's addopts, less xdist's) and its
    warnings filters (`error`: a warning in the test process fails it)."""
    ini = PYPROJECT["tool"]["pytest"]["ini_options"]
    return [o for o in ini["addopts"].split() if o.startswith("--nbval")] + [f"-W{f}" for f in ini["filterwarnings"]]


@pytest.fixture(scope="session")
def standalone_python(tmp_path_factory, worker_id):
    """The python of a fresh venv that holds the wheel built from this repository, its `lessons` extra, and the
    nbval and pytest that requirements-test.txt pins, every lesson package at requirements.txt's pin (the releases
    the committed outputs were made with). Built once per run: the test processes share it, the first to arrive
    building it while the other waits on a lock."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    where = shared / "standalone"
    with open(shared / "standalone.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its process dies
        if not (where / "ready").exists():
            shutil.rmtree(where, ignore_errors=True)  # what a run that failed half-way left
            build_standalone(where)
            (where / "ready").touch()
    return where / "lessons" / "bin" / "python"


def build_standalone(where):
    """Build the sdist, the wheel from it, check both, and install the wheel into where/lessons."""
    where.mkdir()
    dist = where / "dist"
    # the sdist first, then the wheel built from it: a file the sdist leaves out is missing from the wheel too. The
    # tools are this process's, at requirements-test.txt's pins; build makes its own isolated env for the backend
    run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=where)
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], cwd=where)
    with zipfile.ZipFile(wheel) as z:  # pyproject says Apache-2.0; the wheel must carry the license's text
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist()), "the wheel has no LICENSE"
    constraints = where / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins("requirements.txt").items()))
    venv = make_venv(where / "lessons", f"{wheel}[lessons]", *pinned("requirements-test.txt", "pytest", "nbval"),
                     constraints=constraints)
    where_from = "import kvlesson, sysconfig; print(kvlesson.__file__); print(sysconfig.get_path('purelib'))"
    found = run([venv / "bin" / "python", "-c", where_from], cwd=where, venv=venv).splitlines()
    assert Path(found[0]).is_relative_to(found[1]), f"kvlesson came from {found[0]}, not the venv's {found[1]}"




@pytest.mark.parametrize("lesson", LESSONS)
def test_the_lesson_runs_alone_from_the_installed_wheel(standalone_python, lesson, tmp_path):
    """The lesson, alone in an empty folder, passes strict nbval in the fresh venv: it reads no sibling notebook,
    no file of the repository, and imports nothing that `kvlesson[lessons]` does not bring."""
    shutil.copy(ROOT / "notebooks" / f"{lesson}.ipynb", tmp_path)
    shutil.copy(ROOT / SANITIZE, tmp_path)
    run([standalone_python, "-m", "pytest", *nbval_options(), "-p", "no:cacheprovider", "-q", f"{lesson}.ipynb"],
        cwd=tmp_path, venv=standalone_python.parent.parent, timeout=ONE_LESSON_TIMEOUT)


def test_the_workbook_is_made_without_nbgrader(standalone_python, tmp_path):
    """Issue 32: the learner's unsolved copies come from the learner's own install, which has no nbgrader (the
    student tool used to fail there with ModuleNotFoundError). Two lessons, copied as a clone holds them."""
    venv = standalone_python.parent.parent
    missing = run([standalone_python, "-c", "import importlib.util; print(importlib.util.find_spec('nbgrader'))"],
                  cwd=tmp_path, venv=venv)
    assert missing.strip() == "None", "the standalone venv has nbgrader: this test would prove nothing"
    (tmp_path / "notebooks").mkdir()
    for lesson in ("00_start_here", "04_offset_mask"):
        shutil.copy(ROOT / "notebooks" / f"{lesson}.ipynb", tmp_path / "notebooks")
    said = run([standalone_python, "-m", "kvlesson.teaching.workbook", "--src", "notebooks"], cwd=tmp_path, venv=venv)
    assert "04_offset_mask.ipynb: written, 2 solution blocks for you to write" in said, said
    code = "".join("".join(c["source"]) for c in json.loads((tmp_path / "workbook" / "04_offset_mask.ipynb").read_text(
        encoding="utf-8"))["cells"] if c["cell_type"] == "code")
    assert "### BEGIN SOLUTION" not in code and code.count('raise NotImplementedError("your turn")') == 2
