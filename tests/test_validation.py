"""Odd input gets a TypeError or ValueError that names the argument, before any state moves.

Each case here was silently wrong or crashed obscurely before kvlesson.validate existed:
window=1.5 acted as 2, window=True as 1, window=nan gave all-NaN rows, causal_mask(2.5, 5) had 3 rows,
apply_rope on an integer array zeroed every position after 0, rope_base 0 gave NaN, lists raised
AttributeError 'ndim', integer arrays raised numpy's UFuncTypeError, d = 0 raised ZeroDivisionError,
and a step with one float32 weight advanced a float64 cache before attention refused the dtypes.
"""
import numpy as np
import pytest

from kvlesson import KVCache, StaticKVCache, WindowKVCache, apply_rope, attention, causal_mask, step, validate

rng = np.random.default_rng(0)


def arr(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


Q, K = arr(2, 3, 4), arr(2, 5, 4)


@pytest.mark.parametrize("window, error, words", [
    (1.5, TypeError, "window must be an integer; got window=1.5"),
    (True, TypeError, "window must be an integer, not a bool"),
    (float("nan"), TypeError, "window must be an integer; got window=nan"),
    ("3", TypeError, "window must be an integer"),
    (0, ValueError, "window must be at least 1; got window=0"),
])
def test_window_must_be_a_positive_integer(window, error, words):
    for call in (lambda: attention(Q, K, K, window=window), lambda: causal_mask(3, 5, window=window),
                 lambda: WindowKVCache(2, 4, window)):
        with pytest.raises(error, match=words):
            call()


def test_numpy_integers_are_integers():
    assert causal_mask(np.int64(2), np.int32(5), window=np.int8(2)).shape == (2, 5)


@pytest.mark.parametrize("T, S, error, words", [
    (2.5, 5, TypeError, "T must be an integer; got T=2.5"),
    (2, 5.0, TypeError, "S must be an integer; got S=5.0"),
    (-1, 5, ValueError, "T must be at least 0; got T=-1"),
    (True, 5, TypeError, "T must be an integer, not a bool"),
])
def test_mask_sizes_must_be_integers(T, S, error, words):
    with pytest.raises(error, match=words):
        causal_mask(T, S)


@pytest.mark.parametrize("name, q, k, v, error, words", [
    ("int q", np.ones((2, 3, 4), int), K, K, TypeError, "q must hold floating-point numbers; got dtype int64"),
    ("int k", Q, np.ones((2, 5, 4), int), K, TypeError, "k must hold floating-point numbers"),
    ("bool v", Q, K, np.ones((2, 5, 4), bool), TypeError, "v must hold floating-point numbers; got dtype bool"),
    ("complex q", Q.astype(complex), K, K, TypeError, "q must hold floating-point numbers; got dtype complex128"),
    ("ragged q", [[[1.0, 2.0]], [[1.0]]], K, K, ValueError, "q is not a rectangular array"),
    ("d = 0", np.zeros((2, 3, 0)), np.zeros((2, 5, 0)), np.zeros((2, 5, 0)), ValueError, "d must be at least 1"),
])
def test_attention_refuses_what_it_cannot_compute_with(name, q, k, v, error, words):
    with pytest.raises(error, match=words):
        attention(q, k, v)


def test_attention_takes_lists_of_floats_as_float64():
    got = attention(Q.tolist(), K.tolist(), K.tolist())
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, attention(Q, K, K))


@pytest.mark.parametrize("x, positions, base, error, words", [
    (np.ones((3, 4), int), [0, 1, 2], 10000.0, TypeError, "x must hold floating-point numbers; got dtype int64"),
    (arr(3, 4), [0, 1, 2], 0.0, ValueError, "base must be finite and above 0; got base=0.0"),
    (arr(3, 4), [0, 1, 2], -5, ValueError, "base must be finite and above 0"),
    (arr(3, 4), [0, 1, 2], float("nan"), ValueError, "base must be finite and above 0"),
    (arr(3, 4), [0, 1, 2], True, TypeError, "base must be a real number"),
    (arr(3, 4), [0, 1, 2], 1e4 + 0j, TypeError, "base must be a real number"),
    (arr(3, 4), [True, False, True], 10000.0, TypeError, "positions must be integers"),
    (arr(3, 4), [0, float("nan"), 2], 10000.0, ValueError, "positions must be finite"),
    (arr(3, 0), [0, 1, 2], 10000.0, ValueError, "even head dim d >= 2"),
])
def test_rope_refuses_bad_input(x, positions, base, error, words):
    with pytest.raises(error, match=words):
        apply_rope(x, positions, base)


def test_rope_on_a_list_matches_rope_on_its_array():
    x = arr(3, 4)
    np.testing.assert_array_equal(apply_rope(x.tolist(), [0, 1, 2]), apply_rope(x, np.arange(3)))


@pytest.mark.parametrize("make, error, words", [
    (lambda: KVCache(2.0, 4), TypeError, "Hkv must be an integer; got Hkv=2.0"),
    (lambda: KVCache(2, True), TypeError, "d must be an integer, not a bool"),
    (lambda: KVCache(2, 0), ValueError, "d must be at least 1; got d=0"),
    (lambda: KVCache(2, 4, dtype=np.int32), TypeError, "dtype must be a floating dtype"),
    (lambda: KVCache(2, 4, dtype="not a dtype"), TypeError, "dtype must be a numpy dtype"),
    (lambda: StaticKVCache(2, 4, 8.5), TypeError, "capacity must be an integer; got capacity=8.5"),
    (lambda: WindowKVCache(2, 4, 1.5), TypeError, "window must be an integer"),
])
def test_cache_constructors_name_the_bad_argument(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize("make", [lambda: KVCache(2, 4), lambda: StaticKVCache(2, 4, 8),
                                  lambda: WindowKVCache(2, 4, 3)])
def test_append_takes_lists_and_refuses_integers_unchanged(make):
    cache, ref = make(), make()
    k, v = arr(2, 2, 4), arr(2, 2, 4)
    K1, V1 = cache.append(k.tolist(), v.tolist())
    K2, V2 = ref.append(k, v)
    np.testing.assert_array_equal(K1, K2)
    n, nbytes = len(cache), cache.nbytes
    with pytest.raises(TypeError, match="k_new must hold floating-point numbers"):
        cache.append(np.ones((2, 1, 4), int), v[:, :1])
    assert (len(cache), cache.nbytes) == (n, nbytes)


def layer(H=4, Hkv=2, d=4, D=6, T=5, dtype=np.float64):
    return arr(T, D, dtype=dtype), arr(D, H * d, dtype=dtype), arr(D, Hkv * d, dtype=dtype), arr(D, Hkv * d,
                                                                                                   dtype=dtype)


@pytest.mark.parametrize("change, error, words", [
    (dict(Wq=layer(dtype=np.float32)[1]), ValueError, "x float64, Wq float32, Wk float64, Wv float64"),
    (dict(all32=True), ValueError, "the cache holds float64 but x and the weights are float32"),
    (dict(rope_base=0.0), ValueError, "rope_base must be finite and above 0; got rope_base=0.0"),
    (dict(rope_base=-1e4), ValueError, "rope_base must be finite and above 0"),
    (dict(window=1.5), TypeError, "window must be an integer; got window=1.5"),
    (dict(window=True), TypeError, "window must be an integer, not a bool"),
    (dict(H=4.0), TypeError, "H must be an integer; got H=4.0"),
    (dict(x=np.ones((5, 6), int)), TypeError, "x must hold floating-point numbers; got dtype int64"),
    (dict(cache="a cache"), TypeError, "cache must be a KV cache"),
])
def test_a_rejected_step_leaves_the_cache_where_it_was(change, error, words):
    x, Wq, Wk, Wv = layer()
    args = dict(x=x, Wq=Wq, Wk=Wk, Wv=Wv, cache=KVCache(2, 4), H=4, Hkv=2)
    if change.pop("all32", False):
        args.update({n: a.astype(np.float32) for n, a in zip(("x", "Wq", "Wk", "Wv"), (x, Wq, Wk, Wv), strict=True)})
    args.update(change)
    cache = args["cache"]
    with pytest.raises(error, match=words):
        step(**args)
    if isinstance(cache, KVCache):
        assert len(cache) == 0 and cache.nbytes == 0


def test_step_takes_lists_of_floats():
    x, Wq, Wk, Wv = layer()
    got = step(x.tolist(), Wq.tolist(), Wk.tolist(), Wv.tolist(), KVCache(2, 4), 4, 2, rope_base=100)
    np.testing.assert_array_equal(got, step(x, Wq, Wk, Wv, KVCache(2, 4), 4, 2, rope_base=100.0))


@pytest.mark.parametrize("value, error", [(3, None), (np.int16(3), None), (3.0, TypeError), ("3", TypeError),
                                          (None, TypeError), (False, TypeError), (-1, ValueError)])
def test_validate_integer(value, error):
    if error is None:
        assert validate.integer("n", value) == 3
    else:
        with pytest.raises(error, match="n must be"):
            validate.integer("n", value)


def test_attention_takes_a_cache_rule_as_an_explicit_mask():
    q, k = arr(2, 3, 4), arr(2, 5, 4)
    mask = causal_mask(3, 5, window=2)
    np.testing.assert_array_equal(attention(q, k, k, mask=mask), attention(q, k, k, window=2))
    with pytest.raises(ValueError, match="a window or a mask, not both"):
        attention(q, k, k, window=2, mask=mask)
    with pytest.raises(ValueError, match=r"mask must be bool \[T=3, S=5\]; got float64 \(3, 5\)"):
        attention(q, k, k, mask=mask.astype(float))
    with pytest.raises(ValueError, match="a row of the mask is all False"):
        attention(q, k, k, mask=np.zeros((3, 5), bool))


def test_step_follows_a_cache_that_brings_its_own_mask():
    """A cache with a mask(T) method decides what the new queries see; here: every query sees only key 0."""

    class FirstKeyOnly(KVCache):
        def mask(self, T):
            m = np.zeros((T, len(self)), bool)
            m[:, 0] = True
            return m

    x, Wq, Wk, Wv = layer()
    cache = FirstKeyOnly(2, 4)
    out = step(x, Wq, Wk, Wv, cache, 4, 2)  # [T, H*d]
    v0 = (x[:1] @ Wv).reshape(2, 4)  # the value of key 0, per KV head
    want = np.repeat(v0, 2, axis=0).reshape(1, -1)  # query head h reads KV head h // 2
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-12, atol=1e-12)
