"""Checkers for lesson 10: one step of the online softmax, and the log-sum-exp merge of split-KV decode.

Each runs the learner's function on seeded cases and rejects any answer that differs from kvlesson.online's. To
say why, it compares the answer with the classic slips: for the update, a state that is not rescaled when the max
moves (or only half of it), an inverted factor, the block's max in place of the running one, nan for a row that
has seen no key; for the merge, a plain average, exp without the max shift, weights that are not normalised.
"""
import numpy as np

from kvlesson.online import merge_partials, online_update
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_online_update", "check_lse_merge"]


# ------------------------------------------------------------------------------------------ the update step

def _fresh(R, d, dtype=np.float64):
    """The state of R rows that have seen no key: m = -inf, l = 0, o = 0."""
    return np.full((R, 1), -np.inf, dtype), np.zeros((R, 1), dtype), np.zeros((R, d), dtype)


def _update_cases():
    """(case, (m, l, o, s, v)) for each case; the states are reached with the reference update itself."""
    rng = np.random.default_rng(10)
    R, b, d = 3, 4, 2

    def block(shift=0.0, dtype=np.float64):
        return (rng.standard_normal((R, b)) + shift).astype(dtype), rng.standard_normal((b, d)).astype(dtype)

    low = online_update(*_fresh(R, d), *block())  # the state after one block of ordinary scores
    masked, v_masked = block()
    masked[0, 1:] = -np.inf  # row 0 keeps one key, row 2 none of this block's
    masked[2, :] = -np.inf
    empty_row, v_empty = block()
    empty_row[1, :] = -np.inf  # row 1 has still seen no key after this block
    big = online_update(*_fresh(R, d), *block(1000.0))
    m32 = tuple(a.astype(np.float32) for a in low)
    return [
        ("the first block (from the empty state m = -inf, l = 0, o = 0)", (*_fresh(R, d), *block())),
        ("a second block whose scores are higher (the running max moves up)", (*low, *block(4.0))),
        ("a second block whose scores are lower (the running max stays)", (*low, *block(-4.0))),
        ("a block with masked keys (-inf), one row fully masked", (*low, masked, v_masked)),
        ("a first block where row 1 sees no key at all (it must stay m = -inf, l = 0, o = 0)",
         (*_fresh(R, d), empty_row, v_empty)),
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


def _update_result(got, case):
    if got is None:
        reject(f"for {case} your function returned None", "is the return statement missing?")
    if isinstance(got, np.ndarray) or not isinstance(got, (tuple, list)) or len(got) != 3:
        what = f"a {type(got).__name__}" + (f" of {len(got)} items" if isinstance(got, (tuple, list)) else "")
        reject(f"for {case} your function returned {what}; expected the tuple (m, l, o)",
               "return m_new, l_new, o_new: the whole state after the block")
    return [as_array(g, case, f"the {name} you returned") for name, g in zip("mlo", got, strict=True)]


@checker
def check_online_update(fn):
    """fn(m, l, o, s, v) -> (m, l, o): one block of keys into the running softmax state.

    m, l [R, 1] running max and sum of exp(score - m); o [R, d] sum of exp(score - m) * value, unnormalised;
    s [R, b] the block's scores (-inf where masked); v [b, d] its values.
    """
    for case, inputs in _update_cases():
        given = tuple(a.copy() for a in inputs)
        got = _update_result(run(fn, *given, case=case), case)
        for name, before, after in zip(("m", "l", "o", "s", "v"), inputs, given, strict=True):
            if not np.array_equal(before, after, equal_nan=True):
                reject(f"for {case} your function changed {name} in place",
                       "return new arrays (o = alpha * o + ...) rather than o *= ...: the caller may still need the "
                       "old state")
        want = online_update(*inputs)
        _update_verdict(got, want, inputs, case)
    return passed("your update rescales l and o when the max moves, keeps rows that saw nothing empty, stays "
                  "finite near 1000 and keeps float32")


def _update_verdict(got, want, inputs, case):
    for name, g, w in zip("mlo", got, want, strict=True):
        if g.shape != w.shape:
            reject(f"for {case} your {name} has shape {g.shape}; expected {w.shape}",
                   "m and l are [R, 1] (keepdims=True on the max and the sum), o is [R, d]")
        if g.dtype != w.dtype:
            reject(f"for {case} your {name} is {g.dtype}; expected {w.dtype}",
                   "float32 in, float32 out: a float64 constant (np.float64, np.full(..., -np.inf) without a dtype) "
                   "upcasts the state")
    tol = dict(rtol=1e-5, atol=1e-6) if want[0].dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    close = [np.allclose(g, w, equal_nan=True, **tol) for g, w in zip(got, want, strict=True)]
    if all(close):
        return
    has_nan = any(np.isnan(g).any() for g in got)
    if has_nan and "sees no key" in case:
        reject(f"for {case} your state has nan in the row that saw no key",
               "with m = m_new = -inf, exp(m - m_new) is exp(-inf + inf) = nan; shift by 0 where m_new is -inf "
               "(np.where(np.isneginf(m_new), 0, m_new)), so that row keeps l = 0 and o = 0")
    slip = first_slip(tuple(got), _UPDATE_SLIPS, inputs, same=_same_state)
    if slip is not None:
        reject_slip(slip, case)
    if has_nan or not all(np.isfinite(g).all() for g in got[1:]):
        reject(f"for {case} your state has nan or inf",
               "exp of a large number overflows: subtract m_new inside every exp, so each one is at most 1")
    name = "mlo"[close.index(False)]
    reject(f"for {case} your {name} differs from the reference",
           "m_new = max(m, block max); alpha = exp(m - m_new); p = exp(s - m_new); l_new = alpha * l + p.sum(-1); "
           "o_new = alpha * o + p @ v")


def _same_state(got, wrong):
    return all(np.shape(g) == np.shape(w) and np.allclose(g, w, rtol=1e-5, atol=1e-8, equal_nan=True)
               for g, w in zip(got, wrong, strict=True))


# ------------------------------------------------------------------------------------------------ the merge

def _split(q, k, v, bounds):
    """One query row per row of q [R, d] over keys k, v [S, d] cut at `bounds` -> (outs [n, R, d], lses [n, R]).

    A slice may be masked out for a row (mask [R, S] False there): its output is 0 and its lse -inf."""
    s = q @ k.T / np.sqrt(q.shape[-1])  # [R, S]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        m = s[:, a:b].max(axis=-1, keepdims=True)
        p = np.exp(s[:, a:b] - m)
        outs.append(p @ v[a:b] / p.sum(axis=-1, keepdims=True))
        lses.append(m[:, 0] + np.log(p.sum(axis=-1)))
    return np.stack(outs), np.stack(lses)


def _merge_cases():
    rng = np.random.default_rng(11)
    R, S, d = 3, 12, 4

    def qkv(scale=1.0, rows=R):
        return rng.standard_normal((rows, d)) * scale, rng.standard_normal((S, d)), rng.standard_normal((S, d))

    two = _split(*qkv(), [0, 7, S])
    one = _split(*qkv(), [0, S])
    five = _split(*qkv(), [0, 1, 3, 4, 9, S])
    outs, lses = _split(*qkv(), [0, 4, 8, S])
    outs[1, 0], lses[1, 0] = 0.0, -np.inf  # row 0 saw no key of slice 1 (its window had moved past it)
    q, k, v = qkv()
    q[0] *= 60.0  # row 0's scores reach the hundreds, the other rows' stay near 0
    big = _split(q, k, v, [0, 5, S])
    big = big[0], big[1] + np.array([1000.0, 0.0, 0.0])  # and its lse sits near 1000: exp overflows unshifted
    f32 = tuple(a.astype(np.float32) for a in _split(*qkv(), [0, 6, S]))
    return [
        ("two slices of 7 and 5 keys", two),
        ("one slice (nothing to merge)", one),
        ("five slices of uneven length", five),
        ("three slices, one of which row 0 never saw (its lse is -inf, its output 0)", (outs, lses)),
        ("two slices where row 0's lse is near 1000 and the others' near 0", big),
        ("float32 outputs and lses", f32),
    ]


def _weights(lses, top):
    return np.exp(lses - top)[..., None]


_MERGE_SLIPS = [
    Slip("plain average", lambda outs, lses: outs.mean(axis=0), "for {case} your merge is a plain average",
         "each slice is normalised over its own keys only; a slice whose scores are larger holds more of the total "
         "weight. Weigh slice i by exp(lse_i - lse), lse = log(sum_i exp(lse_i))"),
    Slip("no shift", lambda outs, lses: (np.exp(lses)[..., None] * outs).sum(0) / np.exp(lses)[..., None].sum(0),
         "for {case} your merge has nan or inf",
         "exp(1000) overflows; subtract each row's largest lse first (lses.max(axis=0)): the weights keep their "
         "ratios and the largest becomes exactly 1"),
    Slip("global shift", lambda outs, lses: (_weights(lses, lses.max()) * outs).sum(0)
         / _weights(lses, lses.max()).sum(0),
         "for {case} rows far below the largest lse come out nan",
         "shift each row by its own largest lse (lses.max(axis=0)), not by one number for the whole array: "
         "exp(-1000) underflows to 0 and 0/0 is nan"),
    Slip("not normalised", lambda outs, lses: (_weights(lses, lses.max(axis=0)) * outs).sum(0),
         "for {case} the weights of the slices do not sum to 1",
         "divide by the sum of the weights, sum_i exp(lse_i - top): the shift by top leaves them unnormalised"),
    Slip("linear in lse", lambda outs, lses: (lses[..., None] * outs).sum(0) / lses[..., None].sum(0),
         "for {case} the slices are weighted by their lse itself",
         "an lse is a logarithm: the weight of slice i is exp(lse_i - lse), not lse_i"),
    Slip("wrong axis", lambda outs, lses: (_weights(lses, lses.max(axis=-1, keepdims=True)) * outs).sum(0)
         / _weights(lses, lses.max(axis=-1, keepdims=True)).sum(0),
         "for {case} your shift mixes the rows",
         "the slices are axis 0 of lses [n, R]: take the max over axis=0, one per row"),
]


@checker
def check_lse_merge(fn):
    """fn(outs, lses) -> [R, d]: outs [n, R, d] each slice's normalised output, lses [n, R] its log-sum-exp."""
    for case, (outs, lses) in _merge_cases():
        given = (outs.copy(), lses.copy())
        got = as_array(run(fn, *given, case=case), case)
        for name, before, after in zip(("outs", "lses"), (outs, lses), given, strict=True):
            if not np.array_equal(before, after, equal_nan=True):
                reject(f"for {case} your function changed {name} in place",
                       "compute new arrays (w = np.exp(lses - top)) rather than lses -= ...")
        want = merge_partials(outs, lses)
        _merge_verdict(got, want, outs, lses, case)
    return passed("your merge weighs each slice by exp(lse_i - lse), ignores slices a row never saw, stays finite "
                  "near 1000 and keeps float32")


def _merge_verdict(got, want, outs, lses, case):
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "sum over the slices, axis 0 of outs [n, R, d]; the weights need a trailing axis ([..., None])")
    if got.dtype != want.dtype:
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
               "float32 in, float32 out: something upcast to float64")
    tol = dict(rtol=1e-5, atol=1e-6) if want.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    if np.allclose(got, want, **tol):
        return
    slip = first_slip(got, _MERGE_SLIPS, (outs, lses))
    if slip is not None:
        reject_slip(slip, case)
    if not np.isfinite(got).all():
        reject(f"for {case} your merge has nan or inf",
               "a slice a row never saw has lse = -inf: its weight exp(-inf - top) is exactly 0, so leave it in; "
               "and subtract each row's largest lse before exp")
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} the merged output differs from attention over all the keys (max abs error {err:.3g})",
           "top = lses.max(axis=0); w = np.exp(lses - top)[..., None]; return (w * outs).sum(0) / w.sum(0)")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_online_update.reference = online_update
check_lse_merge.reference = merge_partials
