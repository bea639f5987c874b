"""Checkers for lesson 05: bytes per token, grouped-query attention without copies, and the decode floor.

Every answer that differs from the reference is rejected. The slip tables below only choose the hint: the
first slip whose formula reproduces every answer the learner gave (the missing 2 for K and V, H where Hkv
belongs, d taken as D // H, bits for bytes, weights read once per sequence, ...). check_gqa_attention also
measures what the learner's function allocates, so a correct answer built on np.repeat copies of the KV heads
is told that it copied.
"""
import math
import tracemalloc

import numpy as np

from kvlesson import attention
from kvlesson.configs import ACCELERATORS, MODELS, Config
from kvlesson.costs.memory import decode_floor, kv_bytes, kv_bytes_per_token, weight_bytes
from kvlesson.teaching.verdict import Slip, as_array, as_number, checker, distinct_digits, passed, reject, run

__all__ = ["check_cache_bytes_per_token", "check_gqa_attention", "check_decode_floor"]


def _close(got, want):
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


def _explaining_slip(answers, slips):
    """The first Slip whose formula gives every answer (args, got); else the first that gives the first wrong one."""
    def gives(slip, args, got):
        try:
            wrong = slip.wrong(*args)
        except Exception:  # a slip that does not apply to these inputs (a config without D, say)
            return False
        return wrong is not None and _close(got, float(wrong))

    for slip in slips:
        if all(gives(slip, args, got) for args, got, _ in answers):
            return slip
    first_wrong = next(a for a in answers if not _close(a[1], a[2]))
    return next((s for s in slips if gives(s, first_wrong[0], first_wrong[1])), None)




def numeric_answers(fn, cases, reference):
    """Run fn on every case: [(args, got, want)], each got a finite number (else a NOT YET)."""
    answers = []
    for case, args in cases:
        got = as_number(run(fn, *args, case=case), case)
        answers.append((args, got, reference(*args)))
    return answers


def numeric_verdict(answers, cases, slips, unit, generic_hint, summary):
    wrong = [(a, case) for a, (case, _) in zip(answers, cases, strict=True) if not _close(a[1], a[2])]
    if not wrong:
        return passed(summary)
    (args, got, want), case = wrong[0]
    shown, expected = distinct_digits(got, want)
    problem = f"for {case} you return {shown} {unit}; expected {expected} {unit}"
    slip = _explaining_slip(answers, slips)
    if slip is not None:
        reject(f"{problem}: {slip.problem}", slip.hint)
    reject(problem, generic_hint)


# ---------------------------------------------------------------------------------------- bytes per token

_MQA = Config(name="a toy MQA model (4 layers, H=8, Hkv=1, d=16)", n_layers=4, H=8, Hkv=1, d=16, D=128, hidden=256,
              vocab=256)

_TOKEN_CASES = [  # (case, (spec, bytes per element))
    ("Llama 3.1 8B in bfloat16 (2 bytes per element)", (MODELS["Llama 3.1 8B"], 2)),
    ("Qwen2.5-7B in bfloat16 (2 bytes per element)", (MODELS["Qwen2.5-7B"], 2)),
    ("SmolLM2-135M in float32 (4 bytes per element)", (MODELS["SmolLM2-135M"], 4)),
    ("Llama 3.1 70B in fp8 (1 byte per element)", (MODELS["Llama 3.1 70B"], 1)),
    ("Llama 3.1 8B in int4 (0.5 bytes per element)", (MODELS["Llama 3.1 8B"], 0.5)),
    ("Qwen3-32B in bfloat16 (head_dim 128 set on its own; D // H = 80)", (MODELS["Qwen3-32B"], 2)),
    (f"{_MQA.name} in bfloat16", (_MQA, 2)),
]


def _per_token(spec, b):
    return 2 * spec.n_layers * spec.Hkv * spec.d * b


_TOKEN_SLIPS = [
    Slip("K only", lambda s, b: s.n_layers * s.Hkv * s.d * b, "that is half: K only, or V only",
         "every token stores a key AND a value in every layer, hence the factor 2"),
    Slip("query heads", lambda s, b: 2 * s.n_layers * s.H * s.d * b,
         "that is H / Hkv times too much: you counted query heads",
         "the cache stores only the Hkv KV heads; the H query heads are computed fresh each step and never cached"),
    Slip("query heads, no 2", lambda s, b: s.n_layers * s.H * s.d * b,
         "you counted query heads and forgot the factor 2",
         "the cache holds K and V (x 2) for the Hkv KV heads only, not the H query heads"),
    Slip("d = D // H", lambda s, b: 2 * s.n_layers * s.Hkv * (s.D // s.H) * b,
         "you took the head dim as D // H",
         "some configs set head_dim on its own: Qwen3-32B has hidden 5120 and 64 heads, but head_dim 128, not 80. "
         "Read spec.d, the head dim the K and V projections really produce"),
    Slip("bits", lambda s, b: 16 * s.n_layers * s.Hkv * s.d * b, "that is 8 times too much: bits, not bytes",
         "bytes_per_element is already in bytes (bfloat16 is 2); there is no 8 to multiply by"),
    Slip("divided by 8", lambda s, b: s.n_layers * s.Hkv * s.d * b / 4,
         "that is 8 times too little: you divided bytes by 8",
         "bytes_per_element is already in bytes (bfloat16 is 2); there is no 8 to divide by"),
    Slip("one layer", lambda s, b: 2 * s.Hkv * s.d * b, "that is one layer's worth",
         "every layer keeps its own K and V: multiply by n_layers"),
    Slip("G for Hkv", lambda s, b: 2 * s.n_layers * (s.H // s.Hkv) * s.d * b,
         "you used G = H // Hkv where Hkv belongs",
         "G is how many query heads share one KV head; the cache holds Hkv heads, each of d numbers, for K and V"),
    Slip("elements", lambda s, b: 2 * s.n_layers * s.Hkv * s.d, "you counted elements, not bytes",
         "multiply the element count by bytes_per_element"),
    Slip("model width", lambda s, b: 2 * s.n_layers * s.D * b, "you counted D numbers per layer for K and for V",
         "D is the model width; K and V are narrower under GQA: Hkv x d numbers each (H x d = D only for MHA)"),
]


@checker
def check_cache_bytes_per_token(fn):
    """fn(spec, bytes_per_element) -> bytes one token adds to the cache, over all layers, K and V."""
    answers = numeric_answers(fn, _TOKEN_CASES, _per_token)
    return numeric_verdict(answers, _TOKEN_CASES, _TOKEN_SLIPS, "B",
                       "multiply 2 (K and V) x n_layers x Hkv x d x bytes per element, and nothing else",
                       "2 x n_layers x Hkv x d x bytes: K and V, every layer, KV heads only, d as the config sets it")


# ------------------------------------------------------------------------------------- GQA attention

_GQA_CASES = [  # (case, H, Hkv, T, S, d, dtype)
    ("H=8 query heads over Hkv=2 KV heads, T=S=6, d=4", 8, 2, 6, 6, 4, np.float64),
    ("H=8, Hkv=2, T=3 new queries over S=7 keys", 8, 2, 3, 7, 4, np.float64),
    ("multi-head attention, H=Hkv=4, T=3, S=5", 4, 4, 3, 5, 4, np.float64),
    ("multi-query attention, H=6, Hkv=1, T=3, S=5", 6, 1, 3, 5, 4, np.float64),
    ("a decode step, H=6, Hkv=3, T=1, S=9", 6, 3, 1, 9, 8, np.float64),
    ("H=8, Hkv=2, T=3, S=7 in float32", 8, 2, 3, 7, 4, np.float32),
    ("no new queries, H=4, Hkv=2, T=0, S=5", 4, 2, 0, 5, 4, np.float64),
]

# A decode step where G copies of the cache dwarf everything attention needs: K and V are 2 MiB each,
# np.repeat writes 16 x that, the scores are [32, 1, 4096] (0.5 MiB).
_COPY_CASE = ("a decode step at H=32, Hkv=2, S=4,096, d=64 in float32", 32, 2, 1, 4096, 64, np.float32)


@checker
def check_gqa_attention(fn):
    """fn(q, k, v) -> [H, T, d]: q [H, T, d], k, v [Hkv, S, d]; query head h reads KV head h // G, no copies."""
    rng = np.random.default_rng(5)
    for case, H, Hkv, T, S, d, dtype in _GQA_CASES:
        q = rng.standard_normal((H, T, d)).astype(dtype)  # [H, T, d]
        k, v = (rng.standard_normal((Hkv, S, d)).astype(dtype) for _ in range(2))  # [Hkv, S, d]
        _gqa_case(fn, q, k, v, case)
    _copy_probe(fn, rng)
    return passed("query head h reads KV head h // G, over the offset causal mask, for MHA, GQA and MQA alike, "
                  "without copying the KV heads")


def _gqa_case(fn, q, k, v, case):
    H, T, d = q.shape
    inputs = (q.copy(), k.copy(), v.copy())
    got = as_array(run(fn, *inputs, case=case, crash_hint=lambda e: _gqa_crash_hint(fn, q, k, v, e)), case)
    for name, before, after in zip("qkv", (q, k, v), inputs, strict=True):
        if not np.array_equal(before, after):
            reject(f"for {case} your function changed {name} in place",
                   "the cache still needs its K and V after the step: build new arrays, don't write into them")
    want = attention(q, k, v)
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "the output has one row per query head: [H, T, d], whatever Hkv is; a grouped [Hkv, G, T, d] "
               "result reshapes back with .reshape(H, T, d)")
    if got.dtype != want.dtype:
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
               "something upcast float32 to float64: np.sqrt(d) is a float64 scalar under NumPy 2 (use "
               "math.sqrt(d)), and so are arrays made by np.full(..., -np.inf) or .astype(float)")
    tol = dict(rtol=1e-4, atol=1e-5) if q.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    if np.allclose(got, want, **tol):  # NaN is never close, so a NaN answer goes on to the diagnosis
        return
    for kk, mask, boost, problem, hint in _gqa_slips(q, k):
        if np.allclose(got, _attend(q, kk(k), kk(v), mask, boost), **tol):
            reject(f"for {case}: {problem}", hint)
    if not np.isfinite(got).all():
        reject(f"for {case} the result has nan or inf",
               "subtract each row's max before exp, and mask with -inf before the softmax, not after")
    bad_heads = [h for h in range(H) if not np.allclose(got[h], want[h], **tol)]
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} query heads {bad_heads} differ from the reference (max abs error {err:.3g})",
           "compare with the loop: for each h, attend q[h] over k[h // G] and v[h // G]")


def _gqa_slips(q, k):
    """(how K and V become [H, S, d], mask or None, score factor, problem, hint) for the classic mistakes."""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv

    def rep(a):
        return np.repeat(a, G, axis=0)

    slips = [(lambda a: np.tile(a, (G, 1, 1)), None, 1.0,
              f"query head h read KV head h % Hkv, not h // G: KV heads {(np.arange(H) % Hkv).tolist()} instead of "
              f"{(np.arange(H) // G).tolist()}",
              "reshaping q to [G, Hkv, T, d] (or np.tile(k, (G, 1, 1))) pairs head h with h % Hkv; the G query "
              "heads that share KV head g are neighbours, g*G .. g*G + G - 1, so reshape q to [Hkv, G, T, d]")]
    if T > 1:
        slips.append((rep, np.ones((T, S), bool), 1.0, "every query sees every key: there is no causal mask",
                      "query i sits at position S - T + i and may see key j only when j <= S - T + i"))
    if 1 < T < S:
        slips.append((rep, np.tril(np.ones((T, S), bool)), 1.0,
                      f"the first new query sees 1 key; it should see S - T + 1 = {S - T + 1} "
                      "(the mask is anchored top left)",
                      "np.tril(np.ones((T, S))) puts the diagonal at the top left; use kvlesson.causal_mask(T, S), "
                      "or np.tril(..., k=S - T), as in lesson 04"))
    slips.append((rep, None, math.sqrt(d), "it matches attention without the 1/sqrt(d) scale",
                  "divide the scores by math.sqrt(d) before the softmax"))
    slips.append((rep, None, 1 / math.sqrt(d), "it matches scores divided by d, not sqrt(d)",
                  "the scale is 1/sqrt(d), applied once"))
    return slips


def _attend(q, k, v, mask, boost):
    """Reference variants for diagnosis. k, v already [H, S, d]; mask [T, S] (None: offset causal)."""
    H, T, d = q.shape
    S = k.shape[1]
    if T == 0:
        return np.zeros(q.shape)
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1)) * (boost / math.sqrt(d))  # [H, T, S]
    if mask is None:
        mask = np.arange(S)[None, :] <= np.arange(S - T, S)[:, None]
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def _gqa_crash_hint(fn, q, k, v, e):
    H, T, _ = q.shape
    Hkv = k.shape[0]
    if T == 0:
        return "with no new queries there is nothing to attend over: return np.zeros_like(q), shape [H, 0, d]"
    if Hkv == H:
        return None
    G = H // Hkv
    rep = (q.copy(), np.repeat(k, G, axis=0), np.repeat(v, G, axis=0))
    try:
        again = np.asarray(fn(*rep), dtype=np.float64)
        works = again.shape == q.shape and np.allclose(again, attention(*rep), rtol=1e-4, atol=1e-5)
    except Exception:  # the learner's code, on inputs of our making: any failure means "no"
        works = False
    if works:
        return (f"your function works once K and V are copied up to H={H} heads, so it expects the cache to hold "
                f"H heads; it holds Hkv={Hkv}. Share them: query head h reads KV head h // G")
    return None


def _copy_probe(fn, rng):
    """Reject an answer that allocates G copies of K or V: measured with tracemalloc, which sees numpy's buffers."""
    case, H, Hkv, T, S, d, dtype = _COPY_CASE
    q = rng.standard_normal((H, T, d)).astype(dtype)  # [H, T, d]
    k, v = (rng.standard_normal((Hkv, S, d)).astype(dtype) for _ in range(2))  # [Hkv, S, d]
    G = H // Hkv
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        got = run(fn, q, k, v, case=case)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    got = as_array(got, case)
    if got.shape != q.shape or not np.allclose(got, attention(q, k, v), rtol=1e-4, atol=1e-5):
        reject(f"for {case} the result differs from the reference", "run your function on that case yourself")
    # One copy of K and V (a transpose made contiguous, say) is fine; G/2 copies of K alone is not.
    if peak > G * k.nbytes / 2:
        cache = k.nbytes + v.nbytes
        reject(f"for {case} your function allocated {peak / 2**20:.1f} MiB while it ran, {peak / cache:.0f} times "
               f"the K and V it reads: it copies the KV heads (G = {G} copies would be {G * cache / 2**20:.0f} MiB)",
               "np.repeat, np.tile, k[np.arange(H) // G] and a reshape of a broadcast all write copies. Share the "
               "heads instead: q.reshape(Hkv, G, T, d) against k[:, None] ([Hkv, 1, S, d]) broadcasts over G "
               "without a copy")


# ---------------------------------------------------------------------------------------- decode floor

_FLOOR_CASES = [  # (case, (spec, accelerator, context, batch))
    ("Llama 3.1 8B on H100 SXM, context 4,096, batch 1",
     (MODELS["Llama 3.1 8B"], ACCELERATORS["H100 SXM"], 4096, 1)),
    ("Llama 3.1 8B on H100 SXM, context 4,096, batch 16",
     (MODELS["Llama 3.1 8B"], ACCELERATORS["H100 SXM"], 4096, 16)),
    ("Llama 3.1 70B on A100 80GB SXM, context 8,192, batch 4",
     (MODELS["Llama 3.1 70B"], ACCELERATORS["A100 80GB SXM"], 8192, 4)),
    ("Qwen2.5-7B on RTX 4090, context 1,000, batch 8",
     (MODELS["Qwen2.5-7B"], ACCELERATORS["RTX 4090"], 1000, 8)),
    ("Qwen3-32B (head_dim 128, D // H = 80) on H100 SXM, context 32,768, batch 2",
     (MODELS["Qwen3-32B"], ACCELERATORS["H100 SXM"], 32768, 2)),
    ("SmolLM2-135M on Apple M4 Max (128 GB), context 0, batch 1",
     (MODELS["SmolLM2-135M"], ACCELERATORS["Apple M4 Max (128 GB)"], 0, 1)),
]


def _floor_ms(spec, accel, context, batch):
    return decode_floor(spec, accel, context, batch) * 1e3


def _ms(moved, accel):
    return moved / accel.bandwidth * 1e3


_FLOOR_SLIPS = [
    Slip("seconds", lambda s, a, c, b: _floor_ms(s, a, c, b) / 1e3, "that is in seconds",
         "bytes / (bytes/s) gives seconds; multiply by 1000 for milliseconds"),
    Slip("microseconds", lambda s, a, c, b: _floor_ms(s, a, c, b) * 1e3, "that is in microseconds",
         "multiply seconds by 1000, not 1e6"),
    Slip("weights per sequence", lambda s, a, c, b: _ms(b * weight_bytes(s) + kv_bytes(s, c, b), a),
         "you read the weights once per sequence",
         "one decode step reads each weight once and applies it to the whole batch: weights are shared, so batching "
         "amortises them; only the KV cache is per sequence"),
    Slip("no batch on KV", lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c), a),
         "the KV bytes are not multiplied by the batch",
         "every sequence has its own cache, and the step reads all of them"),
    Slip("no KV", lambda s, a, c, b: _ms(weight_bytes(s), a), "you left out the KV cache",
         "each step also reads every cached K and V: 2 x n_layers x Hkv x d x 2 bytes per token, per sequence"),
    Slip("no weights", lambda s, a, c, b: _ms(kv_bytes(s, c, b), a), "you left out the weights",
         "each step reads every weight once: params x 2 bytes in bf16"),
    Slip("one token of KV", lambda s, a, c, b: _ms(weight_bytes(s) + b * kv_bytes_per_token(s), a),
         "the KV term ignores the context",
         "the step reads the whole cache, context tokens of it per sequence, not one token's worth"),
    Slip("context + 1", lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c + 1, b), a),
         "you priced context + 1 tokens of cache",
         "the exercise prices the `context` tokens already in the cache, as kvlesson.costs.memory does; the new "
         "token's own key and value are computed in the step, not read back from memory. (One token is a tiny share "
         "of the bytes, which is why the two answers agree to several digits.)"),
    Slip("half the KV", lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c, b) / 2, a),
         "the KV term is half: K only, or V only",
         "the cache holds a key and a value per token per layer: the factor 2"),
    Slip("query heads", lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c, b) * s.H // s.Hkv, a),
         "the KV term counts query heads", "the cache holds Hkv KV heads, not H query heads"),
    Slip("d = D // H", lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c, b) * (s.D // s.H) / s.d, a),
         "the KV term takes the head dim as D // H",
         "Qwen3-32B sets head_dim 128 on its own (5120 / 64 would be 80): use spec.d"),
    Slip("1-byte weights", lambda s, a, c, b: _ms(weight_bytes(s) / 2 + kv_bytes(s, c, b), a),
         "the weights are counted at 1 byte each", "bf16 is 2 bytes per parameter: params x 2"),
]


@checker
def check_decode_floor(fn):
    """fn(spec, accel, context, batch) -> milliseconds per decode step, weights and cache in bf16 (2 bytes)."""
    answers = numeric_answers(fn, _FLOOR_CASES, _floor_ms)
    return numeric_verdict(answers, _FLOOR_CASES, _FLOOR_SLIPS, "ms",
                       "bytes moved = params x 2 + 2 x n_layers x Hkv x d x 2 x context x batch; "
                       "divide by accel.bandwidth (bytes/s) and multiply by 1000",
                       "(weights once + every sequence's K and V) / bandwidth, in milliseconds")
