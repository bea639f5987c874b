"""The card's own test, unchanged in behaviour."""
import numpy as np

from kvlesson import KVCache, step


def test_prefill_then_decode_equals_one_full_pass():
    rng = np.random.default_rng(0)
    H, Hkv, d, D, N = 8, 2, 16, 64, 13
    Wq = rng.standard_normal((D, H * d)) / 8
    Wk = rng.standard_normal((D, Hkv * d)) / 8
    Wv = rng.standard_normal((D, Hkv * d)) / 8
    x = rng.standard_normal((N, D))

    full = step(x, Wq, Wk, Wv, KVCache(Hkv, d), H, Hkv)
    cache = KVCache(Hkv, d)
    parts = [step(x[:5], Wq, Wk, Wv, cache, H, Hkv)]
    parts += [step(x[i:i + 1], Wq, Wk, Wv, cache, H, Hkv) for i in range(5, N)]
    assert np.abs(full - np.concatenate(parts)).max() < 1e-12
    assert step(x[:0], Wq, Wk, Wv, KVCache(Hkv, d), H, Hkv).shape == (0, 128)
