"""Run every lesson that holds a widget many times with `jupyter nbconvert --execute`, and lesson 04 through nbgrader's
autograde, each run in a process of its own with a time limit; print how many finished, hung or failed.

    python scripts/widget_runs.py                             # 30 runs of each widget lesson, 10 autogrades of 04
    python scripts/widget_runs.py --runs 3 --autogrades 1     # a quick look

Issue 32: lesson 04's slider cell hung `nbconvert --execute` in 12 of 27 runs, and autograde in 2 of 7 (the mechanism
is in kvlesson/teaching/widgets/explorer.py). Runs are consecutive, as a script or a grader makes them; a run that
outlives --limit seconds is counted as hung and killed with its kernel. Needs requirements-instructor.txt (nbgrader).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WIDGET = "application/vnd.jupyter.widget-view+json"
AUTOGRADED = "04_offset_mask"


def widget_lessons(folder=NOTEBOOKS):
    """The lessons whose committed outputs hold a widget, in order."""
    def has_widget(path):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return any(WIDGET in out.get("data", {}) for c in cells for out in c.get("outputs", []))
    return [path for path in sorted(folder.glob("*.ipynb")) if has_widget(path)]


def timed(command, cwd, limit):
    """Run `command` -> ("finished" | "hung" | "failed", seconds). A hung run is killed with everything it started
    (its kernel too): it runs in a session of its own."""
    start = time.perf_counter()
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as run:
        try:
            _, err = run.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            return "hung", time.perf_counter() - start
    if run.returncode:
        print(f"  failed: {' '.join(map(str, command))}\n{err[-2000:]}", file=sys.stderr)
    return ("failed" if run.returncode else "finished"), time.perf_counter() - start


def nbconvert_runs(lesson, runs, limit, where):
    command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
               "--ExecutePreprocessor.kernel_name=python3", "--output-dir", str(where), str(lesson)]
    return [timed(command, where, limit) for _ in range(runs)]


def autograde_runs(runs, limit, where):
    """A course of lesson 04 (kvlesson.teaching.course), generated once; then the solved lesson submitted and
    autograded `runs` times, one student each."""
    import nbformat

    from kvlesson.teaching.course import write_course

    root = where / "course"
    write_course(root, [AUTOGRADED])
    nbgrader = [sys.executable, "-m", "nbgrader"]
    status, _ = timed([*nbgrader, "generate_assignment", AUTOGRADED], root, limit)
    if status != "finished":
        raise SystemExit(f"nbgrader generate_assignment {status}")
    solved = nbformat.read(root / "source" / AUTOGRADED / f"{AUTOGRADED}.ipynb", as_version=4)
    results = []
    for n in range(runs):
        student = f"run{n:02d}"
        (root / "submitted" / student / AUTOGRADED).mkdir(parents=True)
        nbformat.write(solved, root / "submitted" / student / AUTOGRADED / f"{AUTOGRADED}.ipynb")
        results.append(timed([*nbgrader, "autograde", AUTOGRADED, "--student", student], root, limit))
    return results


def row(what, results):
    seconds = [s for status, s in results if status == "finished"]
    counts = {k: sum(status == k for status, _ in results) for k in ("finished", "hung", "failed")}
    spread = (f"{statistics.median(seconds):.1f} s ({min(seconds):.1f} .. {max(seconds):.1f})" if seconds else "-")
    return f"| {what} | {len(results)} | {counts['finished']} | {counts['hung']} | {counts['failed']} | {spread} |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="nbconvert runs per widget lesson (default: 30)")
    parser.add_argument("--autogrades", type=int, default=10, help="autograde runs of lesson 04 (default: 10)")
    parser.add_argument("--limit", type=float, default=300, help="seconds before a run counts as hung (default: 300)")
    args = parser.parse_args(argv)
    env = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env])  # nbgrader runs `alembic`
    lines = ["| run | runs | finished | hung (killed) | failed | median seconds (min .. max) |",
             "|---|--:|--:|--:|--:|---|"]
    everything = []
    with tempfile.TemporaryDirectory() as tmp:
        batches = [(f"nbconvert --execute {lesson.name}", lambda lesson=lesson: nbconvert_runs(
            lesson, args.runs, args.limit, Path(tmp))) for lesson in widget_lessons()]
        if args.autogrades:
            batches.append((f"nbgrader autograde {AUTOGRADED} (solved)",
                            lambda: autograde_runs(args.autogrades, args.limit, Path(tmp))))
        for what, batch in batches:
            results = batch()
            everything += results
            lines.append(row(what, results))
            print(lines[-1], flush=True)
    print("\n".join(["", *lines]))
    return 0 if all(status == "finished" for status, _ in everything) else 1


if __name__ == "__main__":
    sys.exit(main())
