"""The lesson 04 checkers pass right answers and reject each wrong one with its own hint.

Each row of a wrong-answer table is a plausible learner answer, the words its verdict must contain, and
(in the docstring of the function) why it is wrong. Junk answers (None, text, ragged lists, functions that
raise) are fuzzed for every checker in test_checks_junk.py.
"""
import tracemalloc

import numpy as np
import pytest

from kvlesson import causal_mask
from kvlesson.teaching.checks import check_offset_mask, check_visible_counts

# ---------------------------------------------------------------------------------------------- offset mask


def offset_right(T, S):
    return np.arange(S) <= np.arange(S - T, S)[:, None]


def offset_tril_k(T, S):
    return np.tril(np.ones((T, S), dtype=bool), k=S - T)


def offset_by_loops(T, S):
    mask = np.zeros((T, S), bool)
    for i in range(T):
        for j in range(S):
            mask[i, j] = j <= S - T + i
    return mask


def offset_top_left(T, S):
    """The bug the lesson is about: np.tril anchors the diagonal at the top left."""
    return np.tril(np.ones((T, S)))


def offset_top_left_bool(T, S):
    return np.tril(np.ones((T, S), dtype=bool))


def offset_T_as_offset(T, S):
    """With T = 3, S = 7 this equals the strict mask (j <= 3 + i either way); only other shapes tell them apart."""
    return np.tril(np.ones((T, S), bool), k=T)


def offset_strict(T, S):
    return np.arange(S) < np.arange(S - T, S)[:, None]


def offset_one_ahead(T, S):
    return np.arange(S) <= np.arange(S - T, S)[:, None] + 1


def offset_flipped(T, S):
    return np.arange(S) >= np.arange(S - T, S)[:, None]


def offset_everything(T, S):
    """Right for decode (T = 1) only."""
    return np.ones((T, S), bool)


def offset_transposed(T, S):
    return offset_right(T, S).T


def offset_transposed_when_square(T, S):
    """When T == S a transposed mask has the right shape, so only its values give it away."""
    return causal_mask(T, S).T if T == S else causal_mask(T, S)


def offset_float(T, S):
    return np.tril(np.ones((T, S)), k=S - T)


def offset_additive(T, S):
    """0 where visible, -inf where hidden: what gets added to the scores, not the mask the exercise asks for."""
    return np.where(causal_mask(T, S), 0.0, -np.inf)


def offset_by_rows(T, S):
    """Right for T >= 1; for T = 0, np.array([]) has shape (0,) and loses the S columns."""
    return np.array([[j <= S - T + i for j in range(S)] for i in range(T)])


def offset_crashes_on_empty(T, S):
    mask = offset_right(T, S)
    mask[0, 0] = True  # IndexError when T = 0
    return mask


def offset_decode_only_hack(T, S):
    """Looks right for decode and a fresh prefill; wrong only for a chunk onto a cache."""
    return np.ones((1, S), bool) if T == 1 else np.tril(np.ones((T, S), bool))


def offset_one_odd_cell(T, S):
    """No known slip: the fallback hint and the counts must still name the query and the key."""
    mask = causal_mask(T, S).copy()
    if T > 1:
        mask[-1, 0] = False
    return mask


def offset_two_arguments_swapped(S, T):
    return causal_mask(T, S)


def test_offset_passes_right_answers():
    for fn in (offset_right, offset_tril_k, offset_by_loops, causal_mask):
        verdict = check_offset_mask(fn)
        assert verdict, verdict.message
        assert verdict.message.startswith("PASS")


OFFSET_WRONG = [
    (offset_top_left, ["T=3, S=7", "the first query (at position 4) sees 1 key; it should see 5", "top left"]),
    (offset_top_left_bool, ["sees 1 key; it should see 5", "k=S - T"]),
    (offset_decode_only_hack, ["T=3, S=7", "sees 1 key; it should see 5", "top left"]),
    (offset_T_as_offset, ["T=3, S=7", "sees 4 keys; it should see 5", "not T"]),
    (offset_strict, ["sees 4 keys; it should see 5", "key 4 is missing", "not <"]),
    (offset_one_ahead, ["sees 6 keys; it should see 5", "key 5 is in its future", "S - T + i + 1"]),
    (offset_flipped, ["sees 3 keys; it should see 5", "wrong way"]),
    (offset_everything, ["sees 7 keys; it should see 5", "see their future"]),
    (offset_transposed, ["shape (7, 3); expected (3, 7)", "[T, S], not [S, T]"]),
    (offset_transposed_when_square, ["T=4, S=4", "transpose of the right one"]),
    (offset_float, ["float64; expected bool", "dtype=bool"]),
    (offset_additive, ["-inf", "additive mask", "boolean mask itself"]),
    (offset_by_rows, ["T=0, S=5 (no new tokens)", "shape (0,); expected (0, 5)", "S columns"]),
    (offset_crashes_on_empty, ["T=0, S=5", "raised IndexError", "empty [0, S] array"]),
    (offset_one_odd_cell, ["query 2 (at position 6) sees 6 keys; it should see 7", "key 0 is missing",
                           "j <= S - T + i"]),
    (offset_two_arguments_swapped, ["T=3, S=7", "raised ValueError"]),
]


@pytest.mark.parametrize("fn, words", OFFSET_WRONG, ids=[f.__name__ for f, _ in OFFSET_WRONG])
def test_offset_rejects_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_offset_mask(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_T_as_the_offset_is_not_told_to_use_less_or_equal():
    """The old checker matched one case only, where k=T equals the strict mask, and said 'use <= not <'."""
    assert "not <" not in check_offset_mask(offset_T_as_offset).hint


def test_offset_stub_gets_the_stub_verdict():
    def stub(T, S):
        raise NotImplementedError("your turn")

    verdict = check_offset_mask(stub)
    assert not verdict and verdict.stub and "still raises NotImplementedError" in verdict.message


# ---------------------------------------------------------------------------------------------- visible counts


def counts_right(T, S, window=None):
    n = np.arange(S - T, S) + 1  # query i at S - T + i sees keys 0 .. S - T + i
    return n if window is None else np.minimum(n, window)


def counts_by_list(T, S, window=None):
    return np.array([min(S - T + i + 1, window or S) for i in range(T)], dtype=int)


def counts_from_mask(T, S, window=None):
    """Right numbers, but it builds the [T, S] mask the exercise says not to build."""
    return causal_mask(T, S, window).sum(axis=1)


def counts_from_a_long_arange(T, S, window=None):
    """Right numbers, but np.arange(S) is as long as the cache."""
    n = np.arange(S)[S - T:] + 1
    return n if window is None else np.minimum(n, window)


def counts_top_left(T, S, window=None):
    n = np.arange(T) + 1
    return n if window is None else np.minimum(n, window)


def counts_T_as_offset(T, S, window=None):
    n = np.arange(T, 2 * T) + 1
    return n if window is None else np.minimum(n, window)


def counts_without_itself(T, S, window=None):
    n = np.arange(S - T, S)
    return n if window is None else np.minimum(n, window)


def counts_window_ignored(T, S, window=None):
    return np.arange(S - T, S) + 1


def counts_window_plus_one(T, S, window=None):
    n = np.arange(S - T, S) + 1
    return n if window is None else np.minimum(n, window + 1)


def counts_window_minus_one(T, S, window=None):
    n = np.arange(S - T, S) + 1
    return n if window is None else np.minimum(n, window - 1)


def counts_all_S(T, S, window=None):
    return np.full(T, S)


def counts_float(T, S, window=None):
    return counts_right(T, S, window).astype(float)


def counts_no_window_argument(T, S):
    return np.arange(S - T, S) + 1


def counts_always_capped(T, S, window=None):
    """np.minimum(..., None) raises TypeError: the no-window case needs its own branch."""
    return np.minimum(np.arange(S - T, S) + 1, window)


def counts_mask_returned(T, S, window=None):
    return causal_mask(T, S, window)


def test_counts_pass_right_answers():
    for fn in (counts_right, counts_by_list):
        verdict = check_visible_counts(fn)
        assert verdict, verdict.message


COUNTS_WRONG = [
    (counts_from_mask, ["T=4, S=2,000,000", "MiB at its peak", "built the mask", "S - T + i + 1"]),
    (counts_from_a_long_arange, ["T=4, S=2,000,000", "an array as long as S"]),
    (counts_top_left, ["T=3, S=7", "query 0 (at position 4) gets 1; it should see 5", "top left"]),
    (counts_T_as_offset, ["T=3, S=7", "gets 4; it should see 5", "not T"]),
    (counts_without_itself, ["gets 4; it should see 5", "also sees itself"]),
    (counts_window_ignored, ["T=3, S=7, W=3", "gets 5; it should see 3", "min(S - T + i + 1, W)"]),
    (counts_window_plus_one, ["T=3, S=7, W=3", "gets 4; it should see 3", "not W + 1"]),
    (counts_window_minus_one, ["T=3, S=7, W=3", "gets 2; it should see 3", "not W - 1"]),
    (counts_all_S, ["gets 7; it should see 5", "up to and including"]),
    (counts_float, ["float64; expected integers"]),
    (counts_no_window_argument, ["T=3, S=7, W=3", "raised TypeError", "window=None"]),
    (counts_mask_returned, ["returned a [T, S] array", "shape [T]"]),
    (counts_always_capped, ["T=3, S=7", "raised TypeError", "window is None"]),
]


@pytest.mark.parametrize("fn, words", COUNTS_WRONG, ids=[f.__name__ for f, _ in COUNTS_WRONG])
def test_counts_reject_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_visible_counts(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_counts_memory_check_leaves_an_outside_trace_running():
    """A learner (or a test) already tracing memory keeps its trace after the check."""
    tracemalloc.start()
    try:
        assert check_visible_counts(counts_right)
        assert not check_visible_counts(counts_from_mask)
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


def test_counts_stub_gets_the_stub_verdict():
    def stub(T, S, window=None):
        raise NotImplementedError("your turn")

    verdict = check_visible_counts(stub)
    assert not verdict and verdict.stub
