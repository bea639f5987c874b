"""Checkers for lesson 08: what the model file stores, and a chunked prefill on the real model.

check_stored_bytes prices tensors in the GGUF storage types SmolLM2's file uses (F32, Q8_0, Q4_1), on the
file's own tensor sizes, and names the classic miscounts (codes without their scales, Q4_1 without its
minimum, float32 scales, bits for bytes). check_chunked_prefill stands between your function and the model
and records every forward call: how many tokens, which ones, onto how full a cache. So a single pass that
ignores `chunk`, a fresh cache per chunk, a dropped tail or tokens out of order are each named, and the
logits are compared with one pass with `not err <= tol`, so NaN never passes.
"""
import weakref

import numpy as np

from kvlesson.costs.tolerance import CHUNK_TOL
from kvlesson.teaching.verdict import Slip, as_array, as_number, checker, passed, reject, run

__all__ = ["check_stored_bytes", "check_chunked_prefill"]


# ------------------------------------------------------------------------------------------- stored bytes

# weights per block and bytes per block, as ggml lays them out (ggml-common.h; gguf.GGML_QUANT_SIZES agrees):
#   F32   one float32 per weight
#   Q8_0  32 int8 codes + one float16 scale d               (x = d * q)
#   Q4_1  32 4-bit codes, two per byte + float16 d and m     (x = d * q + m)
LAYOUT = {"F32": (1, 4), "Q8_0": (32, 32 + 2), "Q4_1": (32, 16 + 2 + 2)}

_STORED_CASES = [  # (case, (kind, weights)); the first four are tensors of SmolLM2's file
    ("token_embd.weight: Q8_0, 49,152 x 576 = 28,311,552 weights", ("Q8_0", 28_311_552)),
    ("blk.0.ffn_down.weight: Q4_1, 1,536 x 576 = 884,736 weights", ("Q4_1", 884_736)),
    ("blk.0.attn_k.weight: Q4_1, 576 x 192 = 110,592 weights", ("Q4_1", 110_592)),
    ("blk.0.attn_norm.weight: F32, 576 weights", ("F32", 576)),
    ("one Q4_1 block (32 weights)", ("Q4_1", 32)),
    ("two Q8_0 blocks (64 weights)", ("Q8_0", 64)),
    ("an empty Q4_1 tensor (0 weights)", ("Q4_1", 0)),
]


def stored_bytes(kind, n):
    """The reference: bytes that n weights (a whole number of blocks) take in the file as `kind`."""
    per_block, size = LAYOUT[kind]
    return n // per_block * size


def _blocks(n, code_bits, extra):
    return n // 32 * (32 * code_bits // 8 + extra)


_STORED_SLIPS = [
    Slip("codes only", lambda kind, n: n * 4 if kind == "F32" else _blocks(n, 4 if kind == "Q4_1" else 8, 0),
         "you counted the codes but not the numbers that turn them back into weights",
         "each block of 32 codes also stores a float16 scale d (2 bytes), and Q4_1 a float16 minimum m as well; "
         "without them the codes mean nothing"),
    Slip("Q4_1 without its minimum", lambda kind, n: stored_bytes(kind, n) if kind != "Q4_1" else _blocks(n, 4, 2),
         "your Q4_1 block has a scale but no minimum (that is Q4_0's 18 bytes)",
         "Q4_1 decodes x = d * q + m: two float16 numbers per block, 2 + 2 bytes, beside 16 bytes of codes"),
    Slip("float32 scales", lambda kind, n: n * 4 if kind == "F32" else
         (_blocks(n, 4, 8) if kind == "Q4_1" else _blocks(n, 8, 4)),
         "you stored the scales (and minimum) as float32",
         "ggml keeps them as float16: 2 bytes each"),
    Slip("bits", lambda kind, n: 8 * stored_bytes(kind, n), "that is 8 times too much: bits, not bytes",
         "a 4-bit code is half a byte: 32 codes fill 16 bytes"),
    Slip("float32 everywhere", lambda kind, n: 4 * n, "that is the float32 copy load() makes, not what the file stores",
         "price each storage type by its block: 32 weights per block for Q8_0 and Q4_1"),
    Slip("one scale per weight", lambda kind, n: n * 4 if kind == "F32" else
         (n // 2 + 4 * n if kind == "Q4_1" else n + 2 * n),
         "you gave every weight its own scale", "one scale (and for Q4_1 one minimum) serves a block of 32 weights"),
]


@checker
def check_stored_bytes(fn):
    """fn(kind, n) -> bytes n weights take in the GGUF file as kind ("F32", "Q8_0" or "Q4_1"); n is whole blocks."""
    answers = []
    for case, args in _STORED_CASES:
        got = as_number(run(fn, *args, case=case), case, integer=True)
        answers.append((case, args, got, stored_bytes(*args)))
    wrong = [a for a in answers if a[2] != a[3]]
    if not wrong:
        return passed("F32 at 4 bytes a weight, Q8_0 at 34 bytes and Q4_1 at 20 bytes per block of 32")
    case, args, got, want = wrong[0]
    problem = f"for {case} you return {got:,} B; expected {want:,} B"
    for slip in _STORED_SLIPS:  # the slip that gives every answer
        if all(_gives(slip, a[1], a[2]) for a in answers):
            reject(f"{problem}: {slip.problem}", slip.hint)
    slip = next((s for s in _STORED_SLIPS if _gives(s, args, got)), None)
    if slip is not None:
        reject(f"{problem}: {slip.problem}", slip.hint)
    reject(problem, "n // 32 blocks, each 32 codes plus its float16 numbers: Q8_0 32 + 2 bytes, Q4_1 16 + 2 + 2; "
                    "F32 is 4 bytes a weight")


def _gives(slip, args, got):
    try:
        return slip.wrong(*args) == got
    except Exception:  # a slip that does not apply to these inputs
        return False


# ------------------------------------------------------------------------------------------- chunked prefill

class _Recorder:
    """Stands in for the model and notes every forward call: which tokens, onto which caches, holding how many."""

    def __init__(self, model):
        self._model, self.calls = model, []
        self.config, self.tokenizer, self.weights = model.config, model.tokenizer, model.weights

    def new_cache(self, *args, **kwargs):
        return self._model.new_cache(*args, **kwargs)

    def forward(self, ids, caches=None):
        try:
            fed = [int(i) for i in ids]
        except Exception:  # not a sequence of ids: the model itself will say so
            fed = None
        try:  # the layer-0 cache stands for the list: a copy of the list still holds the same caches
            held, layer0 = (None, None) if caches is None else (len(caches[0]), id(caches[0]))
        except Exception:
            held, layer0 = None, None
        self.calls.append((fed, held, layer0))
        return self._model.forward(ids, caches)


@checker
def check_chunked_prefill(fn, model):
    """fn(model, ids, chunk) -> float32 [len(ids), vocab]: the logits of a prefill fed `chunk` tokens at a time
    onto one cache, checked against one pass over all the ids on the real model."""
    ids, full = _one_pass(model)
    for chunk in (4, 1, len(ids), 32):  # a short last chunk, decode-sized chunks, one chunk, a chunk too big
        _one_chunking(fn, model, ids, chunk, full)
    return passed(f"chunks of 4, 1, {len(ids)} and 32 tokens, each fed once and in order onto one cache, "
                  f"match one pass within {CHUNK_TOL:g}")


_ONE_PASS = weakref.WeakKeyDictionary()  # model -> (ids, logits): computed once per model, not once per check


def _one_pass(model):
    """The reference: 11 token ids and their logits from one pass, float32 [11, vocab]."""
    if model not in _ONE_PASS:
        ids = model.tokenizer.encode("A cache keeps the keys and values of every token it has seen.")[:11]
        _ONE_PASS[model] = (ids, model.forward(ids))
    ids, full = _ONE_PASS[model]
    return list(ids), full


def _one_chunking(fn, model, ids, chunk, full):
    case = f"{len(ids)} tokens in chunks of {chunk}"
    rec = _Recorder(model)
    got = run(fn, rec, list(ids), chunk, case=case)
    _check_calls(rec.calls, ids, chunk, case)
    got = as_array(got, case)
    if got.shape != full.shape:
        rows = got.shape[0] if got.ndim == 2 else got.shape
        reject(f"for {case} the result has {rows} rows; expected {len(ids)}, one per token ({full.shape})",
               "keep every chunk's logits and np.concatenate them, not only the last chunk's")
    if got.dtype != np.float32:
        reject(f"for {case} the logits are {got.dtype}; expected float32",
               "return the model's float32 logits as they are (a float64 buffer, or .astype(float), upcasts them)")
    err = float(np.abs(got.astype(np.float64) - full).max()) if got.size else 0.0
    if not err <= CHUNK_TOL:  # written this way round so that NaN fails
        if not np.isfinite(got).all():
            reject(f"for {case} your logits contain nan or inf",
                   "np.empty leaves whatever was in memory: fill every row, or np.concatenate the chunks' logits")
        reject(f"for {case} the logits differ from one pass by up to {err:.3g} (float32 rounding stays below "
               f"{CHUNK_TOL:g})", "feed the chunks in order, each exactly once, onto the one cache")


def _check_calls(calls, ids, chunk, case):
    n = len(ids)
    if not calls:
        reject(f"for {case} your function never called model.forward",
               "call model.forward(ids[i:i + chunk], cache) for each chunk; the checker watches those calls")
    if any(fed is None for fed, _, _ in calls):
        reject(f"for {case} a call to model.forward got something other than token ids",
               "pass a slice of the ids list: ids[i:i + chunk]")
    fed = [i for f, _, _ in calls for i in f]
    sizes = [len(f) for f, _, _ in calls]
    want = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    if len(fed) != n:
        reject(f"for {case} your function fed {len(fed)} tokens to the model in calls of {sizes}; expected {n}",
               "step through range(0, len(ids), chunk) so the last, shorter chunk is fed too, and each token once")
    if fed != list(ids):
        reject(f"for {case} your function fed the right number of tokens, but not in order",
               "the cache gives each token the position len(cache): feed ids[0:chunk], then ids[chunk:2*chunk], ...")
    if sizes != want:
        if len(sizes) == 1:
            reject(f"for {case} your function fed all {n} tokens in one call; expected calls of {want}",
                   "the point is to feed at most `chunk` tokens per call: model.forward(ids[i:i + chunk], cache) "
                   "for i in range(0, len(ids), chunk)")
        reject(f"for {case} your calls fed {sizes} tokens; expected {want}",
               "every call but the last takes exactly `chunk` tokens, the last takes what is left")
    first = calls[0][2]
    for i, (_, held, cid) in enumerate(calls):
        before = i * chunk
        if i > 0 and (cid is None or held in (None, 0)):
            reject(f"for {case}, call {i + 1} went onto an empty cache (or none), so its tokens sat at positions "
                   "0, 1, ... again and could not see the earlier chunks",
                   "create the cache once, before the loop, and pass the same one to every forward call")
        if cid is None and i == 0 and len(calls) > 1:
            reject(f"for {case} the first call had no cache, so nothing it computed was kept for the next chunk",
                   "create the cache before the loop (model.new_cache(capacity=len(ids))) and pass it to every call")
        if cid != first or (held is not None and held != before):
            reject(f"for {case}, call {i + 1} went onto a cache holding {held} tokens; expected {before}",
                   "one cache for the whole prefill: create it before the loop and pass the same one every time")
