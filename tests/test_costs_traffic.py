"""kvlesson.costs.traffic: the tiled passes compute attention, their counted traffic equals the closed forms, and the
tiles they hold fit in M."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson.costs.traffic import (
    SlowMemory,
    Traffic,
    on_chip,
    standard_attention,
    standard_traffic,
    tiled_attention,
    tiled_traffic,
    tiles,
)


def qkv(N, d, seed):
    return np.random.default_rng(seed).standard_normal((3, N, d))  # q, k, v [N, d] each


def softmax_attention(q, k, v):
    """No mask, one head: the theorem's attention."""
    s = q @ k.T / math.sqrt(q.shape[1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v


cases = st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2**32 - 1),
                  st.sampled_from(["q", "kv"]), st.integers(0, 400))


@given(cases)
def test_the_tiled_passes_compute_attention_and_move_what_the_formula_says(case):
    N, d, seed, loop, extra = case
    M = on_chip(d, 1, 1) + extra  # from the smallest memory that holds one row and one key upwards
    q, k, v = qkv(N, d, seed)
    out, counted = tiled_attention(q, k, v, M, loop=loop)
    np.testing.assert_allclose(out, softmax_attention(q, k, v), rtol=0, atol=1e-12)
    assert counted == tiled_traffic(N, d, M, loop)
    assert on_chip(d, *tiles(d, M, loop)) <= M


@given(cases, st.integers(1, 9), st.integers(1, 9))
def test_any_tiles_that_fit_give_attention_and_the_formula(case, Br, Bc):
    N, d, seed, loop, _ = case
    q, k, v = qkv(N, d, seed)
    M = on_chip(d, Br, Bc)
    out, counted = tiled_attention(q, k, v, M, loop=loop, tile=(Br, Bc))
    np.testing.assert_allclose(out, softmax_attention(q, k, v), rtol=0, atol=1e-12)
    assert counted == tiled_traffic(N, d, M, loop, tile=(Br, Bc))


@given(st.integers(1, 30), st.sampled_from([1, 3, 8]), st.integers(0, 2**32 - 1))
def test_the_standard_pass_moves_4Nd_plus_4N2(N, d, seed):
    q, k, v = qkv(N, d, seed)
    out, counted = standard_attention(q, k, v)
    np.testing.assert_allclose(out, softmax_attention(q, k, v), rtol=0, atol=1e-12)
    assert counted == standard_traffic(N, d) and counted.total == 4 * N * d + 4 * N * N


def test_the_tiles_are_the_largest_that_fit():
    for d, M in [(64, 116_736), (128, 116_736), (16, 500)]:
        for loop in ("q", "kv"):
            Br, Bc = tiles(d, M, loop)
            assert on_chip(d, Br, Bc) <= M
            grown = (Br + 1, Bc) if loop == "q" else (Br, Bc + 1)
            assert on_chip(d, *grown) > M
    assert tiles(128, 116_736, "q") == (449, 1) and tiles(128, 116_736, "kv") == (1, 453)


def test_traffic_grows_as_N_squared_and_falls_as_one_over_M():
    """Theorem 2's Theta(N^2 d^2 / M), for the N^2 terms: doubling N gives 4x, doubling M about half."""
    for loop in ("q", "kv"):
        a, b = tiled_traffic(2**16, 64, 2**15, loop).total, tiled_traffic(2**17, 64, 2**15, loop).total
        assert 3.9 < b / a < 4.01
        c = tiled_traffic(2**16, 64, 2**16, loop).total
        assert 0.49 < c / a < 0.52


def test_slow_memory_counts_copies_in_and_out():
    hbm = SlowMemory(x=np.arange(6.0).reshape(3, 2))
    tile = hbm.read("x", slice(0, 2))
    tile[:] = -1  # on chip: slow memory keeps its own copy
    hbm.write("x", slice(2, 3), np.zeros((1, 2)))
    assert hbm.traffic == Traffic(reads=4, writes=2) and hbm.arrays["x"][0, 0] == 0.0
    assert Traffic(3, 4).total == 7


@pytest.mark.parametrize("call, error, words", [
    (lambda q: tiled_attention(q, q, q, 10), ValueError, "M=10 elements cannot hold even one query row"),
    (lambda q: tiled_attention(q, q, q, 1000, tile=(40, 40)), ValueError, "M=1,000 is too small"),
    (lambda q: tiled_attention(q, q, q, 1000, loop="rows"), ValueError, "loop must be 'q'"),
    (lambda q: tiled_attention(q, q, q, 1000.0), TypeError, "M must be an integer"),
    (lambda q: tiled_attention(q, q[:3], q, 1000), ValueError, "need q, k, v of one shape"),
    (lambda q: standard_attention(q.astype(int), q, q), TypeError, "q must hold floating-point numbers"),
    (lambda q: standard_traffic(0, 4), ValueError, "N must be at least 1"),
])
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call(np.ones((5, 4)))
