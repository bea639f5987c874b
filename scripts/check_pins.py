"""Does every pin resolve, with wheels only, on every Python version and platform the README names?

    python scripts/check_pins.py                      # requirements-test.txt: the learner's, instructor's and test sets
    python scripts/check_pins.py requirements.txt

For each CPython version and platform tag, pip resolves the whole file (dependencies included) without installing
anything: `pip install --dry-run --only-binary=:all: --python-version X --platform P --target <tmp>`. A pin without
a wheel for that combination fails the resolve, and the row says which. Needs the network (or a PyPI mirror).
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import Marker

PYTHONS = ("3.11", "3.12", "3.13", "3.14")
PLATFORMS = {  # pip takes one --platform per tag it may accept, so Linux lists the manylinux tags wheels use
    # (llguidance, lesson 16's grammar library, ships manylinux_2_31 wheels only: glibc 2.31 or newer, 2020 on)
    "Linux x86_64": ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                     "manylinux2014_x86_64"),
    "macOS arm64": ("macosx_14_0_arm64",),
    "macOS x86_64": ("macosx_13_0_x86_64",),
    "Windows x86_64": ("win_amd64",),
}
# pip judges a line's environment marker by the machine it runs on, whatever --platform says, so the markers are
# judged here for each platform instead (MPICH's wheel is pinned for Linux and macOS, Intel MPI's for Windows)
SYS_PLATFORM = {"Linux x86_64": "linux", "macOS arm64": "darwin", "macOS x86_64": "darwin", "Windows x86_64": "win32"}
ROOT = Path(__file__).resolve().parent.parent


def flattened(path, seen=None):
    """The requirement lines of `path` and its -r includes; the editable install of this project is left out (pip
    would build it, and it is pure Python: numpy and ml_dtypes, its only dependencies, are pinned anyway)."""
    lines = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            lines += flattened(Path(path).parent / line[3:].strip())
        elif line and not line.startswith("-e"):
            lines.append(line)
    return lines


def for_platform(lines, python, platform):
    """The lines whose environment marker holds on `platform` under `python`, markers dropped."""
    kept = []
    for line in lines:
        requirement, _, marker = line.partition(";")
        env = {"sys_platform": SYS_PLATFORM[platform], "python_version": python, "python_full_version": python + ".0"}
        if not marker.strip() or Marker(marker.strip()).evaluate(env):
            kept.append(requirement.strip())
    return kept


def resolves(lines, python, tags):
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(lines) + "\n")
        platform = [arg for tag in tags for arg in ("--platform", tag)]
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                              "--only-binary=:all:", "--no-cache-dir", "--python-version", python, *platform,
                              "--target", str(Path(tmp) / "t"), "-r", str(req)], capture_output=True, text=True)
    errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR")]
    return run.returncode == 0 and "Would install" in run.stdout, errors[:1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("requirements", nargs="?", default=str(ROOT / "requirements-test.txt"))
    args = parser.parse_args(argv)
    lines, failed = flattened(args.requirements), 0
    print(f"| python | {' | '.join(PLATFORMS)} |\n|---|" + "---|" * len(PLATFORMS))
    for python in PYTHONS:
        cells = []
        for platform, tags in PLATFORMS.items():
            ok, errors = resolves(for_platform(lines, python, platform), python, tags)
            cells.append("resolves" if ok else f"FAILS: {errors[0] if errors else '?'}")
            failed += not ok
        print(f"| {python} | {' | '.join(cells)} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
