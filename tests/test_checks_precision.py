"""The lesson 10 checkers pass right answers and name each classic wrong one: a table of wrong answers per checker."""
import numpy as np
import pytest

from kvlesson.online import finish, merge_partials, online_update
from kvlesson.teaching.checks import check_lse_merge, check_online_finish, check_online_update

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


def update_guarded_only_when_all_rows_are_empty(m, l, o, s, v):
    """Guards the first block of the whole state, not each row: nan once one row is empty beside others that are
    not, as in windowed attention (issue 18: the old checker let this pass)."""
    return update(m, l, o, s, v, guard=bool(np.isneginf(m).all()))


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


UPDATE_WRONG = [  # (wrong answer, words its verdict must contain)
    (lambda *a: update(*a, scale_l=False, scale_o=False), "l and o are not rescaled when the max moves"),
    (lambda *a: update(*a, scale_o=False), "l is rescaled but o is not"),
    (lambda *a: update(*a, scale_l=False), "o is rescaled but l is not"),
    (lambda *a: update(*a, invert=True), "the rescaling factor is upside down"),
    (lambda *a: update(*a, running=False), "the new max forgets the running one"),
    (lambda *a: update(*a, divide=True), "o has been divided by l"),
    (lambda *a: update(*a, guard=False), "nan in the row that saw no key"),
    (update_guarded_only_when_all_rows_are_empty, "row 1 none yet, and a block row 1 still does not see"),
    (update_no_shift, "the block's exps are not shifted by the new max"),
    (update_overflows, "subtract m_new inside every exp"),
    (update_no_keepdims, "keepdims=True"),
    (update_float64, "float32 in, float32 out"),
    (update_in_place, "changed o in place"),
    (update_wrong_order, "differs from the reference"),
    (lambda *a: update(*a)[:2], "returned a tuple of 2 items; expected the tuple (m, l, o)"),
    (lambda *a: np.zeros(3), "returned a ndarray; expected the tuple (m, l, o)"),
    (lambda *a: ("m", "l", "o"), "your function, as m, returned text"),
    (lambda *a: (1 / 0), "ZeroDivisionError"),
]


@pytest.mark.parametrize("fn, words", UPDATE_WRONG)
def test_update_wrong_answers_get_their_hint(fn, words):
    v = check_online_update(fn)
    assert not v and repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_the_no_rescale_slip_is_named_where_the_max_moves():
    assert "the running max moves up" in repr(check_online_update(lambda *a: update(*a, scale_o=False)))


def test_an_update_guarded_only_for_an_all_empty_state_gets_the_row_by_row_hint():
    v = check_online_update(update_guarded_only_when_all_rows_are_empty)
    assert "nan in the row that saw no key" in repr(v) and "row by row" in v.hint


def test_the_text_hint_no_longer_says_returned_twice():
    """Issue 18: the hint read "the m you returned returned text"."""
    v = check_online_update(lambda *a: ("m", "l", "o"))
    assert "returned returned" not in repr(v) and "you returned returned" not in repr(v)


# ------------------------------------------------------------------------------------------------ the finish


def finish_by_hand(m, l, o):
    seen = l > 0
    out = np.where(seen, o / np.where(seen, l, 1), 0)
    lse = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)[:, 0]
    return out.astype(o.dtype), lse.astype(m.dtype)


def guarded(fn):
    """fn for the rows that saw keys, and the (0, -inf) convention for the others: isolates fn's own slip."""
    def answer(m, l, o):
        out, lse = fn(m, np.where(l > 0, l, 1), o)
        seen = l[:, 0] > 0
        return np.where(seen[:, None], out, 0).astype(o.dtype), np.where(seen, lse, -np.inf).astype(m.dtype)
    return answer


def finish_in_place(m, l, o):
    out, lse = finish_by_hand(m, l, o)
    o /= np.where(l > 0, l, 1)
    return out, lse


def test_finish_reference_and_hand_written_pass():
    assert check_online_finish(finish)
    assert check_online_finish(finish_by_hand)


FINISH_WRONG = [
    (guarded(lambda m, l, o: (o / l, np.log(l)[:, 0])), "your lse is log(l)"),
    (guarded(lambda m, l, o: (o / l, m[:, 0])), "your lse is the max m alone"),
    (guarded(lambda m, l, o: (o / l, (m + l)[:, 0])), "your lse adds l itself to m"),
    (guarded(lambda m, l, o: (o / l, (m + np.log2(l))[:, 0])), "log base 2"),
    (guarded(lambda m, l, o: (o, (m + np.log(l))[:, 0])), "your out is o itself"),
    (guarded(lambda m, l, o: (o * l, (m + np.log(l))[:, 0])), "your out is o * l"),
    (guarded(lambda m, l, o: (o / l, np.log(np.exp(m) * l)[:, 0])), "exp(m) overflows near 1000"),
    (lambda m, l, o: (o / l, (m + np.log(l))[:, 0]), "nan in the row that saw no key"),
    (lambda m, l, o: (finish(m, l, o)[0], m + np.log(np.where(l > 0, l, 1))), "lse is one number per row, [R]"),
    (lambda m, l, o: tuple(a.astype(np.float64) for a in finish(m, l, o)), "float32 in, float32 out"),
    (finish_in_place, "changed o in place"),
    (lambda m, l, o: finish(m, l, o)[0], "expected the tuple (out, lse)"),
    (lambda m, l, o: finish(m, l, o)[::-1], "your out has shape"),
    (lambda m, l, o: (finish(m, l, o)[0], "lse"), "your function, as lse, returned text"),
    (guarded(lambda m, l, o: (o / l, (m + np.log(l))[:, 0] + 1e-3)), "your lse differs from log sum_j exp(s_j)"),
]


@pytest.mark.parametrize("fn, words", FINISH_WRONG)
def test_finish_wrong_answers_get_their_hint(fn, words):
    v = check_online_finish(fn)
    assert not v and repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


# ------------------------------------------------------------------------------------------------ the merge


def merge(o1, l1, o2, l2, *, shift="row", normalise=True, lse="right", guard=True):
    """A hand-written pairwise merge; each keyword turns one classic bug on."""
    top = {"row": np.maximum(l1, l2), "all": max(l1.max(), l2.max()), "none": np.zeros_like(l1)}[shift]
    if guard:
        top = np.where(np.isneginf(top), 0, top)
    w1, w2 = np.exp(l1 - top)[:, None], np.exp(l2 - top)[:, None]
    total = w1 + w2
    if guard:
        out = np.where(total > 0, (w1 * o1 + w2 * o2) / np.where(total > 0, total, 1), 0)
    else:
        out = (w1 * o1 + w2 * o2) / (total if normalise else 1)
    if not normalise:
        out = w1 * o1 + w2 * o2
    merged = {"right": top + np.log(total[:, 0]) if not guard else
              np.where(total[:, 0] > 0, top + np.log(np.where(total[:, 0] > 0, total[:, 0], 1)), -np.inf),
              "max": np.maximum(l1, l2), "sum": l1 + l2, "no top": np.log(total[:, 0])}[lse]
    return out.astype(o1.dtype), merged.astype(l1.dtype)


def merge_with_logaddexp(o1, l1, o2, l2):
    """Another right answer: numpy's logaddexp for the lse, and the weights read back from it."""
    lse = np.logaddexp(l1, l2)
    seen = np.isfinite(lse)
    safe = np.where(seen, lse, 0)
    w1, w2 = np.exp(l1 - safe)[:, None], np.exp(l2 - safe)[:, None]
    return np.where(seen[:, None], w1 * o1 + w2 * o2, 0).astype(o1.dtype), lse


def merge_global_shift(o1, l1, o2, l2):
    """Shifts every row by the largest lse of the whole array; rows that saw nothing are handled."""
    empty = np.isneginf(l1) & np.isneginf(l2)
    top = max(l1.max(), l2.max())
    w1, w2 = np.exp(l1 - top)[:, None], np.exp(l2 - top)[:, None]
    out = np.where(empty[:, None], 0, (w1 * o1 + w2 * o2) / (w1 + w2))
    return out, np.where(empty, -np.inf, top + np.log(w1 + w2)[:, 0])


def merge_in_place(o1, l1, o2, l2):
    out, lse = merge(o1, l1, o2, l2)
    l1 -= np.where(np.isneginf(lse), 0, lse)
    return out, lse


def test_merge_reference_and_hand_written_pass():
    assert check_lse_merge(lambda o1, l1, o2, l2: merge_partials(np.stack([o1, o2]), np.stack([l1, l2])))
    assert check_lse_merge(merge)
    assert check_lse_merge(merge_with_logaddexp)


MERGE_WRONG = [
    (lambda o1, l1, o2, l2: ((o1 + o2) / 2, merge(o1, l1, o2, l2)[1]), "your output is a plain average"),
    (lambda *a: merge(*a, lse="max"), "your lse keeps only the larger side's"),
    (lambda *a: merge(*a, lse="sum"), "your lse adds the two lses"),
    (lambda o1, l1, o2, l2: (merge(o1, l1, o2, l2)[0], (l1 + l2) / 2), "your lse averages the two lses"),
    (lambda *a: merge(*a, lse="no top"), "your lse is missing the shift"),
    (lambda *a: merge(*a, normalise=False), "the weights of the two sides do not sum to 1"),
    (lambda o1, l1, o2, l2: ((l1[:, None] * o1 + l2[:, None] * o2) / (l1 + l2)[:, None], merge(o1, l1, o2, l2)[1]),
     "weighted by their lse itself"),
    (merge_global_shift, "rows far below the largest lse come out nan"),
    (lambda *a: merge(*a, shift="all"), "shift each row by its own larger lse"),
    (lambda *a: merge(*a, guard=False), "nan in the row that neither side saw"),
    (lambda *a: merge(*a, shift="none"), "exp(1000) overflows"),
    (merge_in_place, "changed lse1 in place"),
    (lambda *a: tuple(x.astype(np.float64) for x in merge(*a)), "float32 in, float32 out"),
    (lambda *a: merge(*a)[0], "expected the tuple (out, lse)"),
    (lambda *a: (merge(*a)[0], merge(*a)[1][:, None]), "your lse has shape (4, 1); expected (4,)"),
    (lambda *a: merge(*a)[::-1], "your out has shape (4,); expected (4, 3)"),
    (lambda o1, l1, o2, l2: (o1, l1), "differs from the merge of the two sides"),
    (lambda o1, l1, o2, l2: (None, l1), "your function, as out, returned None"),
]


@pytest.mark.parametrize("fn, words", MERGE_WRONG)
def test_merge_wrong_answers_get_their_hint(fn, words):
    v = check_lse_merge(fn)
    assert not v and repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_a_merge_right_on_every_pair_but_not_mergeable_again_fails():
    """The output alone is right with lse = max(lse1, lse2); a merge of merges then weighs the pair too little."""
    v = check_lse_merge(lambda *a: merge(*a, lse="max"))
    assert "mergeable again" in v.hint


def test_the_tree_cases_catch_a_merge_that_is_right_only_on_the_pairs_it_was_shown():
    """A merge that answers the reference on the checker's pairs but merges anything else by averaging: only the
    trees, whose inputs are the learner's own merged results, can see it."""
    from kvlesson.teaching.checks.precision import _merge_cases

    seen = [tuple(a.copy() for a in inputs) for _, inputs in _merge_cases()[0]]

    def memorised(*a):
        if any(all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, s, strict=True)) for s in seen):
            return merge(*a)
        return (a[0] + a[2]) / 2, np.maximum(a[1], a[3])

    v = check_lse_merge(memorised)
    assert not v and "merged" in v.problem and "differs from attention over all the keys" in v.problem


# ------------------------------------------------------------------------------------------------ all three


def test_checkers_do_not_leak_numpy_warnings():
    """Overflowing wrong answers must not spill RuntimeWarnings (pytest runs with -W error)."""
    assert not check_online_update(update_overflows)
    assert not check_online_finish(lambda m, l, o: (o / l, (m + np.log(l))[:, 0]))
    assert not check_lse_merge(lambda *a: merge(*a, shift="none"))


def test_an_unfilled_student_copy_is_told_to_write_the_code():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (check_online_update, check_online_finish, check_lse_merge):
        v = check(todo)
        assert not v and v.stub and "replace the `raise NotImplementedError(...)` line" in repr(v)


def test_a_missing_return_is_named():
    for check in (check_online_update, check_online_finish, check_lse_merge):
        assert "returned None" in repr(check(lambda *args: None))


def test_each_checker_has_a_reference_for_later_cells():
    for check, reference in ((check_online_update, online_update), (check_online_finish, finish)):
        assert check.reference is reference and check(check.reference)
    assert check_lse_merge(check_lse_merge.reference)
