"""kvlesson.attention at the edges of floating point: what a query cannot see never reaches it, even inf or NaN;
float16 inputs are summed in float32; scores beyond float32's range are an error, not a NaN."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import attention, causal_mask
from tests import reference


@given(st.integers(2, 6), st.integers(0, 4), st.integers(1, 3), st.sampled_from([np.nan, np.inf, -np.inf]),
       st.booleans(), st.integers(0, 99))
def test_an_unseen_key_or_value_never_reaches_a_query(T, extra, window, bad, in_value, seed):
    """A masked key whose value is inf or NaN once turned every output into NaN: its weight is 0, but 0 * inf is NaN."""
    rng = np.random.default_rng(seed)
    S = T + extra
    q, k, v = rng.standard_normal((4, T, 8)), rng.standard_normal((2, S, 8)), rng.standard_normal((2, S, 8))
    want = attention(q, k, v, window=window)
    j = S - 1  # the newest key: only the last query sees it
    (v if in_value else k)[:, j] = bad
    got = attention(q, k, v, window=window)
    sees = causal_mask(T, S, window)[:, j]  # [T]
    np.testing.assert_allclose(got[:, ~sees], want[:, ~sees], rtol=0, atol=1e-12)
    assert not np.isfinite(got[:, sees]).all()  # a query that does see it gets what IEEE arithmetic gives


@given(st.integers(0, 99), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_a_query_that_sees_one_bad_value_is_not_reached_by_another_it_cannot_see(seed, bad):
    """Bug caught: a query that saw any inf or NaN value was multiplied with the whole of v, so another key's inf
    value, hidden from it, came in as 0 * inf = NaN: the first query saw key 1 (inf in channel 0) and got NaN in
    channel 1 from key 3, which only the last query sees."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((1, 4, 4)), rng.standard_normal((1, 4, 4))
    v[0, 1, 0], v[0, 3, 1] = bad, np.inf
    out = attention(q, k, v)  # queries at positions 1, 2, 3
    assert np.isfinite(out[:, :2, 1:]).all() and np.isfinite(out[:, 2, 2:]).all()
    assert np.isnan(out[:, :, 0]).all() if np.isnan(bad) else np.array_equal(out[:, :, 0], np.full((2, 3), bad))
    assert np.isposinf(out[:, 2, 1]).all()

def test_float16_scores_are_summed_in_float32_and_handed_back_in_float16():
    """Scores of 40 x 40 x 64 = 102,400 overflowed float16's 65,504, and every output was NaN."""
    q = np.full((2, 3, 64), 40, np.float16)
    k = np.full((1, 3, 64), 40, np.float16)
    v = np.ones((1, 3, 64), np.float16)
    out = attention(q, k, v)
    assert out.dtype == np.float16 and np.array_equal(out, np.ones_like(out))


def test_scores_beyond_float32_are_refused_by_name():
    q = np.full((1, 1, 4), 1e20, np.float32)
    with pytest.raises(ValueError, match="attention scores overflow float32"):
        attention(q, q, q)


@st.composite
def trees(draw):
    T = draw(st.integers(0, 9))
    return [draw(st.integers(-1, i - 1)) for i in range(T)]


@given(trees(), st.integers(0, 5))
def test_the_tree_mask_is_each_node_and_its_ancestors(parents, S):
    from kvlesson import tree_mask
    from kvlesson.sdpa import tree_depths

    np.testing.assert_array_equal(tree_mask(parents, S), reference.tree_mask(parents, S))
    depth = tree_depths(parents)
    assert all(depth[i] == (0 if p < 0 else depth[p] + 1) for i, p in enumerate(parents))


def test_a_chain_is_the_offset_mask_and_siblings_never_meet():
    from kvlesson import tree_mask

    np.testing.assert_array_equal(tree_mask([-1, 0, 1, 2], 3), causal_mask(4, 7))
    two_branches = tree_mask([-1, 0, 0], 2)  # node 0, then siblings 1 and 2 under it
    assert two_branches[1, 2 + 2] == two_branches[2, 2 + 1] == False  # noqa: E712


@pytest.mark.parametrize("parents, error, words", [
    ([0], ValueError, r"parents\[0\]=0: a node's parent must come before it"),
    ([-1, 2, 0], ValueError, r"parents\[1\]=2"), ([-2], ValueError, "at least -1"),
    ([-1, 0.0], TypeError, r"parents\[1\] must be an integer"), ("ab", TypeError, "a list of T integers"),
])
def test_bad_trees_are_refused_by_name(parents, error, words):
    from kvlesson import tree_mask

    with pytest.raises(error, match=words):
        tree_mask(parents, 3)
