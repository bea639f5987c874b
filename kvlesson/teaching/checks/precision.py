"""Checkers for lesson 10: one step of the online softmax, finishing a pass into its output and log-sum-exp, and a
merge of two partial results that can itself be merged (a tree reduction).

Each runs the learner's function on seeded cases and rejects any answer that differs from kvlesson.online's. To
say why, it compares the answer with the classic slips: for the update, a state that is not rescaled when the max
moves (or only half of it), an inverted factor, the block's max in place of the running one, nan for a row that
has seen no key (also while other rows have); for the finish, an lse without its shift m, or that overflows, or
nan for a row that saw nothing; for the merge, a plain average, an lse that keeps only the larger side or adds the
two, weights that are not normalised, exp without the max shift, nan where neither side saw a key.
"""
import numpy as np

from kvlesson.online import finish, merge_partials, online_update
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_online_update", "check_online_finish", "check_lse_merge"]

R, D = 3, 2  # rows (queries) and head dim of the update and finish cases


def _fresh(rows, d, dtype=np.float64):
    """The state of rows that have seen no key: m = -inf, l = 0, o = 0."""
    return np.full((rows, 1), -np.inf, dtype), np.zeros((rows, 1), dtype), np.zeros((rows, d), dtype)


def _results(got, case, names):
    """The learner's tuple -> a list of arrays, one per name, or a NOT YET that says what came back instead."""
    expected = "(" + ", ".join(names) + ")"
    if got is None:
        reject(f"for {case} your function returned None", "is the return statement missing?")
    if isinstance(got, np.ndarray) or not isinstance(got, (tuple, list)) or len(got) != len(names):
        what = f"a {type(got).__name__}" + (f" of {len(got)} items" if isinstance(got, (tuple, list)) else "")
        reject(f"for {case} your function returned {what}; expected the tuple {expected}",
               f"return {', '.join(names)}: all of them, in that order")
    return [as_array(g, case, f"your function, as {name},") for name, g in zip(names, got, strict=True)]


def _unchanged(inputs, given, names, case, hint):
    for name, before, after in zip(names, inputs, given, strict=True):
        if not np.array_equal(before, after, equal_nan=True):
            reject(f"for {case} your function changed {name} in place", hint)


def _same_shapes_and_dtypes(got, want, names, case, shape_hint):
    for name, g, w in zip(names, got, want, strict=True):
        if g.shape != w.shape:
            reject(f"for {case} your {name} has shape {g.shape}; expected {w.shape}", shape_hint)
        if g.dtype != w.dtype:
            reject(f"for {case} your {name} is {g.dtype}; expected {w.dtype}",
                   "float32 in, float32 out: a float64 constant (np.float64(...), np.full(..., -np.inf) or "
                   "np.zeros(...) without a dtype) upcasts the result")


def _close(got, want):
    tol = dict(rtol=1e-5, atol=1e-6) if want.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    return got.shape == want.shape and bool(np.allclose(got, want, equal_nan=True, **tol))


def _same(got, wrong):
    return all(np.shape(g) == np.shape(w) and np.allclose(g, w, rtol=1e-5, atol=1e-8, equal_nan=True)
               for g, w in zip(got, wrong, strict=True))


def _nan_where_nothing_was_seen(got, empty_rows):
    """True when the answer has nan in a row that saw no key (and in no other row)."""
    nan_rows = np.zeros(len(empty_rows), bool)
    for g in got:
        nan_rows |= np.isnan(g.reshape(len(empty_rows), -1)).any(axis=-1)
    return nan_rows.any() and not (nan_rows & ~empty_rows).any()


# ------------------------------------------------------------------------------------------ the update step

def _update_cases():
    """(case, (m, l, o, s, v)) for each case; the states are reached with the reference update itself."""
    rng = np.random.default_rng(10)
    b = 4

    def block(shift=0.0, dtype=np.float64, hide=()):
        s = rng.standard_normal((R, b)) + shift
        s[list(hide), :] = -np.inf  # rows that see none of this block's keys
        return s.astype(dtype), rng.standard_normal((b, D)).astype(dtype)

    low = online_update(*_fresh(R, D), *block())  # the state after one block of ordinary scores
    masked, v_masked = block()
    masked[0, 1:] = -np.inf  # row 0 keeps one key, row 2 none of this block's
    masked[2, :] = -np.inf
    mixed = online_update(*_fresh(R, D), *block(hide=[1]))  # rows 0 and 2 have seen keys, row 1 none yet
    big = online_update(*_fresh(R, D), *block(1000.0))
    m32 = tuple(a.astype(np.float32) for a in low)
    return [
        ("the first block (from the empty state m = -inf, l = 0, o = 0)", (*_fresh(R, D), *block())),
        ("a second block whose scores are higher (the running max moves up)", (*low, *block(4.0))),
        ("a second block whose scores are lower (the running max stays)", (*low, *block(-4.0))),
        ("a block with masked keys (-inf), one row fully masked", (*low, masked, v_masked)),
        ("a first block where row 1 sees no key at all (it must stay m = -inf, l = 0, o = 0)",
         (*_fresh(R, D), *block(hide=[1]))),
        ("a state where rows 0 and 2 have seen keys and row 1 none yet, and a block row 1 still does not see "
         "(a sliding window that has not reached it; it must stay m = -inf, l = 0, o = 0)",
         (*mixed, *block(2.0, hide=[1]))),
        ("a state where rows 0 and 2 have seen keys and row 1 none yet, and a block row 1 sees first",
         (*mixed, *block(2.0))),
        ("scores near 1000, the max moving up by 3", (*big, *block(1003.0))),
        ("float32 state and block", (*m32, *block(2.0, np.float32))),
    ]


def _no_rescale(m, l, o, s, v):
    m2 = np.maximum(m, s.max(axis=-1, keepdims=True))
    p = np.exp(s - m2)
    return m2, l + p.sum(axis=-1, keepdims=True), o + p @ v


def _rescale(m, l, o, s, v, *, scale_l=True, scale_o=True, invert=False):
    m2 = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m2 - m) if invert else np.exp(m - m2)
    p = np.exp(s - m2)
    return (m2, (alpha * l if scale_l else l) + p.sum(axis=-1, keepdims=True),
            (alpha * o if scale_o else o) + p @ v)


def _unshifted(m, l, o, s, v):
    m2 = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha, p = np.exp(m - m2), np.exp(s)
    return m2, alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + p @ v


def _block_max(m, l, o, s, v):
    mb = s.max(axis=-1, keepdims=True)
    alpha, p = np.exp(m - mb), np.exp(s - mb)
    return mb, alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + p @ v


def _normalised(m, l, o, s, v):
    m2, l2, o2 = online_update(m, l, o, s, v)
    return m2, l2, o2 / l2


_RESCALE_HINT = ("everything summed so far was weighted by exp(score - m); once the max is m_new it must be "
                 "exp(score - m_new), so multiply both l and o by alpha = exp(m - m_new) before adding the block")

_EMPTY_ROW_HINT = ("a row that has seen no key has m = -inf, and if the block hides every key from it too, m_new = "
                   "-inf and exp(m - m_new) = exp(-inf + inf) = nan. Shift by 0 where m_new is -inf "
                   "(np.where(np.isneginf(m_new), 0, m_new)), row by row, so that row keeps l = 0 and o = 0 while "
                   "the others go on")

_UPDATE_SLIPS = [
    Slip("no rescale", _no_rescale, "for {case} l and o are not rescaled when the max moves", _RESCALE_HINT),
    Slip("rescale l only", lambda *a: _rescale(*a, scale_o=False),
         "for {case} l is rescaled but o is not", "o was summed under the old max as well: " + _RESCALE_HINT),
    Slip("rescale o only", lambda *a: _rescale(*a, scale_l=False),
         "for {case} o is rescaled but l is not", "l was summed under the old max as well: " + _RESCALE_HINT),
    Slip("inverted alpha", lambda *a: _rescale(*a, invert=True),
         "for {case} the rescaling factor is upside down",
         "alpha = exp(m_old - m_new) is at most 1: a larger max makes the old terms relatively smaller"),
    Slip("unshifted block", _unshifted, "for {case} the block's exps are not shifted by the new max",
         "l and o are sums of exp(score - m_new): take p = exp(s - m_new), which also keeps every exp at most 1"),
    Slip("block max", _block_max, "for {case} the new max forgets the running one",
         "m_new = max(m, the block's max), not the block's max alone: a block of low scores must not lower it"),
    Slip("normalised o", _normalised, "for {case} o has been divided by l",
         "keep o unnormalised (a weighted sum, not a weighted mean) until every block is in; the caller divides "
         "once at the end"),
]


@checker
def check_online_update(fn):
    """fn(m, l, o, s, v) -> (m, l, o): one block of keys into the running softmax state.

    m, l [R, 1] running max and sum of exp(score - m); o [R, d] sum of exp(score - m) * value, unnormalised;
    s [R, b] the block's scores (-inf where masked); v [b, d] its values.
    """
    for case, inputs in _update_cases():
        given = tuple(a.copy() for a in inputs)
        got = _results(run(fn, *given, case=case), case, "mlo")
        _unchanged(inputs, given, ("m", "l", "o", "s", "v"), case,
                   "return new arrays (o = alpha * o + ...) rather than o *= ...: the caller may still need the "
                   "old state")
        want = online_update(*inputs)
        _same_shapes_and_dtypes(got, want, "mlo", case,
                                "m and l are [R, 1] (keepdims=True on the max and the sum), o is [R, d]")
        _update_verdict(got, want, inputs, case)
    return passed("your update rescales l and o when the max moves, keeps rows that saw nothing empty (also beside "
                  "rows that saw keys), stays finite near 1000 and keeps float32")


def _update_verdict(got, want, inputs, case):
    close = [_close(g, w) for g, w in zip(got, want, strict=True)]
    if all(close):
        return
    if _nan_where_nothing_was_seen(got, np.isneginf(want[0][:, 0])):
        reject(f"for {case} your state has nan in the row that saw no key", _EMPTY_ROW_HINT)
    slip = first_slip(tuple(got), _UPDATE_SLIPS, inputs, same=_same)
    if slip is not None:
        reject_slip(slip, case)
    if not all(np.isfinite(g).all() for g in got[1:]):
        reject(f"for {case} your state has nan or inf",
               "exp of a large number overflows: subtract m_new inside every exp, so each one is at most 1")
    name = "mlo"[close.index(False)]
    reject(f"for {case} your {name} differs from the reference",
           "m_new = max(m, block max); alpha = exp(m - m_new); p = exp(s - m_new); l_new = alpha * l + p.sum(-1); "
           "o_new = alpha * o + p @ v")


# ------------------------------------------------------------------------------------------------ the finish

def _finish_cases():
    """(case, (m, l, o)) states left by the reference update after a few blocks of keys."""
    rng = np.random.default_rng(12)

    def state(shift=0.0, hide=(), dtype=np.float64, blocks=3):
        st = _fresh(R, D, dtype)
        for _ in range(blocks):
            s = rng.standard_normal((R, 5)) * 2 + shift
            s[list(hide), :] = -np.inf
            st = online_update(*st, s.astype(dtype), rng.standard_normal((5, D)).astype(dtype))
        return st

    return [
        ("a state after three blocks, scores near 3", state(3.0)),
        ("a state after three blocks, scores near -5", state(-5.0)),
        ("a state where row 1 saw no key (m = -inf, l = 0, o = 0: out must be 0 and lse -inf)", state(2.0, [1])),
        ("a state whose scores reach 1000 (m near 1000)", state(1000.0)),
        ("a float32 state", state(1.0, dtype=np.float32)),
    ]


_FINISH_SLIPS = [
    Slip("lse without m", lambda m, l, o: (o / l, np.log(l)[:, 0]), "for {case} your lse is log(l)",
         "l sums exp(s_j - m), not exp(s_j): log sum_j exp(s_j) = log(exp(m) * l) = m + log(l). Your log(l) is "
         "short by m"),
    Slip("lse is m", lambda m, l, o: (o / l, m[:, 0]), "for {case} your lse is the max m alone",
         "the max is only the largest term: log sum_j exp(s_j) = m + log(l), and l >= 1 counts the others"),
    Slip("lse m + l", lambda m, l, o: (o / l, (m + l)[:, 0]), "for {case} your lse adds l itself to m",
         "l is a sum of exps, so its log belongs in the lse: m + log(l)"),
    Slip("lse in base 2", lambda m, l, o: (o / l, (m + np.log2(l))[:, 0]), "for {case} your lse uses log base 2",
         "the scores are natural exponents (exp, not exp2): use np.log"),
    Slip("out unnormalised", lambda m, l, o: (o, (m + np.log(l))[:, 0]), "for {case} your out is o itself",
         "o is a weighted sum whose weights add up to l, not 1: the output is o / l"),
    Slip("out times l", lambda m, l, o: (o * l, (m + np.log(l))[:, 0]), "for {case} your out is o * l",
         "the weights of o add up to l; divide by it: out = o / l"),
]


@checker
def check_online_finish(fn):
    """fn(m, l, o) -> (out [R, d], lse [R]): the output of a finished online pass and each row's log-sum-exp,
    log sum_j exp(s_j) over every score the row saw, from the running state alone."""
    for case, inputs in _finish_cases():
        given = tuple(a.copy() for a in inputs)
        got = _results(run(fn, *given, case=case), case, ("out", "lse"))
        _unchanged(inputs, given, "mlo", case, "compute new arrays (out = o / l) rather than o /= l")
        want = finish(*inputs)
        _same_shapes_and_dtypes(got, want, ("out", "lse"), case,
                                "out is [R, d] like o; lse is one number per row, [R]: drop the kept axis "
                                "(lse[:, 0], or m[:, 0] + np.log(l[:, 0]))")
        _finish_verdict(got, want, inputs, case)
    return passed("your finish gives o / l and lse = m + log(l), 0 and -inf for a row that saw nothing, stays "
                  "finite near 1000 and keeps float32")


def _finish_verdict(got, want, inputs, case):
    if all(_close(g, w) for g, w in zip(got, want, strict=True)):
        return
    empty = np.isneginf(inputs[0][:, 0])
    if empty.any() and _nan_where_nothing_was_seen(got, empty):
        reject(f"for {case} your result has nan in the row that saw no key",
               "that row has l = 0, so o / l is 0 / 0: answer out = 0 and lse = -inf there (np.where(l > 0, ...), "
               "dividing by np.where(l > 0, l, 1)), the pair a merge can ignore")
    slip = first_slip(tuple(got), _FINISH_SLIPS, inputs, same=_same)
    if slip is not None:
        reject_slip(slip, case)
    seen = ~empty
    if not np.isfinite(got[1][seen]).all():
        reject(f"for {case} your lse has nan or inf in a row that saw keys",
               "exp(m) overflows near 1000: never take exp of the max; log(exp(m) * l) = m + log(l) needs no exp")
    if not _close(got[0], want[0]):
        reject(f"for {case} your out differs from attention's output", "out = o / l: the weighted sum over the "
                                                                         "sum of its weights")
    reject(f"for {case} your lse differs from log sum_j exp(s_j)",
           "write the sum of exps as exp(m) times the sum of exp(s_j - m), then take the log")


# ------------------------------------------------------------------------------------------------ the merge

def _slices(rng, R, S, d, bounds, hidden):
    """Partials of R query rows over S keys cut at `bounds`, each finished by the reference: [(out, lse), ...].

    hidden: (row, slice) pairs whose keys that row does not see (a window that has moved past them, or not yet
    reached them). Also returns the answer over all the keys: (out [R, d], lse [R])."""
    q, k, v = rng.standard_normal((R, d)), rng.standard_normal((S, d)), rng.standard_normal((S, d))
    s = q @ k.T / np.sqrt(d) * 2  # [R, S]
    for row, i in hidden:
        s[row, bounds[i] : bounds[i + 1]] = -np.inf
    parts = [finish(*online_update(*_fresh(R, d), s[:, a:b], v[a:b]))
             for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return parts, finish(*online_update(*_fresh(R, d), s, v))


def _merge_cases():
    """(case, (o1, lse1, o2, lse2)) pairs to merge, and (case, parts, trees, whole) tree reductions."""
    rng = np.random.default_rng(11)
    R, S, d = 4, 12, 3
    (a, b), _ = _slices(rng, R, S, d, [0, 7, S], [])
    (c, e), _ = _slices(rng, R, S, d, [0, 4, S], [(0, 1)])  # row 0 saw no key of the second slice
    (f, g), _ = _slices(rng, R, S, d, [0, 5, S], [(0, 0), (2, 0), (2, 1)])  # row 2 saw neither slice
    (h, i), _ = _slices(rng, R, S, d, [0, 6, S], [])
    h, i = (h[0], h[1] + np.array([1000.0, 0, 0, -3.0])), (i[0], i[1] + np.array([0.0, 1000, 0, 0]))
    (j, n), _ = _slices(rng, R, S, d, [0, 6, S], [(1, 0)])
    j, n = tuple(x.astype(np.float32) for x in j), tuple(x.astype(np.float32) for x in n)
    pairs = [
        ("two slices of 7 and 5 keys", (*a, *b)),
        ("the same two slices, second first (a merge does not care about the order)", (*b, *a)),
        ("two slices, one of which row 0 never saw (its output 0, its lse -inf)", (*c, *e)),
        ("two slices neither of which row 2 saw (both lse -inf: the merged row saw nothing either)", (*f, *g)),
        ("two slices where row 0's first lse and row 1's second are near 1000, the others near 0", (*h, *i)),
        ("float32 outputs and lses", (*j, *n)),
    ]
    bounds = [0, 2, 3, 6, 8, 10, S]
    parts, whole = _slices(rng, R, S, d, bounds, [(0, 1), (0, 2), (1, 0), (1, 1), (3, 4), (3, 5)])
    trees = [("one after another, ((((s0 s1) s2) s3) s4) s5", (((((0, 1), 2), 3), 4), 5)),
             ("in a balanced tree, ((s0 s1) (s2 s3)) (s4 s5)", (((0, 1), (2, 3)), (4, 5))),
             ("from the right, s0 (s1 (s2 (s3 (s4 s5))))", (0, (1, (2, (3, (4, 5))))))]
    tree_case = ("six slices where row 0 saw no key of slices 1 and 2, row 1 none of 0 and 1, row 3 none of 4 "
                 "and 5 (two in a row), merged")
    return pairs, (tree_case, parts, trees, whole)


def _merge_two(out1, lse1, out2, lse2):
    """The reference: kvlesson.online.merge_partials on the two sides stacked."""
    return merge_partials(np.stack([out1, out2]), np.stack([lse1, lse2]))


def _weights(l1, l2, top):
    """Each side's weight shifted by `top`, [R, 1] each."""
    return np.exp(l1 - top)[:, None], np.exp(l2 - top)[:, None]


def _average(o1, l1, o2, l2):
    return (o1 + o2) / 2, _merge_two(o1, l1, o2, l2)[1]


def _lse_max(o1, l1, o2, l2):
    return _merge_two(o1, l1, o2, l2)[0], np.maximum(l1, l2)


def _lse_sum(o1, l1, o2, l2):
    return _merge_two(o1, l1, o2, l2)[0], l1 + l2


def _lse_mean(o1, l1, o2, l2):
    return _merge_two(o1, l1, o2, l2)[0], (l1 + l2) / 2


def _lse_unshifted_back(o1, l1, o2, l2):
    w1, w2 = _weights(l1, l2, np.maximum(l1, l2))
    return _merge_two(o1, l1, o2, l2)[0], np.log(w1 + w2)[:, 0]


def _not_normalised(o1, l1, o2, l2):
    w1, w2 = _weights(l1, l2, np.maximum(l1, l2))
    return w1 * o1 + w2 * o2, _merge_two(o1, l1, o2, l2)[1]


def _linear(o1, l1, o2, l2):
    return (l1[:, None] * o1 + l2[:, None] * o2) / (l1 + l2)[:, None], _merge_two(o1, l1, o2, l2)[1]


def _global_shift(o1, l1, o2, l2):
    top = max(l1.max(), l2.max())
    w1, w2 = _weights(l1, l2, top)
    return (w1 * o1 + w2 * o2) / (w1 + w2), top + np.log(w1 + w2)[:, 0]


_MERGE_SLIPS = [
    Slip("plain average", _average, "for {case} your output is a plain average of the two",
         "each side is normalised over its own keys only, and the side whose scores are larger holds more of the "
         "weight: weigh side i by exp(lse_i) over the sum of both, shifted by the larger lse"),
    Slip("lse max", _lse_max, "for {case} your lse keeps only the larger side's",
         "the output is right, but the merged pair must be mergeable again: its lse is the log of BOTH sides' "
         "total weight, log(exp(lse1) + exp(lse2)), which the larger lse alone undercounts"),
    Slip("lse sum", _lse_sum, "for {case} your lse adds the two lses",
         "adding logs multiplies the sums; the keys of the two sides add: lse = log(exp(lse1) + exp(lse2))"),
    Slip("lse mean", _lse_mean, "for {case} your lse averages the two lses",
         "the merged lse is the log of the summed weight, log(exp(lse1) + exp(lse2)), not an average of logs"),
    Slip("lse without top", _lse_unshifted_back, "for {case} your lse is missing the shift",
         "you summed the shifted weights exp(lse_i - top); their log is lse - top, so add top back"),
    Slip("not normalised", _not_normalised, "for {case} the weights of the two sides do not sum to 1",
         "divide by the sum of the weights, exp(lse1 - top) + exp(lse2 - top): the shift by top leaves them "
         "unnormalised"),
    Slip("linear in lse", _linear, "for {case} the sides are weighted by their lse itself",
         "an lse is a logarithm: the weight of side i is exp(lse_i - lse), not lse_i"),
    Slip("global shift", _global_shift, "for {case} rows far below the largest lse come out nan",
         "shift each row by its own larger lse (np.maximum(lse1, lse2)), not by one number for the whole array: "
         "exp(-1000) underflows to 0 and 0/0 is nan"),
]


def _tree(fn, parts, shape, case):
    """Merge parts (a list of (out, lse)) with the learner's fn in the nested-pair `shape` -> (out, lse)."""
    if isinstance(shape, int):
        return tuple(a.copy() for a in parts[shape])  # a merge that works in place must not spoil the next tree
    left, right = _tree(fn, parts, shape[0], case), _tree(fn, parts, shape[1], case)
    return tuple(_results(run(fn, *left, *right, case=case), case, ("out", "lse")))


@checker
def check_lse_merge(fn):
    """fn(out1, lse1, out2, lse2) -> (out [R, d], lse [R]): two partial results, each normalised over its own keys
    with its rows' log-sum-exps (-inf for a row that saw none of its keys), merged into one partial result over
    both sides' keys that can itself be merged again."""
    pairs, (tree_case, parts, trees, whole) = _merge_cases()
    for case, inputs in pairs:
        given = tuple(a.copy() for a in inputs)
        got = _results(run(fn, *given, case=case), case, ("out", "lse"))
        _unchanged(inputs, given, ("out1", "lse1", "out2", "lse2"), case,
                   "compute new arrays (w = np.exp(lse1 - top)) rather than lse1 -= ...")
        want = _merge_two(*inputs)
        _same_shapes_and_dtypes(got, want, ("out", "lse"), case,
                                "out is [R, d] like out1; lse is one number per row, [R], like lse1")
        _merge_verdict(got, want, inputs, case)
    for name, shape in trees:
        case = f"{tree_case} {name}"
        got = _tree(fn, parts, shape, case)
        if not all(_close(g, w) for g, w in zip(got, whole, strict=True)):
            reject(f"for {case} the result differs from attention over all the keys",
                   "each merge must hand back an (out, lse) as good as a slice's own: lse = log of both sides' "
                   "total weight, and a row that neither side saw stays (0, -inf)")
    return passed("your merge weighs each side by exp(lse_i - lse), returns the lse of both, leaves a row that "
                  "saw nothing at (0, -inf), stays finite near 1000, keeps float32, and any tree of merges gives "
                  "attention over all the keys")


def _merge_verdict(got, want, inputs, case):
    if all(_close(g, w) for g, w in zip(got, want, strict=True)):
        return
    empty = np.isneginf(want[1])
    if empty.any() and _nan_where_nothing_was_seen(got, empty):
        reject(f"for {case} your merge has nan in the row that neither side saw",
               "both lses are -inf there, so the larger is -inf and lse - top = -inf + inf = nan. (0, -inf) is "
               "the merge's identity: return out 0 and lse -inf for such a row (shift by 0 where top is -inf)")
    slip = first_slip(tuple(got), _MERGE_SLIPS, inputs, same=_same)
    if slip is not None:
        reject_slip(slip, case)
    if not all(np.isfinite(g[~empty]).all() for g in got):
        reject(f"for {case} your merge has nan or inf in a row that saw keys",
               "exp(1000) overflows, and exp(-1000) underflows to 0: shift each row by its own larger lse "
               "(np.maximum(lse1, lse2)) before exp, so its larger weight is exactly 1; a side a row never saw has "
               "lse = -inf and weight exp(-inf - top) = 0")
    name = "out" if not _close(got[0], want[0]) else "lse"
    reject(f"for {case} your {name} differs from the merge of the two sides",
           "top = np.maximum(lse1, lse2); w_i = exp(lse_i - top); out = (w1 out1 + w2 out2) / (w1 + w2); "
           "lse = top + log(w1 + w2)")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_online_update.reference = online_update
check_online_finish.reference = finish
check_lse_merge.reference = _merge_two
