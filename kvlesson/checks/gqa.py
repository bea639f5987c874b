"""Checkers for lesson 05: grouped-query attention, and the price of the cache in bytes.

Each one runs the learner's function on several cases and, when it disagrees with the reference, looks
for the classic mistake that explains every answer it gave: the missing 2 for K and V, H where Hkv belongs,
bits for bytes, np.tile where np.repeat belongs, weights read once per sequence instead of once per step.
"""
import math

import numpy as np

from kvlesson import attention
from kvlesson.checks._verdict import call, failed, passed
from kvlesson.configs import ACCELERATORS, MODELS, Config
from kvlesson.memory import decode_floor, kv_bytes, kv_bytes_per_token, weight_bytes

__all__ = ["check_cache_bytes_per_token", "check_gqa_attention", "check_decode_floor"]


def _explain(answers, wrong):
    """The first (problem, hint) whose formula reproduces every answer, or None.

    answers: [(args, got)]; wrong: [(formula, problem, hint)], formula(*args) -> what that mistake returns.
    """
    for formula, problem, hint in wrong:
        if all(_same(got, formula(*args)) for args, got in answers):
            return problem, hint
    return None


def _same(got, want, rel=1e-6):
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-9)


def _crash(bad, case):
    if "NotImplementedError" in bad.message:  # a student copy not filled in yet: call() already says what to do
        return bad
    first = bad.message.removeprefix("NOT YET: ").split("\n")[0]
    return failed(f"{first} (on {case})", "run it on that input yourself to see where")


def _number(got, case):
    """The learner's answer as a float, or a failed Verdict saying what came back instead."""
    try:
        value = float(got)
    except (TypeError, ValueError):
        return None, failed(f"for {case} your function returned {got!r}; expected a number",
                            "return the number itself (an int or a float), not a string, a list or None")
    if not math.isfinite(value):
        return None, failed(f"for {case} your function returned {value}", "the answer is a finite number")
    return value, None


# ---------------------------------------------------------------------------------------- bytes per token

_MQA = Config(name="a toy MQA model (4 layers, H=8, Hkv=1, d=16)", n_layers=4, H=8, Hkv=1, d=16, total_params=1e6)


def check_cache_bytes_per_token(fn):
    """fn(spec, bytes_per_element) -> bytes one token adds to the cache, over all layers, K and V."""
    cases = [(MODELS["Llama 3.1 8B"], 2, "bf16"), (MODELS["Qwen2.5-7B"], 2, "bf16"),
             (MODELS["SmolLM2-135M"], 4, "fp32"), (MODELS["Llama 3.1 70B"], 1, "fp8"),
             (MODELS["Llama 3.1 8B"], 0.5, "int4"), (_MQA, 2, "bf16")]
    answers = []
    for spec, b, dtype in cases:
        case = f"{spec.name} in {dtype} ({b} bytes per element)"
        got, bad = call(fn, spec, b)
        if bad is not None:
            return _crash(bad, case)
        value, bad = _number(got, case)
        if bad is not None:
            return bad
        answers.append(((spec, b), value, case))
    first_wrong = next((a for a in answers if not _same(a[1], _per_token(*a[0]))), None)
    if first_wrong is None:
        return passed("2 x n_layers x Hkv x d x bytes: K and V, every layer, KV heads only")
    found = _explain([(args, got) for args, got, _ in answers], _TOKEN_MISTAKES)
    (spec, b), got, case = first_wrong
    problem = f"for {case} you return {got:,.6g} B; expected {_per_token(spec, b):,} B"
    if found:
        return failed(f"{problem}: {found[0]}", found[1])
    return failed(problem, "multiply 2 (K and V) x n_layers x Hkv x d x bytes per element, and nothing else")


def _per_token(spec, b):
    return 2 * spec.n_layers * spec.Hkv * spec.d * b


_TOKEN_MISTAKES = [
    (lambda s, b: s.n_layers * s.Hkv * s.d * b, "that is half: K only, or V only",
     "every token stores a key AND a value in every layer, hence the factor 2"),
    (lambda s, b: 2 * s.n_layers * s.H * s.d * b, "that is H / Hkv times too much: you counted query heads",
     "the cache stores only the Hkv KV heads; the H query heads are computed fresh each step and never cached"),
    (lambda s, b: s.n_layers * s.H * s.d * b, "you counted query heads and forgot the factor 2",
     "the cache holds K and V (x 2) for the Hkv KV heads only, not the H query heads"),
    (lambda s, b: 16 * s.n_layers * s.Hkv * s.d * b, "that is 8 times too much: bits, not bytes",
     "bytes_per_element is already in bytes (bf16 is 2); there is no 8 to multiply by"),
    (lambda s, b: s.n_layers * s.Hkv * s.d * b / 4, "that is 8 times too little: you divided bytes by 8",
     "bytes_per_element is already in bytes (bf16 is 2); there is no 8 to divide by"),
    (lambda s, b: 2 * s.Hkv * s.d * b, "that is one layer's worth",
     "every layer keeps its own K and V: multiply by n_layers"),
    (lambda s, b: 2 * s.n_layers * (s.H // s.Hkv) * s.d * b, "you used G = H // Hkv where Hkv belongs",
     "G is how many query heads share one KV head; the cache holds Hkv heads, each of d numbers, for K and V"),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d, "you counted elements, not bytes",
     "multiply the element count by bytes_per_element"),
]


# ------------------------------------------------------------------------------------- GQA attention

def check_gqa_attention(fn):
    """fn(q, k, v) -> [H, T, d]: q [H, T, d], k, v [Hkv, S, d]; query head h reads KV head h // G."""
    rng = np.random.default_rng(5)
    cases = [("H=8 query heads over Hkv=2 KV heads, T=S=6, d=4", 8, 2, 6, 6, 4, np.float64),
             ("H=8, Hkv=2, T=3 new queries over S=7 keys", 8, 2, 3, 7, 4, np.float64),
             ("multi-head attention, H=Hkv=4, T=3, S=5", 4, 4, 3, 5, 4, np.float64),
             ("multi-query attention, H=6, Hkv=1, T=3, S=5", 6, 1, 3, 5, 4, np.float64),
             ("a decode step, H=6, Hkv=3, T=1, S=9", 6, 3, 1, 9, 8, np.float64),
             ("H=8, Hkv=2, T=3, S=7 in float32", 8, 2, 3, 7, 4, np.float32),
             ("no new queries, H=4, Hkv=2, T=0, S=5", 4, 2, 0, 5, 4, np.float64)]
    for case, H, Hkv, T, S, d, dtype in cases:
        q = rng.standard_normal((H, T, d)).astype(dtype)  # [H, T, d]
        k, v = (rng.standard_normal((Hkv, S, d)).astype(dtype) for _ in range(2))  # [Hkv, S, d]
        problem = _gqa_case(fn, q, k, v, case)
        if problem is not None:
            return problem
    return passed("query head h reads KV head h // G, over the offset causal mask, for MHA, GQA and MQA alike")


def _gqa_case(fn, q, k, v, case):
    H, T, d = q.shape
    Hkv = k.shape[0]
    inputs = (q.copy(), k.copy(), v.copy())
    with np.errstate(all="ignore"):
        got, bad = call(fn, *inputs)
    if bad is not None:
        return _gqa_crash(fn, q, k, v, bad, case)
    for name, before, after in zip("qkv", (q, k, v), inputs, strict=True):
        if not np.array_equal(before, after):
            return failed(f"for {case} your function changed {name} in place",
                          "the cache still needs its K and V after the step: build new arrays, don't write into them")
    got = np.asarray(got)
    want = attention(q, k, v)
    if got.shape != want.shape:
        return failed(f"for {case} the result has shape {got.shape}; expected {want.shape}",
                      "the output has one row per query head: [H, T, d], whatever Hkv is; a grouped [Hkv, G*T, d] "
                      "result reshapes back with .reshape(H, T, d)")
    if got.dtype != want.dtype:
        return failed(f"for {case} the result is {got.dtype}; expected {want.dtype}",
                      "something upcast float32 to float64: np.sqrt(d) is a float64 scalar under NumPy 2 (use "
                      "math.sqrt(d)), and so are arrays made by np.full(..., -np.inf) or .astype(float)")
    tol = dict(rtol=1e-4, atol=1e-5) if q.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    if np.allclose(got, want, **tol) or T == 0:
        return None
    G = H // Hkv
    wrong = [(np.tile(k, (G, 1, 1)), np.tile(v, (G, 1, 1)), None, 1.0,
              f"query head h read KV head h % Hkv, not h // G: KV heads {(np.arange(H) % Hkv).tolist()} "
              f"instead of {(np.arange(H) // G).tolist()}",
              "np.tile(k, (G, 1, 1)) stacks whole copies (0, 1, 0, 1, ...), and so does reshaping q to [G, Hkv, T, d]; "
              "np.repeat(k, G, axis=0) repeats each head in place (0, 0, 1, 1, ...), and q.reshape(Hkv, G * T, d) "
              "groups the G query heads that share one KV head")]
    rep_k, rep_v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)  # [H, S, d]
    S = k.shape[1]
    if T > 1:
        wrong.append((rep_k, rep_v, np.ones((T, S), bool), 1.0, "every query sees every key: there is no causal mask",
                      "query i sits at position S - T + i and may see key j only when j <= S - T + i"))
    if 1 < T < S:
        wrong.append((rep_k, rep_v, np.tril(np.ones((T, S), bool)), 1.0,
                      f"the first new query sees 1 key; it should see S - T + 1 = {S - T + 1} "
                      "(the mask is anchored top left)",
                      "np.tril(np.ones((T, S))) puts the diagonal at the top left; use k=S - T, or "
                      "kvlesson.causal_mask(T, S), as in lesson 04"))
    wrong.append((rep_k, rep_v, None, math.sqrt(d), "it matches attention without the 1/sqrt(d) scale",
                  "divide the scores by math.sqrt(d) before the softmax"))
    for kk, vv, mask, boost, problem, hint in wrong:
        if np.allclose(got, _attend(q, kk, vv, mask, boost), **tol):
            return failed(f"for {case}: {problem}", hint)
    bad_heads = [h for h in range(H) if not np.allclose(got[h], want[h], **tol)]
    return failed(f"for {case} query heads {bad_heads} differ from the reference "
                  f"(max abs error {np.abs(got.astype(np.float64) - want).max():.3g})",
                  "compare with the loop: for each h, attend q[h] over k[h // G] and v[h // G]")


def _attend(q, k, v, mask, boost):
    """Reference variants for diagnosis. k, v already [H, S, d]; mask [T, S] (None: offset causal)."""
    H, T, d = q.shape
    S = k.shape[1]
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1)) * (boost / math.sqrt(d))  # [H, T, S]
    if mask is None:
        mask = np.arange(S)[None, :] <= np.arange(S - T, S)[:, None]
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def _gqa_crash(fn, q, k, v, bad, case):
    H, T, _ = q.shape
    Hkv = k.shape[0]
    first = bad.message.removeprefix("NOT YET: ").split("\n")[0]
    if T == 0:
        return failed(f"for {case}: {first}",
                      "with no new queries there is nothing to attend over: return np.zeros_like(q), shape [H, 0, d]")
    if Hkv != H:
        G = H // Hkv
        rep = (q, np.repeat(k, G, axis=0), np.repeat(v, G, axis=0))
        with np.errstate(all="ignore"):
            got, again = call(fn, *rep)
        if again is None and np.shape(got) == q.shape and np.allclose(got, attention(*rep), rtol=1e-4, atol=1e-5):
            return failed(f"for {case}: {first}",
                          f"your function works once K and V are copied up to H={H} heads, so it expects the cache "
                          f"to hold H heads; it holds Hkv={Hkv}. Share them: query head h reads KV head h // G")
    return _crash(bad, case)


# ---------------------------------------------------------------------------------------- decode floor

def check_decode_floor(fn):
    """fn(spec, accel, context, batch) -> milliseconds per decode step, weights and cache in bf16 (2 bytes)."""
    cases = [(MODELS["Llama 3.1 8B"], ACCELERATORS["H100 SXM"], 4096, 1),
             (MODELS["Llama 3.1 8B"], ACCELERATORS["H100 SXM"], 4096, 16),
             (MODELS["Llama 3.1 70B"], ACCELERATORS["A100 80GB SXM"], 8192, 4),
             (MODELS["Qwen2.5-7B"], ACCELERATORS["RTX 4090"], 1000, 8),
             (MODELS["SmolLM2-135M"], ACCELERATORS["Apple M4 Max (128 GB)"], 0, 1)]
    answers = []
    for spec, accel, context, batch in cases:
        case = f"{spec.name} on {accel.name}, context {context:,}, batch {batch}"
        got, bad = call(fn, spec, accel, context, batch)
        if bad is not None:
            return _crash(bad, case)
        value, bad = _number(got, case)
        if bad is not None:
            return bad
        answers.append(((spec, accel, context, batch), value, case))
    first_wrong = next((a for a in answers if not _same(a[1], _floor_ms(*a[0]))), None)
    if first_wrong is None:
        return passed("(weights once + every sequence's K and V) / bandwidth, in milliseconds")
    found = _explain([(args, got) for args, got, _ in answers], _FLOOR_MISTAKES)
    args, got, case = first_wrong
    problem = f"for {case} you return {got:.4g} ms; expected {_floor_ms(*args):.4g} ms"
    if found:
        return failed(f"{problem}: {found[0]}", found[1])
    return failed(problem, "bytes moved = params x 2 + 2 x n_layers x Hkv x d x 2 x context x batch; "
                           "divide by accel.bandwidth (bytes/s) and multiply by 1000")


def _floor_ms(spec, accel, context, batch):
    return decode_floor(spec, accel, context, batch) * 1e3


def _ms(moved, accel):
    return moved / accel.bandwidth * 1e3


_FLOOR_MISTAKES = [
    (lambda s, a, c, b: _floor_ms(s, a, c, b) / 1e3, "that is in seconds",
     "bytes / (bytes/s) gives seconds; multiply by 1000 for milliseconds"),
    (lambda s, a, c, b: _floor_ms(s, a, c, b) * 1e3, "that is in microseconds", "multiply seconds by 1000, not 1e6"),
    (lambda s, a, c, b: _ms(b * weight_bytes(s) + kv_bytes(s, c, b), a),
     "you read the weights once per sequence",
     "one decode step reads each weight once and applies it to the whole batch: weights are shared, so batching "
     "amortises them; only the KV cache is per sequence"),
    (lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c), a), "the KV bytes are not multiplied by the batch",
     "every sequence has its own cache, and the step reads all of them"),
    (lambda s, a, c, b: _ms(weight_bytes(s), a), "you left out the KV cache",
     "each step also reads every cached K and V: 2 x n_layers x Hkv x d x 2 bytes per token, per sequence"),
    (lambda s, a, c, b: _ms(kv_bytes(s, c, b), a), "you left out the weights",
     "each step reads every weight once: params x 2 bytes in bf16"),
    (lambda s, a, c, b: _ms(weight_bytes(s) + b * kv_bytes_per_token(s), a), "the KV term ignores the context",
     "the step reads the whole cache, context tokens of it per sequence, not one token's worth"),
    (lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c, b) / 2, a), "the KV term is half: K only, or V only",
     "the cache holds a key and a value per token per layer: the factor 2"),
    (lambda s, a, c, b: _ms(weight_bytes(s) + kv_bytes(s, c, b) * s.H // s.Hkv, a),
     "the KV term counts query heads",
     "the cache holds Hkv KV heads, not H query heads"),
    (lambda s, a, c, b: _ms(weight_bytes(s) / 2 + kv_bytes(s, c, b), a),
     "the weights are counted at 1 byte each", "bf16 is 2 bytes per parameter: params x 2"),
]
