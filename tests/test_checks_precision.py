"""The lesson 10 checkers pass right answers and name each classic wrong one."""
import numpy as np
import pytest

from kvlesson.online import merge_partials, online_update
from kvlesson.teaching.checks import check_lse_merge, check_online_update

# ------------------------------------------------------------------------------------------ the update step


def update(m, l, o, s, v, *, scale_l=True, scale_o=True, invert=False, running=True, guard=True, divide=False):
    """A hand-written update; each keyword turns one classic bug on."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True)) if running else s.max(axis=-1, keepdims=True)
    shift = np.where(np.isneginf(m_new), 0, m_new) if guard else m_new
    alpha = np.exp(shift - m) if invert else np.exp(m - shift)
    p = np.exp(s - shift)
    l_new = (alpha * l if scale_l else l) + p.sum(axis=-1, keepdims=True)
    o_new = (alpha * o if scale_o else o) + p @ v
    return m_new, l_new, o_new / l_new if divide else o_new


def update_no_keepdims(m, l, o, s, v):
    m_new, l_new, o_new = update(m, l, o, s, v)
    return m_new[:, 0], l_new[:, 0], o_new


def update_float64(m, l, o, s, v):
    return tuple(a.astype(np.float64) for a in update(m, l, o, s, v))


def update_in_place(m, l, o, s, v):
    m_new, l_new, o_new = update(m, l, o, s, v)
    o[...] = o_new
    return m_new, l_new, o


def update_no_shift(m, l, o, s, v):
    """Rescales the state but adds the block's exps unshifted: exp(s), not exp(s - m_new)."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m - m_new)
    return m_new, alpha * l + np.exp(s).sum(axis=-1, keepdims=True), alpha * o + np.exp(s) @ v


def update_overflows(m, l, o, s, v):
    """Right, except that exp(s - m_new) is written exp(s) / exp(m_new): inf / inf near 1000."""
    m_new, _, _ = update(m, l, o, s, v)
    shift = np.where(np.isneginf(m_new), 0, m_new)
    p = np.exp(s) / np.exp(shift)
    alpha = np.exp(m - shift)
    return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + p @ v


def update_wrong_order(m, l, o, s, v):
    m_new, l_new, o_new = update(m, l, o, s, v)
    return l_new, m_new, o_new


def test_update_reference_and_hand_written_pass():
    assert check_online_update(online_update)
    v = check_online_update(update)
    assert v and repr(v).startswith("PASS")


@pytest.mark.parametrize("fn, words", [
    (lambda *a: update(*a, scale_l=False, scale_o=False), "l and o are not rescaled when the max moves"),
    (lambda *a: update(*a, scale_o=False), "l is rescaled but o is not"),
    (lambda *a: update(*a, scale_l=False), "o is rescaled but l is not"),
    (lambda *a: update(*a, invert=True), "the rescaling factor is upside down"),
    (lambda *a: update(*a, running=False), "the new max forgets the running one"),
    (lambda *a: update(*a, divide=True), "o has been divided by l"),
    (lambda *a: update(*a, guard=False), "nan in the row that saw no key"),
    (update_no_shift, "the block's exps are not shifted by the new max"),
    (update_overflows, "subtract m_new inside every exp"),
    (update_no_keepdims, "keepdims=True"),
    (update_float64, "float32 in, float32 out"),
    (update_in_place, "changed o in place"),
    (update_wrong_order, "differs from the reference"),
    (lambda *a: update(*a)[:2], "returned a tuple of 2 items; expected the tuple (m, l, o)"),
    (lambda *a: np.zeros(3), "returned a ndarray; expected the tuple (m, l, o)"),
    (lambda *a: (1 / 0), "ZeroDivisionError"),
])
def test_update_wrong_answers_get_their_hint(fn, words):
    v = check_online_update(fn)
    assert not v and repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_the_no_rescale_slip_is_named_where_the_max_moves():
    assert "the running max moves up" in repr(check_online_update(lambda *a: update(*a, scale_o=False)))


# ------------------------------------------------------------------------------------------------ the merge


def merge(outs, lses, *, shift="row", normalise=True):
    top = {"row": lses.max(axis=0), "all": lses.max(), "none": 0.0, "slice": lses.max(axis=-1, keepdims=True)}[shift]
    w = np.exp(lses - top)[..., None]
    return (w * outs).sum(axis=0) / (w.sum(axis=0) if normalise else 1.0)


def merge_nan_on_unseen(outs, lses):
    """Skips nothing, but turns the -inf of a slice a row never saw into nan (inf - inf)."""
    top = np.where(np.isinf(lses), np.inf, lses).max(axis=0)
    w = np.exp(lses - top)[..., None]
    return (w * outs).sum(axis=0) / w.sum(axis=0)


def merge_in_place(outs, lses):
    lses -= lses.max(axis=0)
    w = np.exp(lses)[..., None]
    return (w * outs).sum(axis=0) / w.sum(axis=0)


def merge_float64(outs, lses):
    return merge(outs.astype(np.float64), lses.astype(np.float64))


def test_merge_reference_and_hand_written_pass():
    assert check_lse_merge(merge_partials)
    v = check_lse_merge(merge)
    assert v and repr(v).startswith("PASS")


@pytest.mark.parametrize("fn, words", [
    (lambda outs, lses: outs.mean(axis=0), "your merge is a plain average"),
    (lambda outs, lses: merge(outs, lses, shift="none"), "exp(1000) overflows"),
    (lambda outs, lses: merge(outs, lses, shift="all"), "rows far below the largest lse come out nan"),
    (lambda outs, lses: merge(outs, lses, normalise=False), "the weights of the slices do not sum to 1"),
    (lambda outs, lses: (lses[..., None] * outs).sum(0) / lses[..., None].sum(0), "weighted by their lse itself"),
    (lambda outs, lses: merge(outs, lses, shift="slice"), "your shift mixes the rows"),
    (merge_nan_on_unseen, "nan or inf"),
    (merge_in_place, "changed lses in place"),
    (merge_float64, "float32 in, float32 out"),
    (lambda outs, lses: outs.sum(axis=0), "differs from attention over all the keys"),
    (lambda outs, lses: outs[0], "differs from attention over all the keys"),
    (lambda outs, lses: merge(outs, lses)[None], "has shape (1, 3, 4); expected (3, 4)"),
])
def test_merge_wrong_answers_get_their_hint(fn, words):
    v = check_lse_merge(fn)
    assert not v and repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_checkers_do_not_leak_numpy_warnings():
    """Overflowing wrong answers must not spill RuntimeWarnings (pytest runs with -W error)."""
    assert not check_online_update(update_overflows)
    assert not check_lse_merge(lambda outs, lses: merge(outs, lses, shift="none"))


def test_an_unfilled_student_copy_is_told_to_write_the_code():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (check_online_update, check_lse_merge):
        v = check(todo)
        assert not v and v.stub and "replace the `raise NotImplementedError(...)` line" in repr(v)


def test_a_missing_return_is_named():
    for check in (check_online_update, check_lse_merge):
        assert "returned None" in repr(check(lambda *args: None))
