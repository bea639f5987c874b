"""Cache behaviour beyond equivalence: T = 0, growth, bounded memory, order, dtype."""
import numpy as np

from kvlesson import KVCache, StaticKVCache, WindowKVCache, attention, step
from kvlesson.model import forward, new_cache, random_weights, tiny_config


def block(T, Hkv=2, d=4, start=0, dtype=np.float64):
    """A [Hkv, T, d] block whose entries record their absolute position."""
    return np.broadcast_to(np.arange(start, start + T, dtype=dtype)[None, :, None], (Hkv, T, d)).copy()


def test_empty_append_changes_nothing():
    for cache in (KVCache(2, 4), StaticKVCache(2, 4, 6), WindowKVCache(2, 4, 3)):
        cache.append(block(4), block(4))
        before = len(cache), cache.nbytes
        K, V = cache.append(block(0), block(0))
        assert (len(cache), cache.nbytes) == before
        assert K.shape[1] == min(4, (cache.window or 99) - 1)


def test_empty_step_returns_empty_in_input_dtype():
    x = np.zeros((0, 6), np.float32)
    W = np.zeros((6, 8), np.float32)
    out = step(x, W, W, W, StaticKVCache(2, 4, 3, np.float32), 2, 2)
    assert out.shape == (0, 8) and out.dtype == np.float32


def test_window_cache_hands_back_last_W_minus_1_plus_T_in_order():
    cache = WindowKVCache(2, 4, window=4)
    seen = 0
    for T in (1, 5, 2, 0, 3, 1, 7):
        K, _ = cache.append(block(T, start=seen), block(T, start=seen))
        want = np.arange(max(0, seen - 3), seen + T)
        np.testing.assert_array_equal(K[0, :, 0], want)
        seen += T
        assert len(cache) == seen


def test_window_cache_memory_is_bounded_over_10000_tokens():
    cache = WindowKVCache(3, 64, window=128, dtype=np.float32)
    sizes = set()
    rng = np.random.default_rng(0)
    while len(cache) < 10_000:
        T = int(rng.integers(1, 40))
        cache.append(block(T, 3, 64, len(cache), np.float32), block(T, 3, 64, len(cache), np.float32))
        sizes.add(cache.nbytes)
    assert sizes == {2 * 3 * 127 * 64 * 4}


def test_static_cache_writes_in_place_and_returns_views():
    cache = StaticKVCache(2, 4, 10)
    buf = cache.k
    K, _ = cache.append(block(3), block(3))
    K2, _ = cache.append(block(2, start=3), block(2, start=3))
    assert cache.k is buf and np.shares_memory(K2, buf)
    np.testing.assert_array_equal(K2[0, :, 0], np.arange(5))
    assert cache.nbytes == 2 * 2 * 10 * 4 * 8


def test_concatenating_cache_grows_with_tokens():
    cache = KVCache(2, 4, np.float32)
    for n in range(1, 5):
        cache.append(block(1, dtype=np.float32), block(1, dtype=np.float32))
        assert cache.nbytes == 2 * 2 * n * 4 * 4


def test_float32_end_to_end_through_attention_and_model():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3, 8), (2, 5, 8), (2, 5, 8)))
    assert attention(q, k, v).dtype == np.float32
    assert attention(q, k, v, window=2).dtype == np.float32
    cfg = tiny_config(n_layers=2)
    w = random_weights(cfg, seed=1)
    caches = new_cache(cfg)
    logits = forward(cfg, w, [1, 2, 3], caches)
    assert logits.dtype == np.float32 and all(c.k.dtype == np.float32 for c in caches)
    assert forward(cfg, w, [4], caches).dtype == np.float32


def test_tiny_model_cached_equals_uncached():
    from kvlesson.model import generate
    cfg = tiny_config()
    w = random_weights(cfg, seed=0)
    assert generate(cfg, w, [5, 6, 7], 12) == generate(cfg, w, [5, 6, 7], 12, use_cache=False)
