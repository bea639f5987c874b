"""The lesson 04 checkers pass right answers and name each classic wrong one."""
import numpy as np
import pytest

from kvlesson import causal_mask
from kvlesson.checks import check_offset_mask, check_visible_counts, check_windowed_mask

# ---------------------------------------------------------------------------------------------- offset mask


def offset_right(T, S):
    return np.arange(S) <= np.arange(S - T, S)[:, None]


def offset_tril_k(T, S):
    return np.tril(np.ones((T, S), dtype=bool), k=S - T)


def offset_top_left(T, S):
    """The bug the lesson is about: np.tril anchors the diagonal at the top left."""
    return np.tril(np.ones((T, S)))


def offset_top_left_bool(T, S):
    return np.tril(np.ones((T, S), dtype=bool))


def offset_strict(T, S):
    return np.arange(S) < np.arange(S - T, S)[:, None]


def offset_one_ahead(T, S):
    return np.arange(S) <= np.arange(S - T, S)[:, None] + 1


def offset_flipped(T, S):
    return np.arange(S) >= np.arange(S - T, S)[:, None]


def offset_transposed(T, S):
    return offset_right(T, S).T


def offset_float(T, S):
    return np.tril(np.ones((T, S)), k=S - T)


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


def test_offset_passes_right_answers():
    for fn in (offset_right, offset_tril_k, causal_mask):
        verdict = check_offset_mask(fn)
        assert verdict, verdict.message
        assert verdict.message.startswith("PASS")


@pytest.mark.parametrize("fn, words", [
    (offset_top_left, ["T=3, S=7", "the first query (at position 4) sees 1 key; it should see 5", "top left"]),
    (offset_top_left_bool, ["sees 1 key; it should see 5", "k=S - T"]),
    (offset_decode_only_hack, ["T=3, S=7", "sees 1 key; it should see 5", "top left"]),
    (offset_strict, ["sees 4 keys; it should see 5", "key 4 is missing", "not <"]),
    (offset_one_ahead, ["sees 6 keys; it should see 5", "key 5 is in its future", "S - T + i + 1"]),
    (offset_flipped, ["sees 3 keys; it should see 5", "wrong way"]),
    (offset_transposed, ["shape (7, 3); expected (3, 7)", "[T, S], not [S, T]"]),
    (offset_float, ["float64; expected bool", "dtype=bool"]),
    (offset_by_rows, ["T=0, S=5 (no new tokens)", "shape (0,); expected (0, 5)", "S columns"]),
    (offset_crashes_on_empty, ["T=0, S=5", "raised IndexError"]),
])
def test_offset_names_the_mistake(fn, words):
    verdict = check_offset_mask(fn)
    assert not verdict
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_offset_transposed_square_is_caught_as_transposed():
    """When T == S a transposed mask has the right shape, so only its values give it away."""
    def transposed_only_when_square(T, S):
        return causal_mask(T, S).T if T == S else causal_mask(T, S)

    verdict = check_offset_mask(transposed_only_when_square)
    assert not verdict and "T=4, S=4" in verdict.message and "transpose of the right one" in verdict.message


def test_offset_reports_not_implemented_kindly():
    def stub(T, S):
        raise NotImplementedError

    verdict = check_offset_mask(stub)
    assert not verdict and "still raises NotImplementedError" in verdict.message
    assert "replace the `raise NotImplementedError` line" in verdict.message


def test_offset_catches_unknown_mistakes_with_a_count():
    def odd(T, S):
        mask = causal_mask(T, S).copy()
        mask[-1, 0] = False if T > 1 else mask[-1, 0]
        return mask

    verdict = check_offset_mask(odd)
    assert not verdict and "query 2 (at position 6) sees 6 keys; it should see 7" in verdict.message
    assert "key 0 is missing" in verdict.message

# ---------------------------------------------------------------------------------------------- windowed mask


def window_right(T, S, W):
    p = np.arange(S - T, S)[:, None]  # [T, 1]
    j = np.arange(S)
    return (j <= p) & (j > p - W)


def window_as_difference_of_trils(T, S, W):
    ones = np.ones((T, S), dtype=bool)
    return np.tril(ones, k=S - T) & ~np.tril(ones, k=S - T - W)


def window_ignored(T, S, W):
    return causal_mask(T, S)


def window_top_left(T, S, W):
    i, j = np.arange(T)[:, None], np.arange(S)
    return (j <= i) & (j > i - W)


def window_one_too_wide(T, S, W):
    p = np.arange(S - T, S)[:, None]
    j = np.arange(S)
    return (j <= p) & (j >= p - W)


def window_one_too_narrow(T, S, W):
    p = np.arange(S - T, S)[:, None]
    j = np.arange(S)
    return (j <= p) & (j > p - W + 1)


def window_no_causal_bound(T, S, W):
    return np.arange(S) > np.arange(S - T, S)[:, None] - W


def window_float(T, S, W):
    return window_right(T, S, W).astype(np.float32)


def test_window_passes_right_answers():
    for fn in (window_right, window_as_difference_of_trils, lambda T, S, W: causal_mask(T, S, window=W)):
        verdict = check_windowed_mask(fn)
        assert verdict, verdict.message


@pytest.mark.parametrize("fn, words", [
    (window_ignored, ["T=3, S=7, W=3", "sees 5 keys; it should see 3", "keys 0..1 are outside its window",
                      "window is missing"]),
    (window_top_left, ["sees 1 key; it should see 3", "top left"]),
    (window_one_too_wide, ["sees 4 keys; it should see 3", "not >=", "not 4"]),
    (window_one_too_narrow, ["sees 2 keys; it should see 3", "not 2"]),
    (window_no_causal_bound, ["sees 5 keys; it should see 3", "in its future", "causal bound is missing"]),
    (window_float, ["float32; expected bool"]),
])
def test_window_names_the_mistake(fn, words):
    verdict = check_windowed_mask(fn)
    assert not verdict
    for w in words:
        assert w in verdict.message, (w, verdict.message)

# ---------------------------------------------------------------------------------------------- visible counts


def counts_right(T, S):
    return np.arange(S - T, S) + 1


def counts_from_mask(T, S):
    return causal_mask(T, S).sum(axis=1)


def test_counts_pass_right_answers():
    for fn in (counts_right, counts_from_mask):
        verdict = check_visible_counts(fn)
        assert verdict, verdict.message


@pytest.mark.parametrize("fn, words", [
    (lambda T, S: np.arange(T) + 1, ["T=3, S=7", "query 0 (at position 4) gets 1; it should see 5", "top left"]),
    (lambda T, S: np.arange(S - T, S), ["gets 4; it should see 5", "also sees itself"]),
    (lambda T, S: causal_mask(T, S), ["returned a [T, S] array", "shape [T]"]),
    (lambda T, S: (np.arange(S - T, S) + 1).astype(float), ["float64; expected integers"]),
    (lambda T, S: np.full(T, S), ["gets 7; it should see 5", "up to and including"]),
])
def test_counts_name_the_mistake(fn, words):
    verdict = check_visible_counts(fn)
    assert not verdict
    for w in words:
        assert w in verdict.message, (w, verdict.message)
