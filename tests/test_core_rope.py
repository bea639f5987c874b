"""Rotary embedding: both conventions against the pair-by-pair reference, and relative positions."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import apply_rope
from tests.reference import rope_one


@given(st.integers(1, 8), st.integers(0, 6), st.booleans(), st.sampled_from([10000.0, 100000.0, 50.0]),
       st.integers(0, 2**32 - 1))
def test_both_conventions_match_reference(half_d, T, interleaved, base, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half_d
    x = rng.standard_normal((3, T, d))  # [H, T, d]
    positions = rng.integers(0, 5000, T)
    got = apply_rope(x, positions, base, interleaved=interleaved)
    want = np.array([[rope_one(x[h, t], positions[t], base, interleaved) for t in range(T)] for h in range(3)])
    np.testing.assert_allclose(got, want.reshape(x.shape), rtol=0, atol=1e-9)


@pytest.mark.parametrize("interleaved", [False, True])
def test_scores_depend_only_on_relative_position(interleaved):
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 1, 16))  # one query, one key, d = 16
    scores = []
    for shift in (0, 7, 1000, 123456):
        qr = apply_rope(q, [shift + 5], interleaved=interleaved)
        kr = apply_rope(k, [shift + 2], interleaved=interleaved)
        scores.append(float(qr[0] @ kr[0]))
    np.testing.assert_allclose(scores, scores[0], rtol=0, atol=1e-9)


def test_position_zero_is_identity_and_conventions_differ_elsewhere():
    x = np.random.default_rng(3).standard_normal((2, 1, 8))
    for interleaved in (False, True):
        np.testing.assert_array_equal(apply_rope(x, [0], interleaved=interleaved), x)
    assert not np.allclose(apply_rope(x, [3], interleaved=True), apply_rope(x, [3], interleaved=False))


def test_half_split_is_interleaved_under_a_permutation():
    """Moving pair m from (2m, 2m+1) to (m, m + d/2) turns one convention into the other."""
    d = 8
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # interleaved index order, half-split layout
    x = np.random.default_rng(4).standard_normal((3, 5, d))
    positions = np.arange(10, 15)
    half_split = apply_rope(x[..., perm], positions)
    interleaved = apply_rope(x, positions, interleaved=True)[..., perm]
    np.testing.assert_allclose(half_split, interleaved, rtol=0, atol=1e-12)


def test_float32_tables_do_not_upcast():
    x = np.ones((2, 3, 64), np.float32)
    for interleaved in (False, True):
        out = apply_rope(x, [0, 5_000, 100_000], 100000.0, interleaved=interleaved)
        assert out.dtype == np.float32
    # angles in float64, cast once: at position 100,000 float32 angles would be off by ~0.004 rad
    want = apply_rope(x.astype(np.float64), [0, 5_000, 100_000], 100000.0)
    np.testing.assert_allclose(apply_rope(x, [0, 5_000, 100_000], 100000.0), want, rtol=0, atol=1e-6)


def test_the_kept_tables_follow_the_ladder_a_patch_included():
    """apply_rope keeps cos/sin tables per (positions, ladder); patching inv_freq (as lesson 11 does) must still
    take effect, and a table handed out must not be writable."""
    from unittest import mock

    from kvlesson import rope

    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    plain = apply_rope(x, [5, 6, 7])
    with mock.patch.object(rope, "inv_freq", lambda d, base: rope._ladder(d, base) / 8):
        stretched = apply_rope(x, [5, 6, 7])
    assert not np.allclose(plain, stretched)
    np.testing.assert_array_equal(apply_rope(x, [5, 6, 7]), plain)
    cos, _ = rope.rotation(np.arange(3.0), 8, 10000.0, np.float64)
    with pytest.raises(ValueError):
        cos[0, 0] = 1.0
