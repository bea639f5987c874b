"""The dequantized float32 weights, kept on disk beside the GGUF file so a second load maps them instead of
dequantizing again (about 0.5 GB for SmolLM2-135M).

A copy is only ever used whole and intact:
  - it is written into a temporary folder and renamed into place at the end, so a crash never leaves half a
    copy; the temporary folder is removed whatever happens, a lost race or a full disk included;
  - the manifest records every array's size and CRC-32 when it is written, and a CRC-32 of itself (a config
    edited to 29 layers would otherwise load and run the wrong model); load() checks them all before handing out
    a single array, and any difference, or a manifest it cannot read, raises Damaged: the caller rebuilds from
    the GGUF file.
CRC-32 (zlib) is there to catch accidental damage (a truncated or overwritten file), not tampering; checking
all 538 MB takes about 0.15 s on the machine the project is developed on.
"""
import dataclasses
import json
import os
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from kvlesson.configs import Config
from kvlesson.weights import layout
from kvlesson.weights.fetch import remove_stale

VERSION = "5"  # bump when the layout of the folder or the meaning of its config changes


class Damaged(Exception):
    """The folder is not a complete, intact copy; the message says what is wrong."""


def folder_for(cache_dir, gguf_path, digest):
    """The folder of float32 arrays for this exact file (keyed by its sha256)."""
    return Path(cache_dir) / f"{Path(gguf_path).stem}.{digest[:16]}.f32"


def save(folder, config, weights, tokenizer_data, chat_template):
    """Write the arrays (memory order included) and the manifest; OSError if the folder cannot be written."""
    folder = Path(folder)
    tied = layout.is_tied(weights)
    names = sorted(n for n in weights if not (tied and n == "token_embd.weight"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(folder.parent, ".f32-*")
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".f32-"))
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
        if folder.exists():  # an older or damaged copy: this one replaces it
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
            done = f"written in {time.perf_counter() - start:.1f} s"
        except OSError:
            if not (folder / "manifest.json").is_file():
                raise
            done = "written by another process first; that copy is kept"  # theirs stands, ours goes
        print(f"kvlesson: float32 copy {done}.", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
