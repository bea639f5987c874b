"""Model files: never use a damaged one, never leave debris, say what is wrong with a file of another shape.

A tiny Llama-style GGUF file is written here with gguf.GGUFWriter (llama.cpp's own writer): 2 layers, D = 16,
a 12-token vocabulary. It loads and runs like SmolLM2, and variants of it (a metadata key missing, a tensor
missing, one wrong shape) must each be refused at load with a ModelFileError naming the culprit.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvlesson import llama
from kvlesson.weights import f32cache, fetch, gguf_file

CFG = dict(D=16, n_layers=2, H=4, Hkv=2, d=4, hidden=24)
TOKENS = ["a", "b", "c", "d", " ", "Ġ", "ab", "cd", "<|im_start|>", "<|im_end|>", "x", "y"]


def tiny_gguf(path, drop_key=None, drop_tensor=None, reshape=None, seed=0, meta=None, eos=9, bos=None, poison=None):
    """Write a tiny model file; optionally without one metadata key or tensor, with one tensor reshaped, with
    metadata values changed or added (meta: key after "llama." -> value; a negative int is written as int32), other
    end or beginning token ids, or one number of a tensor replaced (poison: (tensor name, value))."""
    import gguf

    rng = np.random.default_rng(seed)
    c = CFG
    values = {"block_count": c["n_layers"], "context_length": 64, "embedding_length": c["D"],
              "feed_forward_length": c["hidden"], "attention.head_count": c["H"], "attention.head_count_kv": c["Hkv"],
              "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-5, **(meta or {})}
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in values.items():
        if key == drop_key:
            continue
        if isinstance(value, float):
            w.add_float32(f"llama.{key}", value)
        elif value < 0:
            w.add_int32(f"llama.{key}", value)
        else:
            w.add_uint32(f"llama.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in TOKENS])
    w.add_token_merges(["a b", "c d"])
    w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
    shapes = gguf_file.expected_shapes(_config())
    for name, shape in shapes.items():
        if name == drop_tensor:
            continue
        if reshape and name == reshape[0]:
            shape = reshape[1]
        a = (rng.standard_normal(shape) / 4).astype(np.float32) if len(shape) == 2 else np.ones(shape, np.float32)
        if poison and name == poison[0]:
            a.flat[a.size // 2] = poison[1]
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _config():
    from kvlesson.configs import Config
    return Config(vocab=len(TOKENS), max_len=64, **CFG)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KVLESSON_CACHE_DIR", str(folder))
    return folder


def test_a_tiny_file_of_the_right_shape_loads_and_runs(tmp_path, cache_dir):
    model = llama.load(tiny_gguf(tmp_path / "tiny.gguf"), sha256=None)
    assert (model.config.n_layers, model.config.vocab, model.config.max_len) == (2, 12, 64)
    assert model.tokenizer.encode("abcd") == [6, 7]
    out = model.generate([0, 1, 2], 5)
    assert out == model.generate([0, 1, 2], 5, use_cache=False) and len(out) == 5


@pytest.mark.parametrize("change, words", [
    (dict(drop_key="attention.head_count_kv"), "no llama.attention.head_count_kv"),
    (dict(drop_key="rope.freq_base"), "no llama.rope.freq_base"),
    (dict(drop_tensor="blk.1.ffn_down.weight"), "lacks tensors the model needs: blk.1.ffn_down.weight"),
    (dict(drop_tensor="output_norm.weight"), "output_norm.weight"),
    (dict(reshape=("blk.0.attn_q.weight", (12, 16))), "blk.0.attn_q.weight has shape [12, 16]"),
    (dict(reshape=("blk.1.attn_k.weight", (8, 12))), "blk.1.attn_k.weight has shape [8, 12]"),
    (dict(reshape=("token_embd.weight", (11, 16))), "token_embd.weight has shape [11, 16]"),
])
def test_a_file_of_another_shape_is_refused_at_load_naming_the_culprit(tmp_path, cache_dir, change, words):
    path = tiny_gguf(tmp_path / "odd.gguf", **change)
    with pytest.raises(fetch.ModelFileError, match=words.replace("[", r"\[")):
        llama.load(path, sha256=None)
    assert not any(cache_dir.glob("*")) if cache_dir.exists() else True  # nothing written for a refused file


BAD_HEADERS = [  # (change, the words the error must hold: the key, and what is wrong with its value)
    (dict(meta={"attention.layer_norm_rms_epsilon": -1.0}), r"llama.attention.layer_norm_rms_epsilon must be finite "
                                                            r"and above 0; got .*=-1.0"),
    (dict(meta={"attention.layer_norm_rms_epsilon": 0.0}), "llama.attention.layer_norm_rms_epsilon must be finite"),
    (dict(meta={"attention.layer_norm_rms_epsilon": float("nan")}), "llama.attention.layer_norm_rms_epsilon must"),
    (dict(meta={"context_length": 0}), "llama.context_length must be at least 1; got llama.context_length=0"),
    (dict(meta={"rope.freq_base": float("nan")}), "llama.rope.freq_base must be finite and above 0; got .*nan"),
    (dict(meta={"rope.freq_base": -1.0}), "llama.rope.freq_base must be finite and above 0"),
    (dict(meta={"rope.freq_base": float("inf")}), "llama.rope.freq_base must be finite and above 0"),
    (dict(meta={"attention.head_count": 0}), "llama.attention.head_count must be at least 1"),
    (dict(meta={"attention.head_count": 3, "attention.head_count_kv": 1}),
     "llama.embedding_length=16 does not split into llama.attention.head_count=3 heads"),
    (dict(meta={"attention.head_count_kv": 3}), "llama.attention.head_count=4 is not a multiple of "
                                                "llama.attention.head_count_kv=3"),
    (dict(meta={"attention.head_count_kv": 0}), "llama.attention.head_count_kv must be at least 1"),
    (dict(meta={"attention.head_count_kv": -2}), "llama.attention.head_count_kv must be at least 1"),
    (dict(meta={"embedding_length": 0}), "llama.embedding_length must be at least 1"),
    (dict(meta={"embedding_length": 32}), r"token_embd.weight has shape \[12, 16\]; the config \(D=32"),
    (dict(meta={"attention.key_length": 5}), "the head dim d=5 is odd"),
    (dict(meta={"attention.value_length": 8}), "llama.attention.value_length=8 differs from the key length d=4"),
    (dict(meta={"block_count": 0}), "llama.block_count must be at least 1"),
    (dict(meta={"feed_forward_length": 0}), "llama.feed_forward_length must be at least 1"),
    (dict(meta={"vocab_size": 5}), "lists 12 tokens, more than the llama.vocab_size=5 rows"),
    (dict(eos=10**9), "tokenizer.ggml.eos_token_id=1000000000 is outside the vocabulary of 12 tokens"),
    (dict(eos=12), "tokenizer.ggml.eos_token_id=12 is outside the vocabulary of 12 tokens"),
    (dict(bos=12), "tokenizer.ggml.bos_token_id=12 is outside the vocabulary of 12 tokens"),
    (dict(poison=("blk.1.ffn_up.weight", np.nan)), "tensor blk.1.ffn_up.weight holds 1 NaN or inf values of 384"),
    (dict(poison=("output_norm.weight", np.inf)), "tensor output_norm.weight holds 1 NaN or inf values of 16"),
    (dict(poison=("token_embd.weight", -np.inf)), "tensor token_embd.weight holds 1 NaN or inf"),
]


@pytest.mark.parametrize("change, words", BAD_HEADERS)
def test_a_header_or_weight_no_model_runs_with_is_refused_at_load_naming_the_file_and_key(tmp_path, cache_dir,
                                                                                           change, words):
    """Before: with sha256=None, an epsilon of -1 or a NaN weight loaded silently (NaN logits, every greedy token 0),
    a context of 0 or a NaN RoPE base loaded and the first forward refused without naming the file, a head count of 0
    was a bare ZeroDivisionError, and an end token id of 10**9 loaded."""
    path = tiny_gguf(tmp_path / "odd.gguf", **change)
    with pytest.raises(fetch.ModelFileError, match=words) as info:
        llama.load(path, sha256=None)
    assert str(info.value).startswith(f"{path}:")
    assert not cache_dir.exists() or not any(cache_dir.iterdir())  # no float32 copy of a file that is refused


def test_a_head_dim_set_on_its_own_need_not_divide_the_width(tmp_path, cache_dir):
    """Qwen3-32B's 64 heads of 128 are wider than its 5120: attention.key_length decides, and the check follows it."""
    meta = {"block_count": 1, "embedding_length": 10, "attention.head_count": 4, "attention.head_count_kv": 2,
            "attention.key_length": 4, "feed_forward_length": 8, "rope.freq_base": 1e4,
            "attention.layer_norm_rms_epsilon": 1e-5, "context_length": 8}
    config = gguf_file.config_from_metadata({"general.architecture": "llama", "tokenizer.ggml.tokens": TOKENS,
                                             **{f"llama.{k}": v for k, v in meta.items()}})
    assert (config.D, config.H, config.d) == (10, 4, 4)


def _copy_folder(cache_dir):
    (folder,) = cache_dir.glob("*.f32")
    return folder


def test_the_float32_copy_is_written_with_checksums_and_used_next_time(tmp_path, cache_dir):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    first = llama.load(path, sha256=None)
    folder = _copy_folder(cache_dir)
    assert (folder / "manifest.json").is_file()
    assert not list(cache_dir.glob(".f32-*")), "the temporary folder was left behind"
    second = llama.load(path, sha256=None)
    np.testing.assert_array_equal(first.forward([0, 1, 2]), second.forward([0, 1, 2]))


@pytest.mark.parametrize("damage", ["overwrite 4 KiB", "empty file", "missing file", "bad manifest",
                                    "edited manifest", "manifest without files", "edited tokenizer"])
def test_a_damaged_float32_copy_is_rebuilt_with_one_line_not_used(tmp_path, cache_dir, capsys, damage):
    """Before the manifest had checksums, 4 KiB of zeros in one array made SmolLM2 answer [0, 0, 0, 0]."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    want = llama.load(path, sha256=None).forward([0, 1, 2])
    folder = _copy_folder(cache_dir)
    victim = folder / "blk.0.ffn_up.weight.npy"
    if damage == "overwrite 4 KiB":
        with open(victim, "r+b") as f:
            f.seek(128)
            f.write(b"\0" * min(4096, victim.stat().st_size - 128))
    elif damage == "empty file":
        victim.write_bytes(b"")
    elif damage == "missing file":
        victim.unlink()
    elif damage == "bad manifest":
        (folder / "manifest.json").write_text("{not json")
    elif damage == "edited tokenizer":
        tok = json.loads((folder / "tokenizer.json").read_text())
        tok["tokenizer.ggml.eos_token_id"] = 3
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    else:  # an edit that still parses: once it loaded silently and ran a model with one layer fewer
        manifest = json.loads((folder / "manifest.json").read_text())
        if damage == "edited manifest":
            manifest["config"]["n_layers"] -= 1
        else:
            del manifest["files"]
        (folder / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    model = llama.load(path, sha256=None)
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 4 and "cannot be used" in said[0] and "rebuilding" in said[0], said  # then the rebuild's three
    assert said[1].startswith("kvlesson: reading tiny.gguf and dequantizing"), said
    assert said[2].startswith("kvlesson: writing the float32 weights") and "float32 copy written in" in said[3], said
    np.testing.assert_array_equal(model.forward([0, 1, 2]), want)
    capsys.readouterr()
    llama.load(path, sha256=None)
    assert capsys.readouterr().out == ""  # rebuilt once, intact since


def test_writing_the_copy_says_what_and_how_big(tmp_path, cache_dir, capsys):
    """The first load dequantizes and writes the float32 copy (0.5 GB for SmolLM2): it says so before each step, and
    when it is done."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    llama.load(path, sha256=None)
    folder = _copy_folder(cache_dir)
    arrays = sorted(folder.glob("*.npy"))
    mb = sum(np.load(a, mmap_mode="r").nbytes for a in arrays) / 1e6
    reading, before, after = capsys.readouterr().out.splitlines()
    assert reading == "kvlesson: reading tiny.gguf and dequantizing its weights to float32, once ..."
    assert before == (f"kvlesson: writing the float32 weights once ({len(arrays)} arrays, {mb:,.0f} MB) to {folder}, "
                      "so that the next load maps them instead of dequantizing again ...")
    assert re.fullmatch(r"kvlesson: float32 copy written in \d+\.\d s\.", after), after
    llama.load(path, sha256=None)
    assert capsys.readouterr().out == ""  # the second load maps the copy and says nothing


def test_the_checksums_catch_a_change_the_sizes_cannot(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    f = gguf_file.read(path)
    from kvlesson.weights import layout
    folder = tmp_path / "copy.f32"
    f32cache.save(folder, f.config, layout.matmul_weights(f.tensors), f.tokenizer, f.chat_template)
    f32cache.load(folder)
    victim = folder / "output_norm.weight.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x40  # one flipped bit in the last float
    victim.write_bytes(bytes(data))
    with pytest.raises(f32cache.Damaged, match="fails its CRC-32"):
        f32cache.load(folder)


def test_a_cache_path_that_is_a_plain_file_leaves_no_debris(tmp_path, cache_dir, capsys):
    """The parent of the copy is a plain file: nothing can be saved, and nothing half-saved may stay behind."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    cache_dir.parent.mkdir(exist_ok=True)
    cache_dir.write_text("not a folder")
    model = llama.load(path, sha256=None)
    said = capsys.readouterr().out
    assert "could not keep a float32 copy" in said and f"{cache_dir} is a file, not a folder" in said, said
    assert model.generate([0, 1], 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "tiny.gguf"]


def test_losing_the_rename_race_keeps_the_winner_and_removes_the_loser(tmp_path, cache_dir, monkeypatch, capsys):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    llama.load(path, sha256=None)
    folder = _copy_folder(cache_dir)
    real_replace = os.replace

    def racing_replace(src, dst):
        if str(dst) == str(folder):  # another process renamed its copy into place just before us
            folder.mkdir()
            (folder / "manifest.json").write_text("{}")  # theirs
        return real_replace(src, dst)

    import shutil
    shutil.rmtree(folder)
    monkeypatch.setattr(os, "replace", racing_replace)
    capsys.readouterr()
    llama.load(path, sha256=None)
    assert (folder / "manifest.json").read_text() == "{}"
    assert capsys.readouterr().out.splitlines()[-1] == ("kvlesson: float32 copy written by another process first; "
                                                       "that copy is kept.")
    assert not list(cache_dir.glob(".f32-*")), "the loser's temporary folder was left behind"


def test_a_read_only_cache_folder_falls_back_to_the_gguf(tmp_path, cache_dir, capsys, monkeypatch):
    """Writing the copy raises PermissionError (a read-only or foreign folder): the model still loads."""
    path = tiny_gguf(tmp_path / "tiny.gguf")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(cache_dir))

    monkeypatch.setattr(f32cache.tempfile, "mkdtemp", refuse)
    model = llama.load(path, sha256=None)
    said = capsys.readouterr().out
    assert "could not keep a float32 copy" in said and "Permission denied" in said
    assert model.generate([0, 1], 2)


def test_an_unreadable_copy_falls_back_to_the_gguf(tmp_path, cache_dir, capsys, monkeypatch):
    """A copy in a folder another user owns raises PermissionError on read: load from the GGUF, and say so."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    llama.load(path, sha256=None)

    def refuse(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(f32cache, "load", refuse)
    capsys.readouterr()
    model = llama.load(path, sha256=None)
    assert "cannot read the float32 copy" in capsys.readouterr().out
    assert model.generate([0, 1], 2)


def test_a_wrong_checksum_copy_of_our_own_says_one_thing(cache_dir, monkeypatch, capsys):
    target = cache_dir / fetch.FILENAME
    cache_dir.mkdir(parents=True)
    target.write_bytes(b"\0" * fetch.SIZE)

    def fake_fetch(where):
        return "fetched"

    monkeypatch.setattr(fetch, "fetch", fake_fetch)
    assert fetch.model_file() == (target, "fetched")
    said = capsys.readouterr().out
    assert "fails its checksum" in said and "Fetching a fresh copy" in said and "Delete it" not in said


def test_a_damaged_file_in_a_read_only_cache_says_what_to_set(cache_dir, monkeypatch):
    """It once ended in a bare PermissionError: the bad copy could be neither used nor replaced."""
    cache_dir.mkdir(parents=True)
    (cache_dir / fetch.FILENAME).write_bytes(b"half a download")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(fetch.Path, "unlink", refuse)
    with pytest.raises(fetch.ModelFileError, match="not writable. Set KVLESSON_CACHE_DIR"):
        fetch.model_file()


# ---- processes loading at once, and a writer killed mid-write

REPO = Path(llama.__file__).resolve().parents[1]

RACER = """
import pathlib, sys, time
from kvlesson import llama
from kvlesson.weights import f32cache
real_save = f32cache.save

def slow_save(*args, **kwargs):  # SmolLM2's copy takes seconds to write; the tiny one takes milliseconds
    time.sleep(float(sys.argv[3]))
    return real_save(*args, **kwargs)

f32cache.save = slow_save
go = pathlib.Path(sys.argv[2])
while not go.exists():
    time.sleep(0.002)
model = llama.load(sys.argv[1], sha256=None)
print("logits", model.forward([0, 1, 2]).tobytes().hex())
"""


def start(script, *args, cache_dir):
    env = {**os.environ, "KVLESSON_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


class Watch(threading.Thread):
    """Polls the copy's folder while processes race: how often a complete copy (manifest in place) went missing."""

    def __init__(self, folder):
        super().__init__(daemon=True)
        self.folder, self.done, self.complete, self.vanished = folder, threading.Event(), False, 0

    def run(self):
        while not self.done.is_set():
            here = (self.folder / "manifest.json").is_file()
            self.vanished += self.complete and not here
            self.complete = here
            time.sleep(0.0005)


def test_three_processes_loading_at_once_build_one_copy_and_never_delete_it(tmp_path, cache_dir):
    """Before: each later writer deleted the earlier complete copy before renaming its own (three copies written,
    the folder seen missing after it was complete). Now one process writes; the others wait for it and map its copy,
    and every process gets the same logits."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    folder = f32cache.folder_for(cache_dir, path, fetch.sha256_of(path))
    go = tmp_path / "go"
    racers = [start(RACER, path, go, 0.5, cache_dir=cache_dir) for _ in range(3)]
    watch = Watch(folder)
    watch.start()
    time.sleep(1.0)  # the imports
    go.touch()
    outs = [racer.communicate(timeout=120) for racer in racers]
    watch.done.set()
    watch.join()
    assert all(racer.returncode == 0 for racer in racers), [err for _, err in outs]
    said = [out.splitlines() for out, _ in outs]
    logits = {lines[-1] for lines in said}
    assert len(logits) == 1 and next(iter(logits)).startswith("logits ")
    writers = [lines for lines in said if any("float32 copy written in" in line for line in lines)]
    assert len(writers) == 1, said
    assert sum(any("waiting for it" in line for line in lines) for lines in said) >= 1, said  # the ones that waited
    assert watch.vanished == 0, f"the complete copy went missing {watch.vanished} times"
    assert sorted(p.name for p in cache_dir.iterdir()) == [folder.name], "a temporary folder or the lock stayed"


KILLED = """
import pathlib, sys, time
from kvlesson import llama
from kvlesson.weights import f32cache
real_crc32 = f32cache._crc32

def stall(path):  # the first array is written: say so, then hang until killed
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)

f32cache._crc32 = stall
llama.load(sys.argv[1], sha256=None)
"""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_writer_killed_mid_write_leaves_nothing_the_next_load_keeps(tmp_path, cache_dir, capsys, how):
    """Before: a SIGTERM during the write left its temporary folder (142 MB for SmolLM2) for an hour. No handler is
    installed for the signal (it would replace the host's own: a notebook kernel's, a server's, and SIGKILL cannot
    be caught); instead the lock dies with the writer, and the next process to take it is the only writer there
    is, so it removes every temporary folder of that copy at once."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    folder = f32cache.folder_for(cache_dir, path, fetch.sha256_of(path))
    writing = tmp_path / "writing"
    victim = start(KILLED, path, writing, cache_dir=cache_dir)
    deadline = time.monotonic() + 60
    while not writing.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writing.exists(), victim.communicate(timeout=5)
    victim.send_signal(how)
    victim.communicate(timeout=30)
    left = [p.name for p in cache_dir.iterdir() if p.name.startswith(".f32-")]
    assert left and any((cache_dir / name).iterdir() for name in left)  # half a copy, as a killed writer leaves
    model = llama.load(path, sha256=None)
    assert "float32 copy written in" in capsys.readouterr().out
    assert sorted(p.name for p in cache_dir.iterdir()) == [folder.name]  # no temporary folder, no lock
    assert model.generate([0, 1], 2)


def test_saving_over_an_intact_copy_keeps_it(tmp_path, capsys):
    """Nobody deletes a complete copy: a second save of the same folder keeps the first (a process of an older
    kvlesson, which takes no lock, may still race)."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    f = gguf_file.read(path)
    from kvlesson.weights import layout
    folder = tmp_path / "copy.f32"
    weights = layout.matmul_weights(f.tensors)
    f32cache.save(folder, f.config, weights, f.tokenizer, f.chat_template)
    first = os.stat(folder / "manifest.json").st_ino
    capsys.readouterr()
    f32cache.save(folder, f.config, weights, f.tokenizer, f.chat_template)
    assert capsys.readouterr().out.splitlines()[-1] == ("kvlesson: float32 copy written by another process first; "
                                                       "that copy is kept.")
    assert os.stat(folder / "manifest.json").st_ino == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.f32", "tiny.gguf"]


def test_a_writer_that_holds_the_lock_too_long_is_waited_for_then_read_around(tmp_path, cache_dir, capsys,
                                                                               monkeypatch):
    """Another process holds the lock past the wait (a writer stopped in a debugger, say): the load says it waited,
    reads the GGUF file itself, and writes no copy beside the one being written."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    folder = f32cache.folder_for(cache_dir, path, fetch.sha256_of(path))
    monkeypatch.setattr(f32cache, "WAIT", 0.3)
    with f32cache.one_writer(folder) as why_not:  # a second open file description: flock treats it as another holder
        assert why_not is None
        model = llama.load(path, sha256=None)
    said = capsys.readouterr().out
    assert "another process is writing the float32 copy" in said and "waiting for it" in said, said
    assert "could not keep a float32 copy" in said and "another process has been writing it for over 0.3 s" in said
    assert model.generate([0, 1], 2) and not folder.exists()
