"""ruff keeps the package, the tests and the notebooks tidy; a lint error fails the suite."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    result = subprocess.run([ruff, "check", "kvlesson", "tests", "notebooks", "scripts", "conftest.py"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_saved_widget_reads_as_its_python_repr():
    """A widget saved with the notebook shows its text form until a kernel runs it; that text must say what will
    appear there, never `VBox(children=(HBox(...`."""
    import json

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for n, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            for out in cell.get("outputs", []):
                text = "".join(out.get("data", {}).get("text/plain", ""))
                assert "children=(" not in text, f"{path.name}, cell {n}: {text[:60]}"


def test_every_lesson_is_committed_executed_top_to_bottom_and_clean():
    """nbval skips a cell that was never executed, so a lesson saved half-run would pass untested. Each code cell
    ran once, in order, with no error, nothing on stderr (a warning), and no path of the machine that ran it."""
    import json
    import re

    local = re.compile(r"(/home/|/root/|/Users/|/tmp/|C:\\\\Users)")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1)), \
            f"{path.name}: restart the kernel and run every cell once (CONTRIBUTING.md)"
        for n, cell in enumerate(code):
            for out in cell.get("outputs", []):
                assert out["output_type"] != "error", f"{path.name}, code cell {n}: an error output"
                assert out.get("name") != "stderr", f"{path.name}, code cell {n}: stderr: {''.join(out['text'])[:80]}"
                assert not local.search(json.dumps(out)), f"{path.name}, code cell {n}: a local path in its output"
