"""The dequantized float32 weights, kept on disk beside the GGUF file so a second load maps them instead of
dequantizing again (about 0.5 GB for SmolLM2-135M).

A copy is only ever used whole and intact:
  - it is written into a temporary folder and renamed into place at the end, so a crash never leaves half a
    copy; the temporary folder is removed whatever happens, a lost race or a full disk included;
  - one process at a time builds it (`one_writer`, a lock the operating system releases when its holder dies, even
    by SIGKILL): a second process that loads the same model at the same moment waits, then maps the first one's
    copy, and a complete copy is never deleted to make room for another. The next holder of the lock removes at
    once whatever temporary folder a killed writer left (up to a whole copy's size);
  - the manifest records every array's size and CRC-32 when it is written, and a CRC-32 of itself (a config
    edited to 29 layers would otherwise load and run the wrong model); load() checks them all before handing out
    a single array, and any difference, or a manifest it cannot read, raises Damaged: the caller rebuilds from
    the GGUF file.
CRC-32 (zlib) is there to catch accidental damage (a truncated or overwritten file), not tampering; checking
all 538 MB takes about 0.15 s on the machine the project is developed on.
"""
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from kvlesson.configs import Config
from kvlesson.weights import layout
from kvlesson.weights.fetch import remove_stale

if sys.platform == "win32":
    import msvcrt
else:
    import fcntl

VERSION = "5"  # bump when the layout of the folder or the meaning of its config changes
WAIT = 600.0  # seconds a load waits for another process to finish the copy before reading the GGUF file itself


class Damaged(Exception):
    """The folder is not a complete, intact copy; the message says what is wrong."""


def folder_for(cache_dir, gguf_path, digest):
    """The folder of float32 arrays for this exact file (keyed by its sha256)."""
    return Path(cache_dir) / f"{Path(gguf_path).stem}.{digest[:16]}.f32"


def save(folder, config, weights, tokenizer_data, chat_template):
    """Write the arrays (memory order included) and the manifest; OSError if the folder cannot be written.

    Call it inside `one_writer(folder)` where another process may build the same copy. A copy already in place is
    kept if it is intact; a damaged one is moved aside before the new one takes its place, so a reader sees the old
    copy, none, or the new one, never half of one.
    """
    folder = Path(folder)
    tied = layout.is_tied(weights)
    names = sorted(n for n in weights if not (tied and n == "token_embd.weight"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(folder.parent, ".f32-*")  # what a killed writer of an older kvlesson, or of another file, left
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=_temporary(folder)))
    size = sum(weights[name].nbytes for name in names)
    print(f"kvlesson: writing the float32 weights once ({len(names)} arrays, {size / 1e6:,.0f} MB) to {folder}, "
          "so that the next load maps them instead of dequantizing again ...", flush=True)
    start = time.perf_counter()
    try:
        files = {}
        for name in names:
            path = tmp / f"{name}.npy"
            np.save(path, weights[name])  # a transposed view is saved in Fortran order, no copy
            files[name] = {"bytes": path.stat().st_size, "crc32": _crc32(path)}
        tokenizer_json = json.dumps(tokenizer_data)
        (tmp / "tokenizer.json").write_text(tokenizer_json)
        manifest = {"version": VERSION, "config": dataclasses.asdict(config), "chat_template": chat_template,
                    "tied": tied, "files": files, "tokenizer_crc32": zlib.crc32(tokenizer_json.encode())}
        (tmp / "manifest.json").write_text(json.dumps({**manifest, "crc32": _crc_of(manifest)}))
        if _put_in_place(tmp, folder):
            done = f"written in {time.perf_counter() - start:.1f} s"
        else:
            done = "written by another process first; that copy is kept"  # theirs stands, ours goes
        print(f"kvlesson: float32 copy {done}.", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _put_in_place(tmp, folder):
    """Rename the finished copy `tmp` to `folder` -> True, or False when an intact copy is there already (kept)."""
    if folder.exists():
        try:
            load(folder)
            return False
        except Damaged:  # an older or damaged copy: out of the way in one rename, then removed
            aside = folder.with_name(f"{_temporary(folder)}old-{os.getpid()}-{time.monotonic_ns()}")
            os.replace(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "manifest.json").is_file():
            raise
        return False  # a process that took no lock renamed its copy into place first
    return True


@contextlib.contextmanager
def one_writer(folder, wait=None):
    """Build `folder`'s copy inside this block, one process at a time -> None while this process may write it, or
    a sentence saying why it may not (the folder cannot be written; another process held it past `wait` seconds,
    default WAIT).

    A process that finds the copy missing or damaged takes the lock, then looks again: another process may have
    finished it meanwhile. The lock is the operating system's (flock; msvcrt.locking on Windows), so it dies with
    the process that holds it and is never stale. Whoever holds it is the only writer, so it removes every
    temporary folder of this copy it finds: a writer killed mid-write (SIGTERM, SIGKILL, a power cut) left it.
    """
    folder, wait = Path(folder), WAIT if wait is None else wait
    lock = folder.with_name(f"{folder.name}.lock")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        fd = _locked(lock, wait, folder)
    except OSError as e:
        fd, why = None, (f"{folder.parent} is a file, not a folder" if folder.parent.is_file() else
                         f"cannot lock {lock}: {e.strerror or e}")
    else:
        why = f"another process has been writing it for over {wait:g} s"
    if fd is None:
        yield why
        return
    try:
        _remove_temporaries(folder)
        yield None
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # before the lock goes: a waiter that then gets it finds its file gone and opens anew
        os.close(fd)


def _locked(lock, wait, folder):
    """-> an open descriptor of the file `lock` whose lock this process holds, or None after `wait` seconds."""
    deadline, said = time.monotonic() + wait, False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if _try_lock(fd) and os.fstat(fd).st_ino == os.stat(lock).st_ino:  # still that name's file: ours
                return fd
        except FileNotFoundError:  # its holder removed it as it finished: take the next one
            pass
        except BaseException:  # a Ctrl-C while waiting keeps no descriptor open
            os.close(fd)
            raise
        os.close(fd)
        if time.monotonic() > deadline:
            return None
        if not said:
            print(f"kvlesson: another process is writing the float32 copy in {folder}; waiting for it ...",
                  flush=True)
            said = True
        time.sleep(0.05)


def _try_lock(fd):
    """-> True when this process now holds the lock on `fd`, False when another process does."""
    if sys.platform == "win32":
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:  # EACCES or EDEADLOCK: held elsewhere
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _temporary(folder):
    """The prefix of this copy's temporary folders (".f32-*" too, what remove_stale looks for)."""
    return f".f32-{Path(folder).name}-"


def _remove_temporaries(folder):
    prefix = _temporary(folder)
    for path in Path(folder).parent.iterdir():
        if path.name.startswith(prefix):
            shutil.rmtree(path, ignore_errors=True)


def load(folder, verify=True):
    """-> (Config, {name: read-only float32 array}, tokenizer data, chat template); Damaged if anything is off.

    verify=False skips the arrays' CRC-32 pass (the manifest's own checks stay): for a copy another process verified
    moments ago, as a parallel program's rank 0 does for the ranks that map the same files (kvlesson.parallel).
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        tokenizer_text = (folder / "tokenizer.json").read_text()
    except FileNotFoundError as e:
        raise Damaged(f"{Path(e.filename).name} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Damaged("its manifest is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION:
        raise Damaged("it was written by another version of kvlesson")
    written = manifest.pop("crc32", None)
    if written != _crc_of(manifest):
        raise Damaged("its manifest changed after it was written (its own CRC-32 does not match)")
    try:
        files, tied, template = manifest["files"], manifest["tied"], manifest["chat_template"]
        config = Config(**manifest["config"])
        if zlib.crc32(tokenizer_text.encode()) != manifest["tokenizer_crc32"]:
            raise Damaged("tokenizer.json changed after it was written")
        for name, want in files.items() if verify else ():
            path = folder / f"{name}.npy"
            size = path.stat().st_size if path.is_file() else None
            if size != want["bytes"]:
                raise Damaged(f"{path.name} has {size} bytes; {want['bytes']} were written")
            if _crc32(path) != want["crc32"]:
                raise Damaged(f"{path.name} fails its CRC-32: its bytes changed after it was written")
    except (KeyError, TypeError, AttributeError) as e:
        raise Damaged(f"its manifest is malformed ({type(e).__name__}: {e})") from None
    w = {name: np.asarray(np.load(folder / f"{name}.npy", mmap_mode="r")) for name in files}
    if any(a.dtype != np.float32 for a in w.values()):
        raise Damaged("it holds an array that is not float32")
    if tied:
        w["token_embd.weight"] = w["output.weight"].T
    return config, w, json.loads(tokenizer_text), template


def _crc_of(manifest):
    """CRC-32 of the manifest's content, written in one canonical form."""
    return zlib.crc32(json.dumps(manifest, sort_keys=True).encode())


def _crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc
