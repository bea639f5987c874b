"""One test per suspect that its checker accepts: each fails on the broken version and passes on every right one.

They are what the notebook's solutions look like, and each checker carries its suspect's as `.reference`. Every
one compares against a full recompute (kvlesson.attention, or one pass through a plain KVCache), never against
another version of the suspect. The data are seeded, so a test gives the same verdict every time it runs.
"""
import math

import numpy as np

from kvlesson import KVCache, attention, step

__all__ = ["TESTS"]

H, Hkv, d, D, N = 4, 2, 8, 16, 10
_rng = np.random.default_rng(12)
Wq, Wk, Wv = (_rng.standard_normal((D, n * d)) / math.sqrt(D) for n in (H, Hkv, Hkv))  # a small random layer
x = _rng.standard_normal((N, D))  # [N, D]: ten tokens
q = _rng.standard_normal((H, N, d))  # [H, N, d]
k, v = _rng.standard_normal((2, Hkv, N, d))  # [Hkv, N, d] each


def close(a, b):
    """float64 against a full recompute: equal up to rounding in the last bits."""
    return np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=0, atol=1e-12)


def attend_test(suspect):
    """A prefill against attention, then a chunk of 4 onto 6 cached keys against the same rows."""
    full = attention(q, k, v)
    assert close(suspect(q, k, v), full)
    assert close(suspect(q[:, 6:], k, v), full[:, 6:])


def layer_test(suspect):
    """One full pass against the same tokens in a prefill of 5, decode steps and a chunk."""
    full = suspect(x, Wq, Wk, Wv, KVCache(Hkv, d), H, Hkv, 10000.0)
    cache = KVCache(Hkv, d)
    parts = [suspect(x[a:b], Wq, Wk, Wv, cache, H, Hkv, 10000.0) for a, b in ((0, 5), (5, 6), (6, 9), (9, 10))]
    assert close(np.concatenate(parts), full)


def cache_test(suspect):
    """Keys that are their own positions must come back in position order, after every append."""
    cache = suspect(1, 1)
    for start, T in ((0, 3), (3, 2), (5, 0), (5, 1)):
        block = np.arange(start, start + T, dtype=float).reshape(1, T, 1)  # [Hkv=1, T, d=1]
        K, V = cache.append(block, block)
        assert K[0, :, 0].tolist() == list(range(start + T)) and len(cache) == start + T


def window_test(suspect):
    """A window of 4 under kvlesson.step: decode, chunks of 3, and chunks longer than the window."""
    W = 4
    full = step(x, Wq, Wk, Wv, KVCache(Hkv, d), H, Hkv, window=W)
    for sizes in ((1,) * N, (3, 3, 3, 1), (5, 5)):
        cache, ends = suspect(Hkv, d, W), np.cumsum((0, *sizes))
        parts = [step(x[a:b], Wq, Wk, Wv, cache, H, Hkv) for a, b in zip(ends[:-1], ends[1:], strict=True)]
        assert close(np.concatenate(parts), full)


def padded_test(suspect):
    """Two prompts, with 0 and 3 pads: each real row must equal its sequence alone, without padding."""
    pads, r = np.array([0, 3]), np.random.default_rng(5)
    qb, kb, vb = (r.standard_normal((2, n, 6, d)) for n in (H, Hkv, Hkv))  # B = 2, T = S = 6
    out = suspect(qb, kb, vb, pads)
    for b, p in enumerate(pads):
        assert close(out[b, :, p:], attention(qb[b, :, p:], kb[b, :, p:], vb[b, :, p:]))


def pool_test(suspect):
    """Fork a sequence of 6 (blocks of 4), then parent and child each append a different key."""
    pool = suspect(8, 4, 1, 1)
    a = pool.new_sequence()
    pool.sequence(a).append(*np.arange(12.0).reshape(2, 1, 6, 1))  # keys 0..5, values 6..11
    b = pool.fork(a)
    for seq, key in ((a, 100.0), (b, 200.0)):
        pool.sequence(seq).append(np.full((1, 1, 1), key), np.full((1, 1, 1), key))
    K, _ = pool.sequence(a).append(np.zeros((1, 0, 1)), np.zeros((1, 0, 1)))  # an empty append hands back a's keys
    assert K[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 100]


def stream_test(suspect):
    """Several block sizes, for a prefill and a chunk, against attention."""
    for block in (1, 3, 4, 10):
        assert close(suspect(q, k, v, block), attention(q, k, v))
        assert close(suspect(q[:, 7:], k, v, block), attention(q[:, 7:], k, v))


TESTS = {  # case key -> its test
    "the top-left mask": attend_test,
    "np.tile's head pairing": attend_test,
    "RoPE at local positions": layer_test,
    "the newest-first cache": cache_test,
    "evict before attend": window_test,
    "pads left visible": padded_test,
    "copy-on-write forgotten": pool_test,
    "the online softmax without rescaling": stream_test,
}
