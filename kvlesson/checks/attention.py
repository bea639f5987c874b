"""Checkers for lesson 01: a stable softmax, and causal attention for a prefill.

Each one runs the learner's function on seeded cases and, when it disagrees with the reference,
probes it to say which classic mistake it made: no max subtraction, the wrong axis, a missing
keepdims, an upcast to float64, no mask, a mask upside down, a missing 1/sqrt(d).
"""
import math

import numpy as np

from kvlesson import attention
from kvlesson.checks._verdict import call, compare, failed, passed

__all__ = ["check_softmax", "check_attention"]


def _softmax(s):
    """[..., S] -> [..., S]: the reference, normalised over the last axis."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _run(fn, *args):
    """Call the learner's function with numpy's overflow warnings silenced: the checker reports them."""
    with np.errstate(all="ignore"):
        got, bad = call(fn, *args)
    if bad is None and got is None:
        bad = failed("your function returned None", "is the return statement missing?")
    elif bad is None:
        got = np.asarray(got)
    return got, bad


# ---------------------------------------------------------------------------------------------- softmax

def check_softmax(fn):
    """fn(s) -> softmax of s over its last axis, same shape and dtype as s."""
    rng = np.random.default_rng(1)
    mixed = np.stack([rng.standard_normal(5) + 1000.0, rng.standard_normal(5)])  # one row near 1000, one near 0
    masked = rng.standard_normal((3, 5))
    masked[0, 3:] = -np.inf  # scores a mask removed: their weight must be exactly 0
    masked[1, 1:] = -np.inf
    cases = [
        ("a [3, 5] array", rng.standard_normal((3, 5))),
        ("a [2, 3, 5] array (heads, queries, keys)", rng.standard_normal((2, 3, 5))),
        ("a square [4, 4] array", rng.standard_normal((4, 4))),
        ("a float32 [3, 5] array", rng.standard_normal((3, 5)).astype(np.float32)),
        ("scores near 1000", rng.standard_normal((3, 5)) + 1000.0),
        ("two rows, one near 1000 and one near 0", mixed),
        ("rows with -inf (masked) entries", masked),
        ("a [0, 5] array (no rows)", np.zeros((0, 5))),
    ]
    for case, s in cases:
        got, bad = _run(fn, s.copy())
        if bad is not None:
            return _softmax_crash(bad, case)
        want = _softmax(s)
        problem = _softmax_diagnosis(got, want, s, case)
        if problem is not None:
            return problem
    return passed("your softmax is stable, normalises the last axis and keeps the dtype")


def _softmax_crash(bad, case):
    if not bad.message.startswith("NOT YET: your function raised"):
        return bad  # already specific: not written yet, or no return
    if "broadcast" in bad.message:
        return failed(f"for {case} your softmax raised a broadcasting error",
                      "s.max(axis=-1) drops the last axis; keepdims=True keeps it as size 1, so it lines up with "
                      "each row")
    return failed(bad.message.removeprefix("NOT YET: ").split("\n")[0] + f" (on {case})",
                  "run it on that input yourself to see where")


def _softmax_diagnosis(got, want, s, case):
    if got.shape != want.shape:
        return failed(f"for {case} the result has shape {got.shape}; expected {want.shape}",
                      "softmax returns one weight per score: keep the input's shape (keepdims=True on the sums)")
    if got.dtype != want.dtype:
        return failed(f"for {case} the result is {got.dtype}; expected {want.dtype}",
                      "something upcast the array to float64 (np.float64(...) or .astype); float32 in, float32 out")
    if not np.isfinite(got).all():
        if case.startswith("two rows"):
            return failed(f"for {case} your result has nan or inf",
                          "subtracting one global max (s.max()) pushes the row near 0 down to about -1000, where exp "
                          "underflows to 0 and 0/0 is nan; subtract each row's own max (axis=-1, keepdims=True)")
        return failed(f"for {case} your result has nan or inf",
                      "exp(1000) overflows (float64 tops out near exp(709.8)) and inf/inf is nan; subtract each row's "
                      "max before exp: softmax does not change when a row is shifted, and then the largest exp is 1")
    sums = got.astype(np.float64).sum(axis=-1)
    if sums.size and not np.allclose(sums, 1.0, atol=1e-5):
        if np.isclose(got.sum(), 1.0):
            return failed(f"for {case} the whole array sums to 1, but each row must",
                          "divide by the sum over the last axis, with keepdims=True, not by p.sum()")
        return failed(f"for {case} the rows sum to {np.round(sums.ravel()[:4], 3).tolist()}, not 1",
                      "normalise over the last axis (axis=-1, the keys), with keepdims=True on the max and the sum "
                      "so each row is divided by its own total")
    if np.isneginf(s).any() and np.abs(got[np.isneginf(s)]).max() > 0:
        return failed(f"for {case} a score of -inf got a nonzero weight",
                      "exp(-inf) is exactly 0; do not replace -inf before the exponent")
    return compare(got, want, case, rtol=1e-5, atol=1e-7)


# -------------------------------------------------------------------------------------------- attention

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
        problem = _attention_case(fn, q, k, v, case, probe=size == 1)
        if problem is not None:
            return problem
    return passed("your attention is causal, scaled by 1/sqrt(d), normalised over the keys and keeps the dtype")


def _attention_case(fn, q, k, v, case, probe):
    T = q.shape[1]
    inputs = (q.copy(), k.copy(), v.copy())
    got, bad = _run(fn, *inputs)
    if bad is not None:
        return _attention_crash(bad, case, T)
    for name, before, after in zip("qkv", (q, k, v), inputs, strict=True):
        if not np.array_equal(before, after):
            return failed(f"for {case} your function changed {name} in place",
                          "write s = s / ... rather than s /= ... on a view of the inputs; the caller still needs them")
    want = attention(q, k, v)
    if got.shape != want.shape:
        return failed(f"for {case} the result has shape {got.shape}; expected {want.shape}",
                      "weights [H, T, S] @ v [H, S, d] -> [H, T, d]")
    if got.dtype != want.dtype:
        return failed(f"for {case} the result is {got.dtype}; expected {want.dtype}",
                      "np.sqrt(d) is a float64 NumPy scalar and upcasts float32 arrays under NumPy 2 (so do "
                      "np.full(..., -np.inf) and .astype(float)); divide by math.sqrt(d) or d ** 0.5 instead")
    tol = dict(rtol=1e-4, atol=1e-5) if q.dtype == np.float32 else dict(rtol=1e-7, atol=1e-9)
    if np.allclose(got, want, **tol):
        return None
    if not np.isfinite(got).all():
        return _attention_nan(fn, got, case)
    if probe:  # with huge scores some weights underflow to 0 and the probes would misread them
        # a failed Verdict is falsy, so the probes are tried in turn rather than chained with `or`
        for diagnose in (lambda: _visibility_problem(fn, q, k, v, got, case),
                         lambda: _row_sum_problem(fn, q, k, case),
                         lambda: _scale_problem(got, q, k, v, case, tol)):
            problem = diagnose()
            if problem is not None:
                return problem
    return compare(got, want, case, **tol)


def _attention_crash(bad, case, T):
    if not bad.message.startswith("NOT YET: your function raised"):
        return bad  # already specific: not written yet, or no return
    first = bad.message.removeprefix("NOT YET: ").split("\n")[0]
    if T == 0:
        return failed(f"for {case} {first}",
                      "with no queries there is nothing to attend over: return np.zeros_like(q), shape [H, 0, d] "
                      "(the max over an empty row has no value)")
    if "matmul" in first or "shapes" in first or "broadcast" in first:
        return failed(f"for {case} {first}",
                      "scores are q @ k.transpose(0, 2, 1): [H, T, d] @ [H, d, S] -> [H, T, S]; note k.T reverses "
                      "all three axes, and the mask [T, S] broadcasts over the heads")
    return failed(f"{first} (on {case})", "run it on that input yourself to see where")


def _attention_nan(fn, got, case):
    rows = np.where(~np.isfinite(got).all(axis=(0, 2)))[0].tolist()
    if case.startswith("large"):
        return failed(f"for {case} your output has nan or inf",
                      "scores this large overflow exp; subtract each row's max before exp (your softmax should)")
    return failed(f"for {case} the outputs of queries {rows} are nan",
                  "a query that sees no key has a row of -inf scores, and softmax of that is 0/0; every query must "
                  "see its own key: keep key j where j <= i (np.tril keeps the diagonal), as in "
                  "np.where(mask, s, -np.inf)")


def _visible(fn, q, k, v, base):
    """[T, S] bool: which keys each query of the learner's function actually reads."""
    T, S = q.shape[1], k.shape[1]
    seen = np.zeros((T, S), bool)
    for j in range(S):
        v2 = v.copy()
        v2[:, j] += 1  # nudge one value: every query whose weight on key j is nonzero moves
        out, bad = _run(fn, q, k, v2)
        if bad is not None or out.shape != base.shape:
            return None
        seen[:, j] = (np.abs(out - base) > 1e-9).any(axis=(0, 2))
    return seen


def _visibility_problem(fn, q, k, v, got, case):
    seen = _visible(fn, q, k, v, got)
    T = q.shape[1]
    if seen is None or T < 2:
        return None
    want = np.tril(np.ones((T, T), bool))
    if (seen == want).all():
        return None
    n0, nlast = int(seen[0].sum()), int(seen[-1].sum())
    if seen.all():
        return failed(f"for {case} query 0 reads all {T} keys; it should read 1 (itself): the future leaks in",
                      "mask the scores before the softmax: np.where(mask, s, -np.inf) with mask[i, j] = j <= i. "
                      "A score multiplied by 0 is not masked: it still gets weight exp(0)")
    if (seen == want.T).all():
        return failed(f"for {case} query 0 reads {n0} keys and query {T - 1} reads {nlast}; it should be 1 and {T}",
                      "the mask is upside down: query i may see keys 0..i, the lower triangle (np.tril, j <= i), "
                      "not np.triu")
    wrong = [i for i in range(T) if (seen[i] != want[i]).any()]
    i = wrong[0]
    return failed(f"for {case} query {i} reads keys {np.flatnonzero(seen[i]).tolist()}; it should read 0..{i}",
                  "query i may see key j exactly when j <= i")


def _row_sum_problem(fn, q, k, case):
    ones = np.ones_like(k)
    out, bad = _run(fn, q, k, ones)
    if bad is not None or out.shape != q.shape or np.allclose(out, 1.0):
        return None
    return failed(f"for {case}, with every value set to 1 your output ranges from {out.min():.3g} to {out.max():.3g}; "
                  "it should be exactly 1, because each query's weights sum to 1",
                  "softmax over the last axis (the keys, axis=-1), after the mask: the -inf go in before the exp, "
                  "so masked keys get weight 0 and the rest still sum to 1")


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
            return failed(f"for {case} {problem}", hint)
    return None
