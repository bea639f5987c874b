"""truncate(n): after it, a cache behaves exactly like one that only ever held its first n positions.

Speculative decoding appends k + 1 drafted tokens and rolls the cache back over the rejected ones, so every cache
must be able to forget its newest positions, or say by name how far back it can go. The test: append a stream,
truncate, append more; a fresh cache fed only the first n positions and then the same continuation must hand back
the same keys and values, under the same mask, at every later append.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import KVCache, PagedKVCache, QuantizedKVCache, SinkKVCache, StaticKVCache, WindowKVCache
from kvlesson.shrink.precision import LowPrecisionKVCache
from kvlesson.shrink.sinks import StreamingSinkKVCache

Hkv, d = 2, 8
MAKERS = {
    "KVCache": lambda: KVCache(Hkv, d),
    "StaticKVCache": lambda: StaticKVCache(Hkv, d, 64),
    "WindowKVCache": lambda: WindowKVCache(Hkv, d, 4),
    "WindowKVCache, slack 3": lambda: WindowKVCache(Hkv, d, 4, slack=3),
    "SinkKVCache": lambda: SinkKVCache(Hkv, d, 2, 4, slack=2),
    "StreamingSinkKVCache": lambda: StreamingSinkKVCache(Hkv, d, 2, 4, 100.0, slack=2),
    "QuantizedKVCache, per token": lambda: QuantizedKVCache(Hkv, d, 4, dtype=np.float64),
    "QuantizedKVCache, per channel": lambda: QuantizedKVCache(Hkv, d, 4, key_scales="channel", block=4,
                                                              dtype=np.float64),
    "LowPrecisionKVCache": lambda: LowPrecisionKVCache(Hkv, d, 64),
}


class Paged:
    """A sequence of a PagedKVCache, and the pool it lives in."""

    def __new__(cls):
        pool = PagedKVCache(32, 4, Hkv, d)
        return pool.sequence(pool.new_sequence())


MAKERS["PagedKVCache sequence"] = Paged


def data(n, seed):
    k, v = np.random.default_rng(seed).standard_normal((2, Hkv, n, d))
    return (k.astype(np.float32), v.astype(np.float32))


def feed(cache, k, v, chunks, start=0):
    """Append k, v [Hkv, N, d] from `start` in `chunks` -> [(K, V, mask) handed back at each append]."""
    out = []
    for T in chunks:
        dtype = cache.dtype
        K, V = cache.append(k[:, start:start + T].astype(dtype), v[:, start:start + T].astype(dtype))
        out.append((K.copy(), V.copy(), cache.mask(T)))
        start += T
    return out


def chunks_of(n, sizes):
    """Cut n tokens into pieces from `sizes` (cycled), the last one cut short."""
    out, i = [], 0
    while n > 0:
        T = min(sizes[i % len(sizes)], n)
        out.append(T)
        n, i = n - T, i + 1
    return out


@pytest.mark.parametrize("name", sorted(MAKERS))
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.integers(0, 30), st.integers(0, 6),
       st.lists(st.integers(0, 5), min_size=1, max_size=4), st.integers(0, 10))
def test_a_truncated_cache_equals_one_that_held_only_those_positions(name, sizes, L, back, after, seed):
    make = MAKERS[name]
    n = max(L - back, 0)
    k, v = data(L + sum(after), seed)
    cache = make()
    feed(cache, k, v, chunks_of(L, sizes))
    try:
        cache.truncate(n)
    except ValueError as e:
        assert "roll back only to position" in str(e) and len(cache) == L  # refused, by name, and unchanged
        fresh = make()
        feed(fresh, k, v, chunks_of(L, sizes))
        assert [x[0].tolist() for x in feed(cache, k, v, after, L)] == [x[0].tolist() for x in
                                                                          feed(fresh, k, v, after, L)]
        return
    assert len(cache) == n
    fresh = make()
    feed(fresh, k, v, chunks_of(n, sizes))
    for (K, V, m), (K2, V2, m2) in zip(feed(cache, k, v, after, n), feed(fresh, k, v, after, n), strict=True):
        np.testing.assert_array_equal(K, K2)
        np.testing.assert_array_equal(V, V2)
        assert (m is None and m2 is None) or np.array_equal(m, m2)
    if isinstance(cache, type(Paged())):
        assert cache.pool.blocks_free == fresh.pool.blocks_free  # every block it no longer needs went back


def test_a_ring_with_no_slack_cannot_roll_back_once_it_has_wrapped():
    cache = WindowKVCache(Hkv, d, 4)
    feed(cache, *data(6, 0), [6])
    with pytest.raises(ValueError, match="roll back only to position 6"):
        cache.truncate(5)
    slack = WindowKVCache(Hkv, d, 4, slack=2)
    feed(slack, *data(6, 0), [6])
    slack.truncate(4)
    with pytest.raises(ValueError, match="roll back only to position 4"):
        slack.truncate(3)


def test_a_truncated_paged_sequence_returns_its_blocks_and_keeps_shared_ones():
    pool = PagedKVCache(8, 4, Hkv, d, np.float32)
    a = pool.new_sequence()
    k, v = data(10, 1)
    pool.sequence(a).append(k, v)  # 3 blocks
    b = pool.fork(a)  # shares all 3
    pool.truncate(b, 5)  # b keeps 2 blocks; the third is still a's
    assert pool.blocks_free == 5 and pool.block_table(b) == pool.block_table(a)[:2] == [0, 1]
    pool.sequence(b).append(k[:, :1], v[:, :1])  # b writes into its shared, half-filled block: copy-on-write
    assert pool.block_table(b) == [0, 3] and pool.blocks_free == 4
    np.testing.assert_array_equal(pool.gather(a)[0][:, 5], k[:, 5])  # a's position 5 is untouched
    pool.truncate(a, 0)
    assert pool.blocks_free == 6 and pool.block_table(a) == []


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_bad_truncations_are_named_and_change_nothing(name):
    cache = MAKERS[name]()
    feed(cache, *data(3, 2), [3])
    with pytest.raises(ValueError, match="holds only 3 positions"):
        cache.truncate(4)
    with pytest.raises(TypeError, match="n must be an integer"):
        cache.truncate(1.5)
    with pytest.raises(ValueError, match="n must be at least 0"):
        cache.truncate(-1)
    assert len(cache) == 3
