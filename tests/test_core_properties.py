"""Every cache path equals one full pass of the simple reference, over random shapes and chunkings.

The chunkings include empty chunks, single-token decode and chunks longer than the window,
so a mask anchored at the top left (np.tril), RoPE at local positions, or a window cache
that evicts before attending each fails here (tests/test_core_mutants.py proves it).
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import attention, causal_mask
from tests.helpers import caches, layers, reference, run_chunks


@given(st.booleans().flatmap(lambda windowed: layers(windowed=windowed)))
def test_every_cache_and_chunking_equals_full_pass(c):
    """With and without a window: KVCache, StaticKVCache and (windowed) WindowKVCache, in float64."""
    want = reference(c)
    for cache in caches(c):
        np.testing.assert_allclose(run_chunks(c, cache), want, rtol=0, atol=1e-12)


@given(layers(windowed=True))
def test_float32_stays_float32_and_close(c):
    """float32 carries about 7 digits; over these sizes (d, D <= 12, <= 14 keys) the measured error is
    around 1e-7, so 1e-5 flags any real bug (those give errors of order 0.1) with room to spare."""
    want = reference(c)
    for cache in caches(c, np.float32):
        got = run_chunks(c, cache, np.float32)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 9), st.integers(0, 9),
       st.one_of(st.none(), st.integers(1, 12)), st.integers(0, 2**32 - 1))
def test_attention_with_T_less_than_S_matches_a_loop(Hkv, G, T, extra, window, seed):
    rng = np.random.default_rng(seed)
    H, S, d = Hkv * G, T + extra, 4
    q = rng.standard_normal((H, T, d))  # [H, T, d]
    k, v = rng.standard_normal((2, Hkv, S, d))  # [Hkv, S, d] each
    got = attention(q, k, v, window=window)
    want = np.zeros_like(q)
    for h in range(H):
        for i in range(T):
            p = S - T + i  # absolute position of query i
            js = [j for j in range(S) if j <= p and (window is None or j > p - window)]
            s = np.array([q[h, i] @ k[h // G, j] for j in js]) / np.sqrt(d)
            w = np.exp(s - s.max())
            want[h, i] = (w / w.sum()) @ v[h // G, js]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@given(st.integers(0, 9), st.integers(0, 9), st.one_of(st.none(), st.integers(1, 12)))
def test_causal_mask_is_the_position_rule(T, extra, window):
    S = T + extra
    mask = causal_mask(T, S, window)
    assert mask.shape == (T, S) and mask.dtype == bool
    for i in range(T):
        for j in range(S):
            assert mask[i, j] == (j <= S - T + i and (window is None or j > S - T + i - window))


def test_degenerate_cases():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 4, 6, 8))  # H = Hkv = 4: plain multi-head attention
    assert np.allclose(attention(q, k, v), attention(q, k, v, window=6), rtol=0, atol=1e-15)  # window >= S
    T = 2
    mha = attention(q[:, -T:], k, v)
    loop = np.stack([attention(q[h:h + 1, -T:], k[h:h + 1], v[h:h + 1])[0] for h in range(4)])
    np.testing.assert_allclose(mha, loop, rtol=0, atol=1e-15)
