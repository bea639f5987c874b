"""Bad input raises ValueError naming the shapes or values, and leaves every cache as it was."""
import numpy as np
import pytest

from kvlesson import KVCache, StaticKVCache, WindowKVCache, apply_rope, attention, causal_mask, step

rng = np.random.default_rng(0)


def arr(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("q, k, v, kwargs, words", [
    (arr(3, 2, 4), arr(2, 5, 4), arr(2, 5, 4), {}, "H=3 query heads must be a multiple of Hkv=2"),
    (arr(4, 2, 4), arr(2, 5, 8), arr(2, 5, 8), {}, "head dims differ"),
    (arr(4, 2, 4), arr(2, 5, 4), arr(2, 6, 4), {}, "k (2, 5, 4), v (2, 6, 4)"),
    (arr(4, 6, 4), arr(2, 5, 4), arr(2, 5, 4), {}, "T=6 > S=5"),
    (arr(4, 2, 4), arr(2, 5, 4), arr(2, 5, 4), {"window": 0}, "window=0"),
    (arr(4, 2), arr(2, 5, 4), arr(2, 5, 4), {}, "q (4, 2)"),
    (arr(4, 2, 4, dtype=np.float32), arr(2, 5, 4), arr(2, 5, 4), {}, "q float32, k float64, v float64"),
])
def test_attention_rejects(q, k, v, kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        attention(q, k, v, **kwargs)


def test_mask_rejects_T_above_S_and_bad_window():
    with pytest.raises(ValueError, match="T=4, S=3"):
        causal_mask(4, 3)
    with pytest.raises(ValueError, match="window=0"):
        causal_mask(2, 3, window=0)


def test_rope_rejects_odd_head_dim_and_wrong_positions():
    with pytest.raises(ValueError, match=r"x \(2, 3, 5\)"):
        apply_rope(arr(2, 3, 5), [0, 1, 2])
    with pytest.raises(ValueError, match=r"positions \(2,\)"):
        apply_rope(arr(2, 3, 4), [0, 1])


def snapshot(cache):
    return len(cache), cache.nbytes, cache.k.copy(), cache.v.copy()


def assert_unchanged(cache, before):
    n, nbytes, k, v = before
    assert (len(cache), cache.nbytes) == (n, nbytes)
    np.testing.assert_array_equal(cache.k, k)
    np.testing.assert_array_equal(cache.v, v)


@pytest.mark.parametrize("make", [
    lambda: KVCache(2, 4), lambda: StaticKVCache(2, 4, 8), lambda: WindowKVCache(2, 4, 3)])
@pytest.mark.parametrize("k_new, v_new, words", [
    (arr(3, 2, 4), arr(3, 2, 4), r"Hkv=2, T, d=4\] blocks; got k_new \(3, 2, 4\)"),
    (arr(2, 2, 5), arr(2, 2, 5), r"got k_new \(2, 2, 5\)"),
    (arr(2, 2, 4), arr(2, 3, 4), r"\(2, 2, 4\) and \(2, 3, 4\)"),
    (arr(2, 2, 4, dtype=np.float32), arr(2, 2, 4, dtype=np.float32), "holds float64; got k_new float32"),
])
def test_caches_reject_wrong_blocks_and_stay_unchanged(make, k_new, v_new, words):
    cache = make()
    cache.append(arr(2, 2, 4), arr(2, 2, 4))
    before = snapshot(cache)
    with pytest.raises(ValueError, match=words):
        cache.append(k_new, v_new)
    assert_unchanged(cache, before)


def test_static_cache_overflow_leaves_it_exactly_as_it_was():
    cache = StaticKVCache(2, 4, capacity=5)
    cache.append(arr(2, 3, 4), arr(2, 3, 4))
    before = snapshot(cache)
    with pytest.raises(ValueError, match="holds 3 of 5 positions and cannot take T=3"):
        cache.append(arr(2, 3, 4), arr(2, 3, 4))
    assert_unchanged(cache, before)
    cache.append(arr(2, 2, 4), arr(2, 2, 4))  # what still fits, fits
    assert len(cache) == 5


@pytest.mark.parametrize("make, words", [
    (lambda: KVCache(0, 4), "Hkv=0"), (lambda: StaticKVCache(2, 4, -1), "capacity"),
    (lambda: WindowKVCache(2, 4, 0), "window=0")])
def test_cache_constructors_reject(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def layer(H=4, Hkv=2, d=4, D=6, T=3):
    return arr(T, D), arr(D, H * d), arr(D, Hkv * d), arr(D, Hkv * d)


@pytest.mark.parametrize("change, words", [
    (dict(H=3), "H=3 query heads must be a positive multiple of Hkv=2"),
    (dict(Wk=arr(6, 12)), r"Wk must be \[D, Hkv\*d\] = \(6, 8\)"),
    (dict(Wv=arr(5, 8)), r"Wv must be \[D, Hkv\*d\] = \(6, 8\)"),
    (dict(Wq=arr(5, 16)), r"Wq must be \[D=6, H\*d\]"),
    (dict(x=arr(6)), r"x must be \[T, D\]; got \(6,\)"),
    (dict(cache=KVCache(1, 4)), "cache holds Hkv=1, d=4; this layer has Hkv=2, d=4"),
    (dict(window=0), "window=0"),
    (dict(cache=WindowKVCache(2, 4, 3), window=5), "step\\(window=5\\) disagrees with the cache's window=3"),
    (dict(Wq=arr(6, 12), Wk=arr(6, 6), Wv=arr(6, 6), rope_base=10000.0), r"even head dim d; got d=3"),
])
def test_step_rejects_and_leaves_cache_unchanged(change, words):
    x, Wq, Wk, Wv = layer()
    args = dict(x=x, Wq=Wq, Wk=Wk, Wv=Wv, cache=KVCache(2, 4), H=4, Hkv=2, window=None, rope_base=None)
    args.update(change)
    cache = args["cache"]
    if "Wk" in change and change["Wk"].shape == (6, 6):  # odd head dim: the cache must match it
        cache = args["cache"] = KVCache(2, 3)
    before = snapshot(cache)
    with pytest.raises(ValueError, match=words):
        step(**args)
    assert_unchanged(cache, before)
