"""The README's set-up recipes do what they say: CI runs the test recipe verbatim, a learner's install holds no test
or grading tool, and the lab the reading recipe starts serves every page a lesson links to."""
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOOLS = {"pytest", "pytest-xdist", "nbval", "hypothesis", "playwright", "ruff", "nbgrader"}


def recipe(heading):
    """The commands of the first ```bash block after the paragraph starting with `heading`."""
    after = README[README.index(heading):]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def requirements(name):
    """Package names a requirements file asks for, following its -r includes."""
    names = set()
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            names |= requirements(line[3:].strip())
        elif line and not line.startswith("-"):
            names.add(re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0].lower())
    return names


def test_ci_runs_the_readmes_test_recipe_verbatim():
    commands = recipe("Run the tests")
    assert commands == ["pip install -r requirements-test.txt", "python -m pytest"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    at = [ci.index(command) for command in commands]
    assert at == sorted(at)  # in the README's order


def test_a_learner_installs_no_test_or_grading_tool():
    learner = requirements("requirements.txt")
    assert not learner & TOOLS, learner & TOOLS
    assert TOOLS <= requirements("requirements-test.txt")
    assert "nbgrader" in requirements("requirements-instructor.txt")


def test_every_pin_is_exact_where_outputs_depend_on_it():
    """The committed notebooks print these versions or numbers they compute: a range would let them drift."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    assert {"numpy", "ml_dtypes", "matplotlib", "gguf", "tokenizers"} <= set(pins)


@pytest.mark.slow
def test_the_reading_recipe_serves_the_whole_repository(tmp_path):
    """The recipe's last two lines in a copy of the repository: the workbook is made beside notebooks/, and the lab
    opens its lesson 00. `jupyter lab notebooks/00_start_here.ipynb` alone would serve notebooks/ only, and lesson 00's
    link to the instructor guide would be a 404; the README's command must serve the guide too."""
    _, make, command = recipe("Read the series")
    clone = tmp_path / "clone"
    for part in ("notebooks", "docs"):
        shutil.copytree(ROOT / part, clone / part)
    shutil.copy(ROOT / "README.md", clone)
    made = subprocess.run([sys.executable, *shlex.split(make)[1:], "--src", str(clone / "notebooks")], cwd=clone,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    port, token = _free_port(), secrets.token_hex(8)
    args = shlex.split(command)[2:] + ["--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
                                       "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PATH": "", "HOME": str(tmp_path)}
    lab = subprocess.Popen([sys.executable, "-m", "jupyterlab", *args], cwd=clone, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for path in ("docs/instructor_guide.md", "workbook/00_start_here.ipynb", "notebooks/00_start_here.ipynb",
                     "README.md"):
            assert _get(f"http://127.0.0.1:{port}/api/contents/{path}?content=0&token={token}", lab) == 200, path
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, process, timeout=60):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(url, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def lessons_named(sentence):
    """{"08", "09", ...} from "Lessons 08 to 11, 13 and 14": numbers and ranges."""
    found = set()
    for first, last in re.findall(r"(\d\d)(?: to (\d\d))?", sentence):
        found |= {f"{n:02d}" for n in range(int(first), int(last or first) + 1)}
    return found


def test_the_lessons_said_to_need_the_model_are_those_that_load_it():
    """Issue 32: the README and the guide said lessons 08 to 11; 13 and 14 load SmolLM2 too."""
    import nbformat

    loading = {path.name[:2] for path in (ROOT / "notebooks").glob("*.ipynb")
               if any("llama.load(" in c.source for c in nbformat.read(path, as_version=4).cells
                      if c.cell_type == "code")}
    assert {"08", "13"} <= loading
    guide = (ROOT / "docs" / "instructor_guide.md").read_text(encoding="utf-8")
    for text, verb in ((README, "download"), (guide, "run SmolLM2")):
        said = re.search(rf"Lessons ([\d, toand]+?) {verb}", " ".join(text.split()))
        assert said and lessons_named(said[1]) == loading, (verb, said and said[0], sorted(loading))
