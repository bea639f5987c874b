"""Checkers for lesson 08: pricing the real model's cache, and a chunked prefill on it.

check_kv_bytes_per_token recognises the classic mispricings (query heads for KV heads, K without V,
one layer for all). check_chunked_prefill watches every call your function makes to the model, so it
can say which chunk went onto the wrong cache, or which tokens never reached the model.
"""
import numpy as np

from kvlesson.checks._verdict import call, failed, passed
from kvlesson.model import Config
from kvlesson.tolerance import CHUNK_TOL

__all__ = ["check_kv_bytes_per_token", "check_chunked_prefill"]


# ------------------------------------------------------------------------------------------- bytes per token

def _cfg(n_layers, H, Hkv, d):
    return Config(D=H * d, n_layers=n_layers, H=H, Hkv=Hkv, d=d, hidden=4 * H * d, vocab=256)


_CASES = [  # (what, config, bytes per value)
    ("SmolLM2-135M in float32", _cfg(30, 9, 3, 64), 4),
    ("Llama 3.1 8B in bfloat16", _cfg(32, 32, 8, 128), 2),
    ("multi-head attention (H == Hkv) in float16", _cfg(4, 4, 4, 16), 2),
    ("multi-query attention (Hkv = 1) in float32", _cfg(6, 8, 1, 32), 4),
]


def check_kv_bytes_per_token(fn):
    """fn(config, bytes_per_value) -> bytes one token adds to the cache, over all layers."""
    for what, c, b in _CASES:
        got, bad = call(fn, c, b)
        if bad is not None:
            return bad
        want = 2 * c.n_layers * c.Hkv * c.d * b
        if got == want:
            continue
        wrong = {  # the classic slips, each with its own symptom
            2 * c.n_layers * c.H * c.d * b: ("you priced the H query heads", "the cache stores only the Hkv KV heads"),
            c.n_layers * c.Hkv * c.d * b: ("you counted K but not V", "every layer caches two arrays, K and V"),
            2 * c.Hkv * c.d * b: ("you priced one layer", "every one of the n_layers layers keeps its own K and V"),
            8 * want: ("you counted bits", "bytes_per_value is already in bytes"),
            2 * c.n_layers * c.Hkv * c.d * 4: ("you used 4 bytes whatever bytes_per_value says",
                                               "multiply by bytes_per_value"),
        }
        problem, hint = wrong.get(got, (f"you got {got!r}", "2 (K and V) x layers x KV heads x head dim x bytes"))
        return failed(f"for {what} ({c.n_layers} layers, H={c.H}, Hkv={c.Hkv}, d={c.d}, {b} B per value) the "
                      f"cache grows by {want:,} B per token; {problem}", hint)
    return passed("2 x n_layers x Hkv x d x bytes per value, right for GQA, MHA and MQA alike")


# ------------------------------------------------------------------------------------------- chunked prefill

class _Recorder:
    """Stands in for the model and notes every forward call: how many tokens, onto how full a cache."""

    def __init__(self, model):
        self._model, self.calls = model, []
        self.config, self.tokenizer = model.config, model.tokenizer

    def new_cache(self, *args, **kwargs):
        return self._model.new_cache(*args, **kwargs)

    def forward(self, ids, cache=None):
        self.calls.append((len(ids), None if cache is None else len(cache[0])))
        return self._model.forward(ids, cache)


def check_chunked_prefill(fn, model):
    """fn(model, ids, chunk) -> float32 [len(ids), vocab]: the logits of a prefill fed `chunk` tokens at a time
    onto one cache. Checked against one pass over all the ids, on the real model."""
    ids = model.tokenizer.encode("A cache keeps the keys and values of every token it has seen.")[:14]
    full = model.forward(ids)
    for chunk in (5, 1, len(ids), 32):
        problem = _one_chunking(fn, model, ids, chunk, full)
        if problem is not None:
            return problem
    return passed(f"chunks of 5, 1, {len(ids)} and 32 tokens onto one cache match one pass within {CHUNK_TOL:g}")


def _one_chunking(fn, model, ids, chunk, full):
    rec = _Recorder(model)
    got, bad = call(fn, rec, list(ids), chunk)
    if bad is not None:
        return bad
    got = np.asarray(got)
    case = f"{len(ids)} tokens in chunks of {chunk}"
    fed = sum(n for n, _ in rec.calls)
    if fed != len(ids):
        return failed(f"for {case} your function fed {fed} tokens to the model; expected {len(ids)}",
                      "step through range(0, len(ids), chunk) so the last, shorter chunk is fed too")
    restarted = [i for i, (_, held) in enumerate(rec.calls) if i > 0 and held in (None, 0)]
    if restarted:
        return failed(f"for {case}, call {restarted[0] + 1} went onto an empty cache (or none), so its tokens "
                      "sat at positions 0, 1, ... again and could not see the earlier chunks",
                      "create the cache once, before the loop, and pass the same one to every forward call")
    if got.shape != full.shape:
        rows = got.shape[0] if got.ndim == 2 else got.shape
        return failed(f"for {case} the result has {rows} rows; expected {len(ids)}, one per token",
                      "keep every chunk's logits and np.concatenate them, not only the last chunk's")
    if got.dtype != np.float32:
        return failed(f"for {case} the logits are {got.dtype}; expected float32",
                      "return the model's float32 logits as they are")
    err = float(np.abs(got - full).max())
    if err > CHUNK_TOL:
        return failed(f"for {case} the logits differ from one pass by up to {err:.3g}",
                      "feed the chunks in order, each exactly once, onto the one cache")
    return None
