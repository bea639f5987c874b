"""Checkers for lesson 04, the offset causal mask.

Each runs your function on a handful of (T, S) pairs: a chunk onto a cache (T < S), one decode
step (T = 1), a plain prefill (T = S) and no new tokens at all (T = 0). A wrong answer is
compared against the usual mistakes, so the verdict can say which one it is.
"""
import numpy as np

from kvlesson.checks._verdict import failed, passed
from kvlesson.sdpa import causal_mask

__all__ = ["check_offset_mask", "check_windowed_mask", "check_visible_counts"]

# (T, S): the lesson's chunk first, so the first complaint is about the case the lesson drew
_MASK_CASES = [(3, 7), (1, 5), (2, 9), (4, 4), (1, 1), (6, 6), (5, 12), (0, 5), (0, 0)]
# (T, S, W): windows narrower than the chunk, wider than everything, and W = 1 (only itself)
_WINDOW_CASES = [(3, 7, 3), (3, 7, 2), (1, 8, 3), (4, 4, 2), (3, 7, 1), (3, 7, 7), (3, 7, 50), (5, 12, 4), (0, 5, 3)]


def check_offset_mask(offset_mask):
    """Checks `offset_mask(T, S) -> bool [T, S]`, True where query i may see key j."""
    for T, S in _MASK_CASES:
        case = _case(T, S)
        got, problem = _run(offset_mask, case, T, S)
        if problem is None:
            problem = _diagnose_mask(got, causal_mask(T, S), T, S, case, _usual_mask_bugs(T, S))
        if problem is not None:
            return problem
    return passed(f"offset_mask agrees with kvlesson.causal_mask on {len(_MASK_CASES)} shapes, "
                  "T = 0, T = 1 and T = S included")


def check_windowed_mask(windowed_mask):
    """Checks `windowed_mask(T, S, W) -> bool [T, S]`: causal, and at most W keys per query, itself included."""
    for T, S, W in _WINDOW_CASES:
        case = _case(T, S, W)
        got, problem = _run(windowed_mask, case, T, S, W)
        if problem is None:
            problem = _diagnose_mask(got, causal_mask(T, S, W), T, S, case, _usual_window_bugs(T, S, W))
        if problem is not None:
            return problem
    return passed(f"windowed_mask agrees with kvlesson.causal_mask(T, S, window=W) on {len(_WINDOW_CASES)} cases, "
                  "W = 1 and W >= S included")


def check_visible_counts(visible_counts):
    """Checks `visible_counts(T, S) -> int [T]`: how many keys each new query sees, without building the mask."""
    for T, S in _MASK_CASES:
        case = _case(T, S)
        got, problem = _run(visible_counts, case, T, S)
        if problem is None:
            problem = _diagnose_counts(np.asarray(got), T, S, case)
        if problem is not None:
            return problem
    return passed(f"visible_counts is right on {len(_MASK_CASES)} shapes, T = 0 and T = S included")


# ---------------------------------------------------------------- the usual mistakes


def _usual_mask_bugs(T, S):
    """(wrong mask, hint) pairs for the mistakes learners make most often."""
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    p = i + (S - T)  # absolute position of query i
    return [
        (j <= i, "the diagonal is anchored at the top left, as np.tril(np.ones((T, S))) does: that puts "
                 "query i at position i. It sits at S - T + i, so shift the diagonal by S - T "
                 "(np.tril(..., k=S - T))"),
        (j < p, "each query must also see its own key: use j <= S - T + i, not <"),
        (j <= p + 1, "a query may not see the key one step in its future: use j <= S - T + i, not j <= S - T + i + 1"),
        (j >= p, "the comparison points the wrong way: a query sees keys at or BEFORE its position, j <= S - T + i"),
    ]


def _usual_window_bugs(T, S, W):
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    p = i + (S - T)
    return [
        (j <= p, f"the window is missing: besides j <= S - T + i, a window of W={W} needs j > S - T + i - W"),
        ((j <= i) & (j > i - W), "the diagonal is anchored at the top left: query i sits at S - T + i, not at i, "
                                 "and both bounds of the band move with it"),
        ((j <= p) & (j >= p - W), f"the window holds W keys, the query's own included: use j > S - T + i - W, "
                                  f"not >=; with W={W} a query sees {W} keys, not {W + 1}"),
        ((j <= p) & (j > p - W + 1), f"the window holds W keys, the query's own included: use j > S - T + i - W; "
                                     f"with W={W} a query sees {W} keys, not {W - 1}"),
        (j > p - W, "the causal bound is missing: a query must not see keys after its own position, j <= S - T + i"),
        ((j < p) & (j > p - W), "each query must also see its own key: use j <= S - T + i, not <"),
    ]


# ---------------------------------------------------------------- diagnosis


def _diagnose_mask(got, want, T, S, case, usual):
    """None when `got` is the right bool mask; otherwise the most specific verdict we can give."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return _wrong_shape(got, T, S, case)
    sees = got.astype(bool) if got.dtype != object else got != 0
    if not np.array_equal(sees, want):
        if T > 1 and np.array_equal(sees, want.T):
            return failed(f"for {case} your mask is the transpose of the right one (an upper triangle)",
                          "rows are the T queries and columns the S keys, and a query sees keys at or before "
                          "its position: j <= S - T + i")
        for bug, hint in usual:
            if np.array_equal(sees, bug):
                return failed(_first_difference(sees, want, T, S, case), hint)
        hint = "key j is visible to query i exactly when j <= S - T + i (and j > S - T + i - W with a window)"
        return failed(_first_difference(sees, want, T, S, case), hint)
    if got.dtype != bool:
        return failed(f"for {case} the mask is {got.dtype}; expected bool",
                      "np.ones and np.tril give floats by default; pass dtype=bool or build the mask from a "
                      "comparison, so np.where(mask, scores, -np.inf) selects rather than relies on 1.0 and 0.0")
    return None


def _wrong_shape(got, T, S, case):
    if got.shape == (S, T):
        return failed(f"for {case} the mask has shape {got.shape}; expected ({T}, {S})",
                      "rows are the T new queries and columns the S keys: the mask is [T, S], not [S, T]")
    if T == 0:
        return failed(f"for {case} the mask has shape {got.shape}; expected (0, {S})",
                      "with no new tokens the mask has no rows but still S columns; a comparison of "
                      "np.arange(S) against a [T, 1] column of positions gives that shape for free")
    return failed(f"for {case} the mask has shape {got.shape}; expected ({T}, {S})",
                  "one row per new query (T), one column per key in the cache (S)")


def _first_difference(sees, want, T, S, case):
    """Describe the first query whose row is wrong, in counts first and then by key."""
    i = int(np.flatnonzero((sees != want).any(axis=1))[0])
    p = S - T + i
    n_got, n_want = int(sees[i].sum()), int(want[i].sum())
    who = "the first query" if i == 0 else f"query {i}"
    msg = f"for {case} {who} (at position {p}) sees {_keys(n_got)}; it should see {n_want}"
    extra = np.flatnonzero(sees[i] & ~want[i])  # keys it sees but must not
    missing = np.flatnonzero(want[i] & ~sees[i])
    future = extra[extra > p]
    if future.size:
        return msg + f" ({_keys_named(future)} in its future)"
    if missing.size:
        return msg + f" ({_keys_named(missing)} missing)"
    return msg + f" ({_keys_named(extra)} outside its window)"


def _diagnose_counts(got, T, S, case):
    want = np.arange(S - T, S) + 1  # query i at S - T + i sees keys 0 .. S - T + i
    if got.shape == (T, S) and T > 0:
        return failed(f"for {case} you returned a [T, S] array", "return one count per query, shape [T]")
    if got.shape != (T,):
        return failed(f"for {case} the counts have shape {got.shape}; expected ({T},)", "one count per new query")
    if not (np.issubdtype(got.dtype, np.integer) or (T == 0 and got.dtype == float)):
        return failed(f"for {case} the counts are {got.dtype}; expected integers", "a count of keys is an integer")
    if np.array_equal(got, want):
        return None
    i = int(np.flatnonzero(got != want)[0])
    msg = f"for {case} query {i} (at position {S - T + i}) gets {int(got[i])}; it should see {int(want[i])}"
    if np.array_equal(got, np.arange(T) + 1):
        return failed(msg, "that counts from the top left; query i sits at S - T + i, so it sees S - T + i + 1 keys")
    if np.array_equal(got, want - 1):
        return failed(msg, "a query also sees itself: keys 0 .. S - T + i are S - T + i + 1 keys")
    return failed(msg, "query i sits at absolute position S - T + i and sees every key up to and including it")


# ---------------------------------------------------------------- helpers


def _case(T, S, W=None):
    case = f"T={T}, S={S}" + ("" if W is None else f", W={W}")
    return case + (" (no new tokens)" if T == 0 else "")


def _keys(n):
    return f"{n} key" if n == 1 else f"{n} keys"


def _keys_named(keys):
    """[1, 2, 3] -> 'keys 1..3 are'; [6] -> 'key 6 is'."""
    if keys.size == 1:
        return f"key {keys[0]} is"
    if np.all(np.diff(keys) == 1):
        return f"keys {keys[0]}..{keys[-1]} are"
    return "keys " + ", ".join(str(k) for k in keys) + " are"


def _run(fn, case, *args):
    """Call the learner's function; a crash becomes a verdict that names the case."""
    try:
        return fn(*args), None
    except NotImplementedError:
        return None, failed("your code still raises NotImplementedError",
                            "replace the `raise NotImplementedError` line with your code, run that cell, then this one")
    except Exception as e:  # the learner's code may raise anything
        return None, failed(f"for {case} your function raised {type(e).__name__}: {e}",
                            "run it on that case by hand to see where")
