"""SinkKVCache and StreamingSinkKVCache through kvlesson.step equal one full pass with their rule, in bounded memory.

The references here are loops over heads, queries and keys: a key is used or skipped by comparing positions
one pair at a time, with the simple RoPE of tests/reference.py. SinkKVCache keeps text positions; the StreamingLLM
variant numbers every key a query sees 0, 1, 2, ... in cache order and puts the query last.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import KVCache, WindowKVCache
from kvlesson.shrink.sinks import SinkKVCache, StreamingSinkKVCache, sink_mask
from tests import helpers
from tests.reference import full_pass, rope_one


def visible(p, sinks, window):
    """Positions query p sees: the first `sinks` (up to p), and the `window` most recent, itself included."""
    return [j for j in range(p + 1) if j < sinks or j > p - window]


def sink_pass(x, Wq, Wk, Wv, H, Hkv, sinks, window, rope_base=None, interleaved=False, cache_positions=False):
    """x [N, D] -> [N, H*d] in float64. cache_positions: rotate by rank among the visible keys (StreamingLLM)."""
    x, Wq, Wk, Wv = (np.asarray(a, np.float64) for a in (x, Wq, Wk, Wv))
    N, d, G = x.shape[0], Wq.shape[1] // H, H // Hkv
    out = np.zeros((N, H * d))
    for h in range(H):
        g = h // G
        q, k, v = x @ Wq[:, h * d:(h + 1) * d], x @ Wk[:, g * d:(g + 1) * d], x @ Wv[:, g * d:(g + 1) * d]
        for p in range(N):
            js = visible(p, sinks, window)
            where = {j: (n if cache_positions else j) for n, j in enumerate(js)}  # each key's position
            qp = len(js) - 1 if cache_positions else p
            if rope_base is None:
                qr, keys = q[p], [k[j] for j in js]
            else:
                qr = rope_one(q[p], qp, rope_base, interleaved)
                keys = [rope_one(k[j], where[j], rope_base, interleaved) for j in js]
            scores = [float(qr @ kj) / math.sqrt(d) for kj in keys]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            out[p, h * d:(h + 1) * d] = sum(w / sum(weights) * v[j] for w, j in zip(weights, js, strict=True))
    return out


@st.composite
def cases(draw, rope=True):
    """One layer, a text of N tokens cut into chunks (empty ones included), sinks and a window; RoPE or not."""
    Hkv, G, N = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 16))
    cuts = sorted(draw(st.lists(st.integers(0, N), max_size=6)))  # repeated cuts make empty chunks
    bases = [10000.0, 100.0] if rope else [None, 10000.0, 100.0]
    return dict(H=Hkv * G, Hkv=Hkv, d=draw(st.sampled_from([2, 4, 6])), D=draw(st.integers(1, 8)), N=N,
                chunks=np.diff([0, *cuts, N]).tolist(), sinks=draw(st.integers(0, 5)),
                window=draw(st.integers(1, N + 2)), rope_base=draw(st.sampled_from(bases)),
                interleaved=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def weights(c, dtype=np.float64):
    rng = np.random.default_rng(c["seed"])
    x = rng.standard_normal((c["N"], c["D"]))  # [N, D]
    W = [rng.standard_normal((c["D"], n * c["d"])) / np.sqrt(c["D"]) for n in (c["H"], c["Hkv"], c["Hkv"])]
    return [a.astype(dtype) for a in (x, *W)]


def run_chunks(c, cache, dtype=np.float64):
    return helpers.run_chunks(c, cache, dtype, weights=weights, cache_masks=True)


def reference(c, cache_positions=False):
    x, Wq, Wk, Wv = weights(c)
    return sink_pass(x, Wq, Wk, Wv, c["H"], c["Hkv"], c["sinks"], c["window"], c["rope_base"], c["interleaved"],
                     cache_positions)


@given(cases(rope=False))
def test_sink_cache_through_step_equals_one_pass_with_the_sink_mask(c):
    cache = SinkKVCache(c["Hkv"], c["d"], c["sinks"], c["window"])
    np.testing.assert_allclose(run_chunks(c, cache), reference(c), rtol=0, atol=1e-12)


@given(cases())
def test_streaming_sinks_equal_one_pass_at_positions_within_the_cache(c):
    cache = StreamingSinkKVCache(c["Hkv"], c["d"], c["sinks"], c["window"], c["rope_base"],
                                 interleaved=c["interleaved"])
    np.testing.assert_allclose(run_chunks(c, cache), reference(c, cache_positions=True), rtol=0, atol=1e-12)


@given(cases())
def test_float32_stays_float32_and_close(c):
    """float32 carries about 7 digits; at these sizes the error is near 1e-7, so 1e-5 still flags any real bug."""
    for cache, positions in ((SinkKVCache(c["Hkv"], c["d"], c["sinks"], c["window"], np.float32), False),
                             (StreamingSinkKVCache(c["Hkv"], c["d"], c["sinks"], c["window"], c["rope_base"],
                                                   interleaved=c["interleaved"], dtype=np.float32), True)):
        got = run_chunks(c, cache, np.float32)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, reference(c, positions), rtol=0, atol=1e-5)


@given(st.integers(0, 4), st.integers(1, 6), st.lists(st.integers(0, 7), max_size=8))
def test_memory_stays_bounded_and_handed_back_keys_are_the_visible_ones(sinks, window, chunks):
    Hkv, d = 2, 3
    cache = SinkKVCache(Hkv, d, sinks, window)
    bound = 2 * Hkv * d * 8 * (sinks + window - 1)  # K and V, float64, for sinks + W - 1 positions
    for T in chunks:
        n = len(cache)
        block = np.broadcast_to(np.arange(n, n + T, dtype=np.float64)[None, :, None], (Hkv, T, d)).copy()
        K, _ = cache.append(block, block)  # each key's value is its position
        assert cache.nbytes == bound
        needed = sorted(set().union(*[visible(p, sinks, window) for p in range(n, n + T)])) if T else []
        held = [j for j in visible(n, sinks, window) if j < n]  # the past the next query needs: all it keeps
        assert K[0, :, 0].astype(int).tolist() == sorted(set(held) | set(range(n, n + T)))
        assert set(needed) <= set(K[0, :, 0].astype(int).tolist())
        assert K.shape[1] <= sinks + window - 1 + T


@given(st.integers(0, 4), st.integers(1, 6), st.lists(st.integers(0, 7), max_size=8))
def test_mask_is_the_position_rule(sinks, window, chunks):
    cache = SinkKVCache(1, 2, sinks, window)
    for T in chunks:
        n = len(cache)
        cache.append(np.zeros((1, T, 2)), np.zeros((1, T, 2)))
        mask = cache.mask(T)
        assert np.array_equal(mask, cache.mask(T))  # a question about the cache as it stands: ask it twice
        for i in range(T):
            seen = cache.key_positions(T)[mask[i]].tolist()
            assert seen == visible(n + i, sinks, window)


def test_degenerate_cases_match_the_caches_they_generalise():
    c = dict(H=4, Hkv=2, d=4, D=8, N=13, chunks=[5, 0, 1, 7], sinks=0, window=4, rope_base=100.0,
             interleaved=False, seed=3)
    x, Wq, Wk, Wv = weights(c)
    windowed = run_chunks(c, WindowKVCache(2, 4, 4))
    np.testing.assert_allclose(run_chunks(c, SinkKVCache(2, 4, 0, 4)), windowed, rtol=0, atol=1e-15)
    full = full_pass(x, Wq, Wk, Wv, 4, 2, rope_base=100.0)
    np.testing.assert_allclose(run_chunks({**c, "sinks": 2, "window": 13}, SinkKVCache(2, 4, 2, 13)), full,
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(run_chunks(c, KVCache(2, 4)), full, rtol=0, atol=1e-12)
    many_sinks = {**c, "sinks": 13, "window": 1}  # every token is a sink: full attention again
    np.testing.assert_allclose(run_chunks(many_sinks, SinkKVCache(2, 4, 13, 1)), full, rtol=0, atol=1e-12)


def test_streaming_chunks_equal_token_by_token_decode():
    c = dict(H=4, Hkv=2, d=4, D=8, N=20, chunks=[20], sinks=3, window=5, rope_base=100.0, interleaved=True, seed=5)
    one = run_chunks(c, StreamingSinkKVCache(2, 4, 3, 5, 100.0, interleaved=True))
    for chunks in ([1] * 20, [6, 0, 9, 5], [2, 18]):
        got = run_chunks({**c, "chunks": chunks}, StreamingSinkKVCache(2, 4, 3, 5, 100.0, interleaved=True))
        np.testing.assert_allclose(got, one, rtol=0, atol=1e-12)


def test_the_two_placements_differ_only_once_the_sinks_leave_the_window():
    c = dict(H=2, Hkv=1, d=4, D=6, N=12, chunks=[12], sinks=2, window=3, rope_base=100.0, interleaved=False,
             seed=9)
    text = run_chunks(c, SinkKVCache(1, 4, 2, 3))
    cache = run_chunks(c, StreamingSinkKVCache(1, 4, 2, 3, 100.0))
    first_moved = c["sinks"] + c["window"]  # query p moves its sinks once p > sinks + window - 1
    np.testing.assert_allclose(text[:first_moved], cache[:first_moved], rtol=0, atol=1e-12)
    assert np.abs(text[first_moved:] - cache[first_moved:]).min(axis=1).max() > 1e-3


class ForgetsSinks(SinkKVCache):
    """The bug: the sinks are handed back, but the mask drops them once they leave the window (window-only)."""

    def mask(self, T):
        return sink_mask(self.key_positions(T), len(self) - T + np.arange(T), 0, self.window)


class EvictsBeforeAttending(SinkKVCache):
    """The bug: writes the new block first, then hands back what the cache holds: a chunk loses keys it sees."""

    def append(self, k_new, v_new):
        super().append(k_new, v_new)  # assembles, then writes; what it assembled is thrown away
        held = self._held(len(self))  # the sinks and the last W - 1 positions, the new block's included
        ring = held[held >= self.sinks] % max(self.slots, 1)
        n_sinks = int((held < self.sinks).sum())
        return (np.concatenate([self.sink_k[:, :n_sinks], self.k[:, ring]], axis=1),
                np.concatenate([self.sink_v[:, :n_sinks], self.v[:, ring]], axis=1))


@pytest.mark.parametrize("buggy", [ForgetsSinks, EvictsBeforeAttending])
def test_the_equivalence_test_catches_the_bugs(buggy):
    c = dict(H=2, Hkv=1, d=4, D=6, N=14, chunks=[6, 5, 3], sinks=2, window=3, rope_base=100.0, interleaved=False,
             seed=2)
    np.testing.assert_allclose(run_chunks(c, SinkKVCache(1, 4, 2, 3)), reference(c), rtol=0, atol=1e-12)
    try:
        got = run_chunks(c, buggy(1, 4, 2, 3))
    except ValueError:
        return
    assert not np.allclose(got, reference(c), rtol=0, atol=1e-12)


def test_bad_arguments_are_named_and_a_refused_append_changes_nothing():
    for kwargs, words in [(dict(sinks=-1, window=3), "sinks must be at least 0"),
                          (dict(sinks=2, window=0), "window must be at least 1"),
                          (dict(sinks=2.5, window=3), "sinks must be an integer")]:
        with pytest.raises((ValueError, TypeError), match=words):
            SinkKVCache(2, 4, **kwargs)
    with pytest.raises(ValueError, match="d must be even"):
        StreamingSinkKVCache(1, 3, 1, 2, 100.0)
    cache = SinkKVCache(2, 4, 1, 3)
    cache.append(np.ones((2, 5, 4)), np.ones((2, 5, 4)))
    before = (len(cache), cache.sink_k.copy(), cache.k.copy(), cache.mask(5))
    with pytest.raises(ValueError, match="Hkv=2, T, d=4"):
        cache.append(np.ones((2, 3, 5)), np.ones((2, 3, 5)))
    assert len(cache) == before[0]
    np.testing.assert_array_equal(cache.sink_k, before[1])
    np.testing.assert_array_equal(cache.k, before[2])
    np.testing.assert_array_equal(cache.mask(5), before[3])
    with pytest.raises(ValueError, match="T=6: the cache has seen only 5 tokens"):
        cache.mask(6)
