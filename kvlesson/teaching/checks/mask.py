"""Checkers for lesson 04: the offset causal mask, and how many keys each new query sees.

Both run the learner's function on a chunk onto a cache (T < S), one decode step (T = 1), a prefill
(T = S) and no new tokens (T = 0), and reject the first answer that differs from the reference. The hint
comes from the slip that explains the answer on every case that went wrong, not on one case only: with
T = 3, S = 7 the masks j <= T + i and j < S - T + i are the same, and only a second case tells them apart.

check_visible_counts also measures the peak memory of one call at S = 2,000,000 with tracemalloc: the
exercise says to count without building the mask, and the counts need T numbers, not T x S.

The window mask has its own checker, check_window_mask (lesson 07, kvlesson.teaching.checks.window), which shares
the mask helpers below.
"""
import tracemalloc

import numpy as np

from kvlesson.sdpa import causal_mask
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, run

__all__ = ["check_offset_mask", "check_visible_counts"]

# (T, S): the lesson's chunk first, so the first complaint is about the case the lesson drew
_MASK_CASES = [(3, 7), (1, 5), (2, 9), (4, 4), (1, 1), (6, 6), (5, 12), (2, 3), (0, 5), (0, 0)]
# (T, S, W) for the counts: W = None is no window; W = 1 sees only itself, W >= S changes nothing
_COUNT_CASES = [(3, 7, None), (1, 5, None), (4, 4, None), (5, 12, None), (2, 3, None), (0, 5, None),
                (3, 7, 3), (3, 7, 2), (1, 8, 3), (4, 4, 2), (3, 7, 1), (3, 7, 50), (5, 12, 4), (0, 5, 3)]
_BIG = [(4, 2_000_000, None), (4, 2_000_000, 1_000)]  # a [T, S] bool mask here is 8 MB; the answer is 4 numbers
_BIG_BYTES = 256 * 1024  # far above what 4 counts need, far below a row of S keys


def _positions(T, S):
    """-> ([T, 1] absolute positions of the new queries, [1, S] key positions)."""
    return np.arange(S - T, S)[:, None], np.arange(S)[None, :]


def _offset(T, S, shift):
    """bool [T, S]: query i sees key j when j <= shift + i (the reference has shift = S - T)."""
    return np.arange(S)[None, :] <= np.arange(shift, shift + T)[:, None]


# ---------------------------------------------------------------------------------------------- offset mask

_TOP_LEFT = ("the diagonal is anchored at the top left, as np.tril(np.ones((T, S))) and big[:T, :S] both do: that "
             "puts query i at position i. It sits at S - T + i, so the diagonal moves right by S - T "
             "(np.tril(..., k=S - T))")

_MASK_SLIPS = [
    Slip("top left", lambda T, S: _offset(T, S, 0), "", _TOP_LEFT),
    Slip("T as the offset", lambda T, S: _offset(T, S, T), "",
         "the shift is S - T, the number of keys cached before this step, not T: query i sits at S - T + i "
         "(np.tril(..., k=S - T), not k=T)"),
    Slip("strict", lambda T, S: _offset(T, S, S - T - 1), "",
         "each query must also see its own key: use j <= S - T + i, not <"),
    Slip("one ahead", lambda T, S: _offset(T, S, S - T + 1), "",
         "a query may not see the key one step in its future: use j <= S - T + i, not j <= S - T + i + 1"),
    Slip("flipped", lambda T, S: _positions(T, S)[1] >= _positions(T, S)[0], "",
         "the comparison points the wrong way: a query sees keys at or BEFORE its position, j <= S - T + i"),
    Slip("everything visible", lambda T, S: np.ones((T, S), bool), "",
         "every query sees every key, so the earlier queries of a chunk see their future: keep key j only "
         "where j <= S - T + i"),
]


@checker
def check_offset_mask(fn):
    """fn(T, S) -> bool [T, S], True where new query i (at position S - T + i) may see key j."""
    for T, S in _MASK_CASES:
        mask_case(fn, (T, S), causal_mask(T, S), _MASK_CASES, _MASK_SLIPS,
                  "query i sees key j exactly when j <= S - T + i")
    return passed(f"offset_mask agrees with kvlesson.causal_mask on {len(_MASK_CASES)} shapes: a chunk onto a "
                  "cache, decode (T = 1), prefill (T = S) and T = 0")


# ---------------------------------------------------------------- the mask helpers (check_window_mask uses them)


def mask_case(fn, args, want, cases, slips, rule):
    """Run fn(*args) and reject unless it returns exactly the bool mask `want`; the hint comes from `slips`."""
    T, S = args[:2]
    case = case_name(*args)
    got = as_array(run(fn, *args, case=case, crash_hint=lambda e: _mask_crash_hint(e, T)), case)
    if got.shape != want.shape:
        _wrong_shape(got, T, S, case)
    sees = _sees(got, case)
    if not np.array_equal(sees, want):
        if T == S > 1 and np.array_equal(sees, want.T):
            reject(f"for {case} your mask is the transpose of the right one (an upper triangle)",
                   "rows are the T queries and columns the S keys, and a query sees keys at or before its "
                   "position: j <= S - T + i")
        slip = _slip_for(fn, cases, slips, args, sees)
        reject(first_difference(sees, want, T, S, case), slip.hint if slip else rule)
    if got.dtype != bool:
        reject(f"for {case} the mask is {got.dtype}; expected bool",
               "np.ones and np.tril give floats by default; pass dtype=bool or build the mask from a "
               "comparison, so np.where(mask, scores, -np.inf) selects rather than relies on 1.0 and 0.0")


def case_name(T, S, W=None):
    case = f"T={T}, S={S:,}" + ("" if W is None else f", W={W:,}")
    return case + (" (no new tokens)" if T == 0 else "")


def _mask_crash_hint(e, T):
    if T == 0:
        return ("T = 0 is a real call (nothing new to add): the mask is then an empty [0, S] array, which a "
                "comparison of np.arange(S) against a [T, 1] column of positions gives for free")
    if isinstance(e, TypeError) and "argument" in str(e):
        return "take exactly the arguments the exercise names, in that order"
    return None


def _sees(got, case):
    """The learner's mask as bool; an additive mask (0 and -inf) is refused with its own hint."""
    if got.dtype.kind == "f" and np.isneginf(got).any():
        reject(f"for {case} your mask holds -inf: it is an additive mask (0 to keep, -inf to hide)",
               "return the boolean mask itself, True where the key is visible; np.where(mask, scores, -np.inf) "
               "turns it into -inf where it is used")
    return got != 0


def _wrong_shape(got, T, S, case):
    if got.shape == (S, T):
        reject(f"for {case} the mask has shape {got.shape}; expected ({T}, {S})",
               "rows are the T new queries and columns the S keys: the mask is [T, S], not [S, T]")
    if T == 0:
        reject(f"for {case} the mask has shape {got.shape}; expected (0, {S})",
               "with no new tokens the mask has no rows but still S columns; a comparison of np.arange(S) "
               "against a [T, 1] column of positions gives that shape for free")
    reject(f"for {case} the mask has shape {got.shape}; expected ({T}, {S})",
           "one row per new query (T), one column per key in the cache (S)")


def _slip_for(fn, cases, slips, args, sees):
    """The slip that explains the learner's mask on every case it got wrong; else one that explains `args`."""
    wrong = [(args, sees)]
    for other in cases:
        if other == args:
            continue
        try:
            mask = np.asarray(fn(*other)) != 0
        except Exception:  # a case that crashes is reported when the loop reaches it
            continue
        want = causal_mask(*other)
        if mask.shape == want.shape and not np.array_equal(mask, want):
            wrong.append((other, mask))
    return slip_for_all(slips, wrong) or first_slip(sees, slips, args, _same_mask)


def slip_for_all(slips, answers, same=None):
    """The first slip whose wrong answer equals the learner's on every (inputs, answer) pair; None if none."""
    same = same or _same_mask
    return next((s for s in slips if all(first_slip(got, [s], inputs, same) for inputs, got in answers)), None)


def _same_mask(got, wrong):
    return np.shape(got) == np.shape(wrong) and np.array_equal(np.asarray(got) != 0, np.asarray(wrong) != 0)


def first_difference(sees, want, T, S, case):
    """Describe the first query whose row is wrong: its counts first, then which keys."""
    i = int(np.flatnonzero((sees != want).any(axis=1))[0])
    p = S - T + i
    n_got, n_want = int(sees[i].sum()), int(want[i].sum())
    who = "the first query" if i == 0 else f"query {i}"
    msg = f"for {case} {who} (at position {p}) sees {_keys(n_got)}; it should see {n_want}"
    if n_got == n_want:  # the right number of keys, not the right ones
        return f"for {case} {who} (at position {p}) sees {_span(sees[i])}; it should see {_span(want[i])}"
    extra = np.flatnonzero(sees[i] & ~want[i])  # keys it sees but must not
    missing = np.flatnonzero(want[i] & ~sees[i])
    future = extra[extra > p]
    if future.size:
        return msg + f" ({_keys_named(future)} in its future)"
    if missing.size:
        return msg + f" ({_keys_named(missing)} missing)"
    return msg + f" ({_keys_named(extra)} outside its window)"


def _span(row):
    """bool [S] -> 'keys 1..3' (or 'no key', 'key 4', 'keys 0, 2')."""
    keys = np.flatnonzero(row)
    if keys.size == 0:
        return "no key"
    return _keys_named(keys).rsplit(" ", 1)[0]


def _keys(n):
    return f"{n} key" if n == 1 else f"{n} keys"


def _keys_named(keys):
    """[1, 2, 3] -> 'keys 1..3 are'; [6] -> 'key 6 is'."""
    if keys.size == 1:
        return f"key {keys[0]} is"
    if np.all(np.diff(keys) == 1):
        return f"keys {keys[0]}..{keys[-1]} are"
    return "keys " + ", ".join(str(k) for k in keys) + " are"


# ---------------------------------------------------------------------------------------------- visible counts


def _counts(T, S, W, shift=None, cap=None):
    """int [T]: keys seen by query i at shift + i (S - T by default), capped at `cap` (W by default)."""
    n = np.arange(T) + (S - T if shift is None else shift) + 1
    cap = W if cap is None else cap
    return n if cap is None else np.minimum(n, cap)


_COUNT_SLIPS = [
    Slip("top left", lambda T, S, W: _counts(T, S, W, shift=0), "",
         "that counts from the top left, as if query i sat at position i; it sits at S - T + i, so without a "
         "window it sees S - T + i + 1 keys"),
    Slip("T as the offset", lambda T, S, W: _counts(T, S, W, shift=T), "",
         "the offset is S - T, the number of keys cached before this step, not T: query i sits at S - T + i"),
    Slip("itself left out", lambda T, S, W: _counts(T, S, W, shift=S - T - 1), "",
         "a query also sees itself: keys 0 .. S - T + i are S - T + i + 1 keys"),
    Slip("window ignored", lambda T, S, W: _counts(T, S, None) if W is not None else None, "",
         "with a window each count stops growing at W: min(S - T + i + 1, W)"),
    Slip("window one too wide", lambda T, S, W: _counts(T, S, W, cap=W + 1) if W is not None else None, "",
         "a window of W holds W keys, the query's own included, so the cap is W, not W + 1"),
    Slip("window one too narrow", lambda T, S, W: _counts(T, S, W, cap=W - 1) if W is not None else None, "",
         "a window of W holds W keys, the query's own included, so the cap is W, not W - 1"),
    Slip("every key", lambda T, S, W: np.full(T, S if W is None else min(S, W)), "",
         "only the last query sees all S keys; query i sits at S - T + i and sees the keys up to and including "
         "its own"),
]


@checker
def check_visible_counts(fn):
    """fn(T, S, window=None) -> int [T]: how many keys each new query sees, counted without building the mask."""
    for T, S, W in _COUNT_CASES:
        _count_case(fn, T, S, W)
    for T, S, W in _BIG:
        _count_case(fn, T, S, W, measure=True)
    return passed(f"visible_counts is right on {len(_COUNT_CASES) + len(_BIG)} cases, windows, T = 0 and T = S "
                  f"included, and at S = {_BIG[0][1]:,} it allocates no more than a few counts")


def _count_args(T, S, W):
    return (T, S) if W is None else (T, S, W)


def _count_case(fn, T, S, W, measure=False):
    case = case_name(T, S, W)
    args = _count_args(T, S, W)
    if measure:
        result, peak = _peak_bytes(lambda: run(fn, *args, case=case, crash_hint=_count_crash_hint))
    else:
        result = run(fn, *args, case=case, crash_hint=_count_crash_hint)
    got = as_array(result, case)
    want = _counts(T, S, W)
    if got.shape == (T, S) and T > 1:
        reject(f"for {case} you returned a [T, S] array", "return one count per query, shape [T]")
    if got.shape != (T,):
        reject(f"for {case} the counts have shape {got.shape}; expected ({T},)", "one count per new query, "
               "an array [T], even when T = 1")
    if T and got.dtype.kind not in "iu":
        reject(f"for {case} the counts are {got.dtype}; expected integers",
               "a count of keys is an integer; np.arange gives integers, and so does np.minimum of integers")
    if not np.array_equal(got, want):
        i = int(np.flatnonzero(got != want)[0])
        slip = _count_slip(fn, (T, S, W), got)
        reject(f"for {case} query {i} (at position {S - T + i}) gets {got[i]}; it should see {want[i]}",
               slip.hint if slip else "query i sits at absolute position S - T + i and sees every key up to "
                                      "and including it, at most W of them with a window")
    if measure and peak > _BIG_BYTES:
        reject(f"for {case} your function allocated {peak / 2**20:.1f} MiB at its peak, to return {T} numbers: "
               "it built the mask, or an array as long as S",
               "count from the positions alone: query i sits at S - T + i, so it sees S - T + i + 1 keys, at "
               "most W with a window; np.arange(S - T, S) has only T entries")


def _count_crash_hint(e):
    if isinstance(e, TypeError) and "NoneType" in str(e):
        return "window is None when there is no window: handle that case on its own (if window is None: ...)"
    if isinstance(e, TypeError) and "argument" in str(e):
        return "take a third argument, window, that defaults to None: def visible_counts(T, S, window=None)"
    if isinstance(e, MemoryError):
        return "the exercise is to count without building the [T, S] mask; at this size the mask does not fit"
    return None


def _count_slip(fn, inputs, got):
    wrong = [(inputs, got)]
    for T, S, W in _COUNT_CASES:
        if (T, S, W) == inputs:
            continue
        try:
            other = np.asarray(fn(*_count_args(T, S, W)))
        except Exception:
            continue
        if other.shape == (T,) and not np.array_equal(other, _counts(T, S, W)):
            wrong.append(((T, S, W), other))
    return slip_for_all(_COUNT_SLIPS, wrong, _same_counts) or first_slip(got, _COUNT_SLIPS, inputs, _same_counts)


def _same_counts(got, wrong):
    return np.shape(got) == np.shape(wrong) and np.array_equal(got, wrong)


def _peak_bytes(call):
    """(call(), the peak bytes tracemalloc saw allocated during it, numpy's arrays included)."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()
