"""Checkers for lesson 01: a stable softmax, and causal attention for a prefill.

Each runs the learner's function on seeded cases and rejects any answer that differs from the reference, which
each checker carries as `.reference` (later cells of a lesson fall back on it, through yours_or_ours, while the
exercise is unsolved).
To say why, it then compares the answer with the classic slips (no max subtraction, a shift by the first
score, the wrong axis, a missing keepdims, an upcast to float64) and, for attention, probes which keys each
query reads, whether the weights sum to 1 and which scale was used.
"""
import math

import numpy as np

from kvlesson import attention
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_softmax", "check_attention"]


def _softmax(s):
    """[..., S] -> [..., S]: the reference, normalised over the last axis."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------- softmax

_OVERFLOW = ("exp(1000) overflows (float64 tops out near exp(709.8)) and inf/inf is nan; subtract each row's max "
             "before exp: softmax does not change when a row is shifted, and then the largest exp is 1")

_SOFTMAX_SLIPS = [  # a min shift passes "scores near 1000" and fails only where the no-max slip also would: first
    Slip("shift by the row's min", lambda s: _softmax_shifted(s, s.min(axis=-1, keepdims=True)),
         "for {case} your result has nan or inf",
         "subtract the row's max, not its min: after s - min every exponent is >= 0, and the largest still overflows"),
    Slip("no max subtraction", lambda s: np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True),
         "for {case} your result has nan or inf", _OVERFLOW),
    Slip("shift by the first score", lambda s: _softmax_shifted(s, s[..., :1]),
         "for {case} your result has nan or inf",
         "shifting by the first score (s - s[..., :1]) only helps when the first score is the largest; in a row "
         "like [0, 1000] it leaves exp(1000), which overflows. Subtract the row's max: then every exponent is <= 0"),
    Slip("shift by the global max", lambda s: _softmax_shifted(s, s.max()),
         "for {case} your result has nan or inf",
         "subtracting one global max (s.max()) pushes the row near 0 down to about -1000, where exp underflows to 0 "
         "and 0/0 is nan; subtract each row's own max (axis=-1, keepdims=True)"),
    Slip("divide by the whole sum", lambda s: np.exp(s - s.max(axis=-1, keepdims=True))
         / np.exp(s - s.max(axis=-1, keepdims=True)).sum(),
         "for {case} the whole array sums to 1, but each row must",
         "divide by the sum over the last axis, with keepdims=True, not by p.sum()"),
    Slip("normalise axis 0", lambda s: _softmax_axis(s, 0),
         "for {case} the rows do not sum to 1",
         "normalise over the last axis (axis=-1, the keys), with keepdims=True on the max and the sum so each row "
         "is divided by its own total"),
    Slip("normalise axis 1", lambda s: _softmax_axis(s, 1) if s.ndim > 2 else None,
         "for {case} the rows do not sum to 1",
         "axis=1 is the last axis only for a 2-D array; scores are [H, T, S], so normalise over axis=-1"),
    Slip("-inf replaced before exp", lambda s: _softmax(np.where(np.isneginf(s), 0.0, s)),
         "for {case} a score of -inf got a nonzero weight",
         "exp(-inf) is exactly 0; do not replace -inf before the exponent"),
    Slip("no division", lambda s: np.exp(s - s.max(axis=-1, keepdims=True)),
         "for {case} the rows do not sum to 1",
         "after the exp, divide each row by its own sum: e / e.sum(axis=-1, keepdims=True)"),
]


def _softmax_shifted(s, shift):
    e = np.exp(s - shift)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_axis(s, axis):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_cases():
    rng = np.random.default_rng(1)
    mixed = np.stack([rng.standard_normal(5) + 1000.0, rng.standard_normal(5)])  # one row near 1000, one near 0
    masked = rng.standard_normal((3, 5))
    masked[0, 3:] = -np.inf  # scores a mask removed: their weight must be exactly 0
    masked[1, 1:] = -np.inf
    return [
        ("a [3, 5] array", rng.standard_normal((3, 5))),
        ("a [2, 3, 5] array (heads, queries, keys)", rng.standard_normal((2, 3, 5))),
        ("a square [4, 4] array", rng.standard_normal((4, 4))),
        ("a float32 [3, 5] array", rng.standard_normal((3, 5)).astype(np.float32)),
        ("scores near 1000", rng.standard_normal((3, 5)) + 1000.0),
        ("two rows, one near 1000 and one near 0", mixed),
        ("the row [0, 1000] (largest score last)", np.array([[0.0, 1000.0], [1000.0, 0.0]])),
        ("rows with -inf (masked) entries", masked),
        ("a [0, 5] array (no rows)", np.zeros((0, 5))),
    ]


@checker
def check_softmax(fn):
    """fn(s) -> softmax of s over its last axis, same shape and dtype as s."""
    for case, s in _softmax_cases():
        given = s.copy()
        result = run(fn, given, case=case, crash_hint=_softmax_crash_hint)
        if not np.array_equal(given, s, equal_nan=True):
            reject(f"for {case} your softmax changed its input in place",
                   "s -= s.max(...) rewrites the caller's scores, which they may still need; write e = np.exp(s - "
                   "s.max(...)), which builds a new array")
        if isinstance(result, (list, tuple)):
            reject(f"for {case} your softmax returned a {type(result).__name__}",
                   "return a numpy array: a list has no dtype, so float32 in could not come out float32")
        got = as_array(result, case)
        _softmax_verdict(got, _softmax(s), s, case)
    return passed("your softmax is stable, normalises the last axis and keeps the dtype")


check_softmax.reference = _softmax


def _softmax_crash_hint(e):
    if "broadcast" in str(e):
        return ("s.max(axis=-1) drops the last axis; keepdims=True keeps it as size 1, so it lines up with each "
                "row")
    return None


def _softmax_verdict(got, want, s, case):
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "softmax returns one weight per score: keep the input's shape (keepdims=True on the sums)")
    if got.dtype != want.dtype:
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
               "something upcast the array to float64 (np.float64(...) or .astype); float32 in, float32 out")
    if np.allclose(got, want, rtol=1e-5, atol=1e-7):
        return
    slip = first_slip(got, _SOFTMAX_SLIPS, (s,))
    if slip is not None:
        reject_slip(slip, case)
    if not np.isfinite(got).all():
        reject(f"for {case} your result has nan or inf", _OVERFLOW)
    sums = got.astype(np.float64).sum(axis=-1)
    if sums.size and not np.allclose(sums, 1.0, atol=1e-5):
        reject(f"for {case} the rows sum to {np.round(sums.ravel()[:4], 3).tolist()}, not 1",
               "normalise over the last axis (axis=-1, the keys), with keepdims=True on the max and the sum so each "
               "row is divided by its own total")
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} the values differ from the reference softmax (max abs error {err:.3g})",
           "softmax(s) = exp(s - max) / sum(exp(s - max)), over the last axis")


# -------------------------------------------------------------------------------------------- attention

@checker
def check_attention(fn):
    """fn(q, k, v) -> causal attention for a prefill: q, k, v [H, T, d] -> [H, T, d]."""
    rng = np.random.default_rng(2)
    cases = [
        ("H=2, T=6, d=4 (float64)", 2, 6, 4, np.float64, 1.0),
        ("H=2, T=6, d=4 in float32", 2, 6, 4, np.float32, 1.0),
        ("one head and one token (H=1, T=1, d=4)", 1, 1, 4, np.float64, 1.0),
        ("H=3, T=5, d=8", 3, 5, 8, np.float64, 1.0),
        ("large scores (q and k scaled by 40)", 2, 6, 4, np.float64, 40.0),
        ("an empty prompt (H=2, T=0, d=4)", 2, 0, 4, np.float64, 1.0),
    ]
    for case, H, T, d, dtype, size in cases:
        q, k = (rng.standard_normal((H, T, d)) * size for _ in range(2))  # [H, T, d]
        v = rng.standard_normal((H, T, d))
        q, k, v = (a.astype(dtype) for a in (q, k, v))
        _attention_case(fn, q, k, v, case, probe=size == 1)
    return passed("your attention is causal, scaled by 1/sqrt(d), normalised over the keys and keeps the dtype")


check_attention.reference = attention


def _attention_case(fn, q, k, v, case, probe):
    T = q.shape[1]
    inputs = (q.copy(), k.copy(), v.copy())
    result = run(fn, *inputs, case=case, crash_hint=lambda e: _attention_crash_hint(e, T))
    if isinstance(result, (list, tuple)):
        reject(f"for {case} your function returned a {type(result).__name__}",
               "return a numpy array: a list has no dtype, so float32 in could not come out float32")
    got = as_array(result, case)
    for name, before, after in zip("qkv", (q, k, v), inputs, strict=True):
        if not np.array_equal(before, after):
            reject(f"for {case} your function changed {name} in place",
                   "write s = s / ... rather than s /= ... on a view of the inputs; the caller still needs them")
    want = attention(q, k, v)
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "weights [H, T, S] @ v [H, S, d] -> [H, T, d]")
    if got.dtype != want.dtype:
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
               "np.sqrt(d) is a float64 NumPy scalar and upcasts float32 arrays under NumPy 2 (so do "
               "np.full(..., -np.inf) and .astype(float)); divide by math.sqrt(d) or d ** 0.5 instead")
    tol = dict(rtol=1e-4, atol=1e-5) if q.dtype == np.float32 else dict(rtol=1e-7, atol=1e-9)
    if np.allclose(got, want, **tol):
        return
    slip = first_slip(got, _ATTENTION_SLIPS, (q, k, v))
    if slip is not None:
        reject_slip(slip, case)
    if not np.isfinite(got).all():
        _attention_nan(got, case)
    if probe:  # with huge scores some weights underflow to 0 and the probes would misread them
        _visibility_problem(fn, q, k, v, got, case)
        _row_sum_problem(fn, q, k, case)
        _scale_problem(got, q, k, v, case, tol)
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} the values differ from the reference (max abs error {err:.3g})",
           "scores q @ k^T / sqrt(d), masked with -inf above the diagonal, softmax over the keys, then @ v")


def _mask_after_softmax(q, k, v):
    """Softmax over every key, then the future zeroed and the rows renormalised: equal on paper, not in floats."""
    T = q.shape[1]
    p = _softmax(q @ k.transpose(0, 2, 1) * (1 / math.sqrt(q.shape[-1]))) * np.tril(np.ones((T, T), q.dtype))
    return p / p.sum(axis=-1, keepdims=True) @ v


_ATTENTION_SLIPS = [
    Slip("weights times k", lambda q, k, v: attention(q, k, k),
         "for {case} your output matches the weights multiplied by k",
         "the weights blend the values: p @ v, not p @ k"),
    Slip("scores q . q", lambda q, k, v: attention(q, q, v),
         "for {case} your output matches scores q @ q^T",
         "score each query against the keys: s = q @ k.transpose(0, 2, 1), not q against itself"),
    Slip("mask after the softmax", _mask_after_softmax,
         "for {case} your output matches a softmax over every key, masked and renormalised afterwards",
         "mask before the softmax: with the future still in the row, its scores set the max and take the weight; "
         "with large scores the visible keys underflow to 0 and 0/0 is nan. np.where(mask, s, -np.inf) first"),
]


def _attention_crash_hint(e, T):
    text = str(e)
    if T == 0:
        return ("with no queries there is nothing to attend over: return np.zeros_like(q), shape [H, 0, d] "
                "(the max over an empty row has no value)")
    if "matmul" in text or "shapes" in text or "broadcast" in text:
        return ("scores are q @ k.transpose(0, 2, 1): [H, T, d] @ [H, d, S] -> [H, T, S]; note k.T reverses "
                "all three axes, and the mask [T, S] broadcasts over the heads")
    return None


def _attention_nan(got, case):
    rows = np.where(~np.isfinite(got).all(axis=(0, 2)))[0].tolist()
    if case.startswith("large"):
        reject(f"for {case} your output has nan or inf",
               "scores this large overflow exp; subtract each row's max before exp (your softmax should)")
    reject(f"for {case} the outputs of queries {rows} are nan",
           "a query that sees no key has a row of -inf scores, and softmax of that is 0/0; every query must "
           "see its own key: keep key j where j <= i (np.tril keeps the diagonal), as in np.where(mask, s, -np.inf)")


def _visible(fn, q, k, v, base):
    """[T, S] bool: which keys each query of the learner's function actually reads; None if it cannot tell."""
    T, S = q.shape[1], k.shape[1]
    seen = np.zeros((T, S), bool)
    for j in range(S):
        v2 = v.copy()
        v2[:, j] += 1  # nudge one value: every query whose weight on key j is nonzero moves
        out = as_array(run(fn, q.copy(), k.copy(), v2, case="a probe"), "a probe")
        if out.shape != base.shape:
            return None
        seen[:, j] = (np.abs(out - base) > 1e-9).any(axis=(0, 2))
    return seen


def _visibility_problem(fn, q, k, v, got, case):
    T = q.shape[1]
    seen = _visible(fn, q, k, v, got)
    if seen is None or T < 2:
        return
    want = np.tril(np.ones((T, T), bool))
    if (seen == want).all():
        return
    if not seen.any():
        reject(f"for {case} changing any value leaves your output as it was: it does not depend on v",
               "the output is the weights times the values: softmax(...) @ v")
    n0, nlast = int(seen[0].sum()), int(seen[-1].sum())
    if seen.all():
        reject(f"for {case} query 0 reads all {T} keys; it should read 1 (itself): the future leaks in",
               "mask the scores before the softmax: np.where(mask, s, -np.inf) with mask[i, j] = j <= i. "
               "A score multiplied by 0 is not masked: it still gets weight exp(0)")
    if (seen == want.T).all():
        reject(f"for {case} query 0 reads {n0} keys and query {T - 1} reads {nlast}; it should be 1 and {T}",
               "the mask is upside down: query i may see keys 0..i, the lower triangle (np.tril, j <= i), not np.triu")
    i = next(i for i in range(T) if (seen[i] != want[i]).any())
    reject(f"for {case} query {i} reads keys {np.flatnonzero(seen[i]).tolist()}; it should read 0..{i}",
           "query i may see key j exactly when j <= i")


def _row_sum_problem(fn, q, k, case):
    ones = np.ones_like(k)
    out = as_array(run(fn, q.copy(), k.copy(), ones, case="a probe"), "a probe")
    if out.shape != q.shape or np.allclose(out, 1.0):
        return
    reject(f"for {case}, with every value set to 1 your output ranges from {out.min():.3g} to {out.max():.3g}; "
           "it should be exactly 1, because each query's weights sum to 1",
           "softmax over the last axis (the keys, axis=-1), after the mask: the -inf go in before the exp, so "
           "masked keys get weight 0 and the rest still sum to 1")


def _scale_problem(got, q, k, v, case, tol):
    d = q.shape[-1]
    r = math.sqrt(d)
    guesses = [(r, "it matches attention without the 1/sqrt(d) scale",
                "divide the scores by sqrt(d) before the softmax; without it they grow like sqrt(d) and the softmax "
                "saturates"),
               (1 / r, "it matches scores divided by d, not sqrt(d)",
                "the std of q . k for unit-variance entries is sqrt(d), so the scale is 1/sqrt(d) (applied once)"),
               (d, "it matches scores multiplied by sqrt(d), not divided",
                "scale the scores by 1/sqrt(d): s = q @ k.transpose(0, 2, 1) / math.sqrt(d)")]
    for factor, problem, hint in guesses:
        # scaling q by factor scales every score by factor: the reference with that scale, no new code
        if np.allclose(got, attention(q * q.dtype.type(factor), k, v), **tol):
            reject(f"for {case} {problem}", hint)
