"""The lesson 01 checkers pass right answers and name each classic wrong one."""
import math

import numpy as np
import pytest

from kvlesson import attention
from kvlesson.teaching.checks import check_attention, check_softmax

# ---------------------------------------------------------------------------------------------- softmax


def softmax_right(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_no_max(s):
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_global_max(s):
    e = np.exp(s - s.max())
    return e / e.sum(axis=-1, keepdims=True)


def softmax_axis0(s):
    e = np.exp(s - s.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def softmax_axis1(s):
    """Right for 2-D input only: axis 1 is not the keys axis of [H, T, S]."""
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_no_keepdims(s):
    e = np.exp(s - s.max(axis=-1))
    return e / e.sum(axis=-1)


def softmax_global_sum(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum()


def softmax_upcast(s):
    s = s.astype(np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_unmasks(s):
    """Replaces -inf with 0, so masked keys come back to life."""
    return softmax_right(np.where(np.isneginf(s), 0.0, s))


def softmax_raises(s):
    raise RuntimeError("boom")


def softmax_first_shift(s):
    """Shifts by the first score: safe only when the first score is the row's largest."""
    e = np.exp(s - s[..., :1])
    return e / e.sum(axis=-1, keepdims=True)


def softmax_min_shift(s):
    e = np.exp(s - s.min(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_no_division(s):
    return np.exp(s - s.max(axis=-1, keepdims=True))


def softmax_in_place(s):
    s -= s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_list(s):
    return softmax_right(s).tolist()


def test_softmax_right_answer_passes():
    v = check_softmax(softmax_right)
    assert v and repr(v).startswith("PASS")


@pytest.mark.parametrize("fn, words", [
    (softmax_no_max, "subtract each row's max"),
    (softmax_global_max, "global max"),
    (softmax_axis0, "normalise over the last axis"),
    (softmax_axis1, "axis=-1"),
    (softmax_no_keepdims, "keepdims=True"),
    (softmax_global_sum, "whole array sums to 1"),
    (softmax_upcast, "float64"),
    (softmax_unmasks, "-inf got a nonzero weight"),
    (softmax_raises, "RuntimeError: boom"),
    (softmax_first_shift, "only helps when the first score is the largest"),
    (softmax_min_shift, "not its min"),
    (softmax_no_division, "divide each row by its own sum"),
    (softmax_in_place, "changed its input in place"),
    (softmax_list, "return a numpy array"),
])
def test_softmax_wrong_answers_get_their_hint(fn, words):
    v = check_softmax(fn)
    assert not v
    assert repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_softmax_no_max_fails_on_the_large_case_not_before():
    assert "scores near 1000" in repr(check_softmax(softmax_no_max))


# -------------------------------------------------------------------------------------------- attention


def attend(q, k, v, *, scale=None, mask="tril", axis=-1, mask_after=False, max_sub=True):
    """A configurable hand-written attention: each keyword turns one classic bug on."""
    H, T, d = q.shape
    if T == 0:
        return np.zeros_like(q)
    s = q @ k.transpose(0, 2, 1) * (1 / math.sqrt(d) if scale is None else scale)  # [H, T, S]
    keep = {"tril": np.tril(np.ones((T, T), bool)), "triu": np.triu(np.ones((T, T), bool)),
            "strict": np.tril(np.ones((T, T), bool), k=-1), "none": np.ones((T, T), bool)}[mask]
    if not mask_after:
        s = np.where(keep, s, -np.inf)
    if max_sub:
        s = s - s.max(axis=axis, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=axis, keepdims=True)
    if mask_after:
        p = p * keep
    return p @ v


def attention_right(q, k, v):
    return attend(q, k, v)


def attention_np_sqrt(q, k, v):
    """np.sqrt(d) is a float64 scalar: under NumPy 2 it upcasts float32 scores."""
    return attend(q, k, v, scale=1 / np.sqrt(q.shape[-1]))


def attention_no_empty_case(q, k, v):
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


def attention_k_dot_T(q, k, v):
    return q @ k.T @ v


def attention_in_place(q, k, v):
    q /= math.sqrt(q.shape[-1])
    return attend(q, k, v, scale=1.0)


def attention_swapped_where(q, k, v):
    T = q.shape[1]
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((T, T), bool)), -np.inf, s)
    return softmax_right(s) @ v


def attention_multiply_by_mask(q, k, v):
    """Multiplies scores by the 0/1 mask: masked scores become 0, not -inf, and keep weight exp(0)."""
    T = q.shape[1]
    if T == 0:
        return np.zeros_like(q)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1]) * np.tril(np.ones((T, T)))
    return softmax_right(s) @ v


def attention_mask_after_softmax(q, k, v):
    """Softmax over every key, then the future zeroed and the rows renormalised: right on paper, nan for big scores."""
    T = q.shape[1]
    if T == 0:
        return np.zeros_like(q)
    p = softmax_right(q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])) * np.tril(np.ones((T, T), q.dtype))
    return p / p.sum(axis=-1, keepdims=True) @ v


def attention_values_from_k(q, k, v):
    return attend(q, k, k)


def attention_scores_q_q(q, k, v):
    return attend(q, q, v)


def attention_weights_only(q, k, v):
    """Forgets the values: returns the [H, T, S] weights."""
    T = q.shape[1]
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    return softmax_right(np.where(np.tril(np.ones((T, T), bool)), s, -np.inf))


def attention_sees_one_ahead(q, k, v):
    """np.tril(..., k=1): each query also reads the next token."""
    T = q.shape[1]
    if T == 0:
        return np.zeros_like(q)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    return softmax_right(np.where(np.tril(np.ones((T, T), bool), k=1), s, -np.inf)) @ v


def attention_right_masks_with_big_negative(q, k, v):
    """-1e9 instead of -inf: exp underflows to exactly 0, so it is equal to the reference; accepted."""
    T = q.shape[1]
    if T == 0:
        return np.zeros_like(q)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    return softmax_right(np.where(np.tril(np.ones((T, T), bool)), s, q.dtype.type(-1e9))) @ v


def test_attention_reference_and_hand_written_pass():
    assert check_attention(attention)
    v = check_attention(attention_right)
    assert v and repr(v).startswith("PASS")
    assert check_attention(attention_right_masks_with_big_negative)


@pytest.mark.parametrize("fn, words", [
    (lambda q, k, v: attend(q, k, v, scale=1.0), "without the 1/sqrt(d) scale"),
    (lambda q, k, v: attend(q, k, v, scale=1 / q.shape[-1]), "divided by d, not sqrt(d)"),
    (lambda q, k, v: attend(q, k, v, scale=math.sqrt(q.shape[-1])), "multiplied by sqrt(d)"),
    (lambda q, k, v: attend(q, k, v, mask="none"), "the future leaks in"),
    (attention_multiply_by_mask, "the future leaks in"),
    (lambda q, k, v: attend(q, k, v, mask="triu"), "upside down"),
    (lambda q, k, v: attend(q, k, v, mask="strict"), "queries [0] are nan"),
    (attention_swapped_where, "queries [5] are nan"),
    (lambda q, k, v: attend(q, k, v, axis=-2), "each query's weights sum to 1"),
    (lambda q, k, v: attend(q, k, v, mask_after=True), "the -inf go in before the exp"),
    (attention_np_sqrt, "math.sqrt(d)"),
    (lambda q, k, v: attend(q, k, v, max_sub=False), "subtract each row's max"),
    (attention_no_empty_case, "np.zeros_like(q)"),
    (attention_k_dot_T, "k.T reverses"),
    (attention_in_place, "changed q in place"),
    (attention_mask_after_softmax, "mask before the softmax"),
    (attention_values_from_k, "p @ v, not p @ k"),
    (attention_scores_q_q, "not q against itself"),
    (attention_weights_only, "weights [H, T, S] @ v [H, S, d]"),
    (attention_sees_one_ahead, "query 0 reads keys [0, 1]; it should read 0..0"),
    (lambda q, k, v: attend(q, k, v).tolist(), "return a numpy array"),
])
def test_attention_wrong_answers_get_their_hint(fn, words):
    v = check_attention(fn)
    assert not v
    assert repr(v).startswith("NOT YET")
    assert words in repr(v), repr(v)


def test_attention_float32_upcast_is_reported_on_the_float32_case():
    assert "float32" in repr(check_attention(attention_np_sqrt))


def test_attention_mask_upside_down_names_the_counts():
    msg = repr(check_attention(lambda q, k, v: attend(q, k, v, mask="triu")))
    assert "query 0 reads 6 keys and query 5 reads 1; it should be 1 and 6" in msg


def test_checkers_do_not_leak_numpy_warnings():
    """Overflowing wrong answers must not spill RuntimeWarnings (pytest runs with -W error)."""
    assert not check_softmax(softmax_no_max)
    assert not check_attention(lambda q, k, v: attend(q, k, v, max_sub=False))


def test_an_unfilled_student_copy_is_told_to_write_the_code():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (check_softmax, check_attention):
        v = check(todo)
        assert not v and "replace the `raise NotImplementedError(...)` line" in repr(v)


def test_a_missing_return_is_named():
    for check in (check_softmax, check_attention):
        assert "is the return statement missing?" in repr(check(lambda *args: None))


def test_each_checker_passes_its_own_reference():
    """Lessons fall back on `.reference` (through yours_or_ours) while an exercise is unsolved."""
    assert check_softmax(check_softmax.reference) and check_attention(check_attention.reference)
