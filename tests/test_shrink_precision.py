"""kvlesson.shrink.precision: the formats, bfloat16 rounding by hand, narrow sums (running, pairwise, Kahan), attention
in low precision, and the 16- and 8-bit KV cache."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import StaticKVCache, attention, step
from kvlesson.shrink.precision import (
    LowPrecisionKVCache,
    attention_in,
    bfloat16,
    e4m3,
    e5m2,
    formats,
    kahan_sum,
    pairwise_sum,
    round_bf16,
    running_sum,
    scale_for,
)
from tests.helpers import layers, reference, run_chunks

# ---------------------------------------------------------------------------------------------- the formats


def test_the_format_table_reads_ml_dtypes_finfo():
    rows = {r["name"]: r for r in formats()}
    assert list(rows) == ["float64", "float32", "bfloat16", "float16"]
    assert (rows["bfloat16"]["exponent"], rows["bfloat16"]["mantissa"], rows["bfloat16"]["eps"]) == (8, 7, 2**-7)
    assert (rows["float16"]["exponent"], rows["float16"]["mantissa"], rows["float16"]["max"]) == (5, 10, 65504.0)
    assert rows["float32"]["eps"] == 2**-23 and rows["bfloat16"]["max"] == float(ml_dtypes.finfo(bfloat16).max)
    assert all(r["bits"] == 1 + r["exponent"] + r["mantissa"] for r in rows.values())


# ------------------------------------------------------------------------------------- bfloat16 by hand

KNOWN = [  # float32 value -> the bfloat16 it must round to
    (1.0, 1.0),
    (1 + 2**-8, 1.0),  # a tie between 1 and 1 + 2^-7: to the even neighbour, 1
    (1 + 3 * 2**-8, 1 + 2**-6),  # a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even)
    (1 + 2**-8 + 2**-20, 1 + 2**-7),  # just above the tie: up
    (1 / 3, 0.333984375),
    (257.0, 256.0),  # bfloat16 cannot count past 256: 257 is a tie, to even
    (259.0, 260.0),
    (-2.0 + 2**-22, -2.0),  # a carry into the exponent
    (3.3895314e38, 3.3895314e38),  # bfloat16's largest value
    (3.4028235e38, np.inf),  # float32's largest rounds past it
    (-np.inf, -np.inf),
    (2.0**-130, 2.0**-130),  # a subnormal that bfloat16 holds exactly
    (-0.0, -0.0),
]


@pytest.mark.parametrize("x, want", KNOWN)
def test_round_bf16_on_known_values(x, want):
    x32 = np.array([x], np.float32)
    got = round_bf16(x32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array([want], np.float32))
    np.testing.assert_array_equal(got, x32.astype(bfloat16).astype(np.float32))  # ml_dtypes agrees
    assert np.signbit(got[0]) == np.signbit(np.float32(want))


def test_round_bf16_keeps_nan_as_nan():
    x = np.array([np.nan, -np.nan], np.float32)
    x = np.concatenate([x, np.array([0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)])  # signalling, all ones
    assert np.isnan(round_bf16(x)).all()


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_round_bf16_equals_ml_dtypes_on_any_bit_pattern(words):
    x = np.array(words, np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # ml_dtypes' cast warns on a signalling NaN, which round_bf16 keeps as NaN
        want = x.astype(bfloat16).astype(np.float32)
    np.testing.assert_array_equal(round_bf16(x), want)


@pytest.mark.parametrize("x, error", [(np.ones(3), TypeError), (np.ones(3, np.float16), TypeError),
                                      (np.ones(3, int), TypeError)])
def test_round_bf16_takes_float32_only(x, error):
    with pytest.raises(error, match="x must"):
        round_bf16(x)


# --------------------------------------------------------------------------------------------- running sums

def test_a_bfloat16_running_sum_stalls_at_256_terms():
    """Terms of 2^-15: once the total is 2^-7 = 256 terms, each new term is exactly half a step, a tie that
    rounds back to the even total; the sum stays there. In float32 the sum is exact."""
    terms = np.full(2**15, 2.0**-15)
    assert running_sum(terms, bfloat16) == 2.0**-7
    assert running_sum(terms, np.float32) == 1.0
    assert running_sum(terms, bfloat16).dtype == bfloat16


def test_a_float16_running_sum_is_kept_in_float16():
    """numpy sums float16 with a float32 total inside; running_sum rounds after every addition."""
    terms = np.full(4096, 2.0**-12, np.float16)
    assert terms.sum() == 1.0
    assert running_sum(terms, np.float16) == 2.0**-1  # stalls at 2048 terms: half a step of 2^-11 is 2^-12


def test_running_sum_along_an_axis():
    x = np.arange(24.0).reshape(2, 3, 4)
    for axis in (0, 1, 2, -1):
        np.testing.assert_array_equal(running_sum(x, np.float64, axis), x.sum(axis=axis))


@pytest.mark.parametrize("total", [running_sum, pairwise_sum, kahan_sum])
@pytest.mark.parametrize("dtype", [int, np.complex64, "not a dtype", ml_dtypes.int4])
def test_the_sums_refuse_what_is_not_a_floating_format(total, dtype):
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        total(np.ones(3), dtype)


@pytest.mark.parametrize("total", [pairwise_sum, kahan_sum])
def test_pairwise_and_kahan_sums_reach_1_where_the_running_sum_stalls(total):
    terms = np.full(2**15, 2.0**-15)
    assert total(terms, bfloat16) == 1.0 and total(terms, bfloat16).dtype == bfloat16
    assert running_sum(terms, bfloat16) == 2.0**-7


def test_numpy_sums_float16_pairwise_in_float32():
    """2048 plus seven 1s: a float16 running total stays at 2048 (each 1 is half a step, a tie to even); numpy's
    float16 sum adds in float32 (2055) and rounds once, to 2056."""
    x = np.array([2048] + [1] * 7, np.float16)
    assert running_sum(x, np.float16) == 2048 and x.sum() == 2056 and x.sum().dtype == np.float16
    y = np.random.default_rng(3).standard_normal(10_000).astype(np.float16)
    exact = y.astype(np.float64).sum()
    half_step = float(np.spacing(np.abs(y.sum()))) / 2  # the float16 rounding of a float32 total
    assert abs(float(y.sum()) - exact) <= half_step + 1e-2  # float32 partial sums: off by far less than 1e-2
    assert abs(float(running_sum(y, np.float16)) - exact) > 10 * half_step  # a float16 total drifts much further


@given(st.lists(st.floats(-1e3, 1e3), max_size=300), st.sampled_from([bfloat16, np.float16, np.float32]))
def test_pairwise_and_kahan_sums_are_within_their_bounds(values, dtype):
    """Rounded after every operation: pairwise within about log2(n) eps of the sum of |x|, Kahan within 2 eps of
    the result plus n eps^2 of the sum of |x| (Higham, Accuracy and Stability of Numerical Algorithms, 4.2, 4.3)."""
    x = np.array(values, np.float64).astype(dtype).astype(np.float64)  # the terms as the format holds them
    exact, size, n = x.sum(), np.abs(x).sum(), len(values)
    eps = float(ml_dtypes.finfo(dtype).eps)
    assert abs(float(pairwise_sum(x, dtype)) - exact) <= (math.ceil(math.log2(max(n, 2))) + 1) * eps * size
    assert abs(float(kahan_sum(x, dtype)) - exact) <= 2 * eps * abs(exact) + (n * eps**2 + eps) * size


def test_the_sums_along_an_axis_and_of_nothing():
    x = np.arange(24.0).reshape(2, 3, 4)
    for total in (pairwise_sum, kahan_sum):
        for axis in (0, 1, 2, -1):
            np.testing.assert_array_equal(total(x, np.float64, axis), x.sum(axis=axis))
        assert total(np.zeros((0, 3)), np.float32, axis=0).shape == (3,)


# ------------------------------------------------------------------------------------------- attention_in

@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.integers(0, 6), st.integers(0, 2**32 - 1))
def test_attention_in_float64_is_attention(Hkv, G, T, extra, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((Hkv * G, T, 4))  # [H, T, d]
    k, v = rng.standard_normal((2, Hkv, T + extra, 4))  # [Hkv, S, d]
    s, p, out = attention_in(q, k, v, store=np.float64, accumulate=np.float64)
    np.testing.assert_allclose(out, attention(q, k, v), rtol=0, atol=1e-12)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    assert s.shape == p.shape == (Hkv * G, T, T + extra)


def test_attention_in_float32_is_float32_and_close():
    """float32 in, float32 sums: about 1e-7 relative from float64, far below the bfloat16 errors (1e-3)."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 1, 64)), rng.standard_normal((1, 300, 64)), rng.standard_normal((1, 300, 64))
    s, p, out = attention_in(q, k, v, store=np.float32, accumulate=np.float32)
    assert s.dtype == p.dtype == out.dtype == np.float32
    np.testing.assert_allclose(out, attention(q, k, v), rtol=0, atol=1e-5)


def test_bfloat16_inputs_with_float32_sums_equal_rounding_the_inputs_first():
    """Products of two bfloat16 numbers (8 significant bits each) are exact in float32 (24 bits)."""
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 1, 64)), rng.standard_normal((1, 50, 64)), rng.standard_normal((1, 50, 64))
    rounded = [round_bf16(a.astype(np.float32)).astype(np.float64) for a in (q, k, v)]
    _, _, out = attention_in(q, k, v, store=bfloat16, accumulate=np.float32)
    np.testing.assert_allclose(out, attention(*rounded), rtol=0, atol=1e-5)


def test_a_bfloat16_accumulator_loses_the_weights_of_a_long_context():
    """4,096 equal scores: each weight is 2^-12, and a bfloat16 total of the exps stalls at 256 of them, so
    every weight comes out 16 times too large; with float32 sums they are right."""
    q, k, v = np.zeros((1, 1, 4)), np.zeros((1, 4096, 4)), np.ones((1, 4096, 4))
    _, p, out = attention_in(q, k, v, store=bfloat16, accumulate=bfloat16)
    assert float(p[0, 0, 0]) == 2.0**-8
    _, p32, out32 = attention_in(q, k, v, store=bfloat16, accumulate=np.float32)
    assert float(p32[0, 0, 0]) == 2.0**-12 and np.all(out32 == 1)


def test_float16_scores_overflow():
    q, k, v = np.full((1, 1, 64), 40.0), np.full((1, 2, 64), 40.0), np.ones((1, 2, 64))
    with np.errstate(over="ignore", invalid="ignore"):
        s, _, out = attention_in(q, k, v, store=np.float16, accumulate=np.float16)
    assert np.isinf(s).all() and np.isnan(out).all()
    s, _, out = attention_in(q, k, v, store=bfloat16, accumulate=bfloat16)
    assert np.isfinite(s).all() and np.all(out == 1)


def test_rounding_p_to_bfloat16_is_what_multiplies_v_over_the_unrounded_sum():
    """FlashAttention-2 rounds the exps to 16 bits for the P.V product and keeps their row sum in float32."""
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 8)), rng.standard_normal((1, 9, 8)), rng.standard_normal((1, 9, 8))
    s, p, out = attention_in(q, k, v, store=bfloat16, accumulate=np.float32, p_store=bfloat16)
    _, p32, out32 = attention_in(q, k, v, store=bfloat16, accumulate=np.float32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # [H, T, S] float32
    np.testing.assert_array_equal(p, e.astype(bfloat16).astype(np.float32) / e.sum(axis=-1, keepdims=True))
    assert not np.array_equal(p, p32) and p.dtype == out.dtype == np.float32
    np.testing.assert_allclose(out, out32, rtol=0, atol=2e-2)  # each weight moves by at most 2^-9 of itself
    same = attention_in(q, k, v, store=bfloat16, accumulate=np.float32, p_store=np.float32)[2]
    np.testing.assert_array_equal(same, out32)


def test_attention_in_names_a_bad_p_store():
    with pytest.raises(TypeError, match="p_store must be a floating dtype"):
        attention_in(np.ones((1, 1, 2)), np.ones((1, 1, 2)), np.ones((1, 1, 2)), store=bfloat16,
                     accumulate=np.float32, p_store=int)


# ------------------------------------------------------------------------------------------ the 16-bit cache

class RoundingCache(StaticKVCache):
    """A float32 StaticKVCache fed keys and values already rounded to `store`: what the 16-bit cache must equal."""

    def __init__(self, Hkv, d, capacity, store):
        super().__init__(Hkv, d, capacity, np.float32)
        self.store = store

    def append(self, k_new, v_new):
        return super().append(*(np.asarray(a).astype(self.store).astype(np.float32) for a in (k_new, v_new)))


@pytest.mark.parametrize("store", [bfloat16, np.float16])
@given(c=layers(windowed=False))
def test_a_16_bit_cache_equals_rounding_what_goes_in(store, c):
    got = run_chunks(c, LowPrecisionKVCache(c["Hkv"], c["d"], c["N"] + 2, store), np.float32)
    want = run_chunks(c, RoundingCache(c["Hkv"], c["d"], c["N"] + 2, store), np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@given(c=layers(windowed=False))
def test_a_bfloat16_cache_stays_near_the_full_pass(c):
    """Keys and values rounded to 8 significant bits (relative error at most 2^-9) move the outputs of these
    small layers (|x|, |W| ~ 1, D <= 12) by a few parts in a thousand; 0.05 leaves room and still flags a wrong
    position or a lost key, which moves them by order 1."""
    got = run_chunks(c, LowPrecisionKVCache(c["Hkv"], c["d"], c["N"] + 2, bfloat16), np.float32)
    np.testing.assert_allclose(got, reference(c), rtol=0, atol=5e-2)


def test_the_cache_protocol():
    cache = LowPrecisionKVCache(Hkv=2, d=4, capacity=10)
    assert cache.dtype == np.float32 and cache.store == bfloat16 and len(cache) == 0
    assert cache.nbytes == 2 * 2 * 10 * 4 * 2  # K and V, [Hkv, capacity, d], 2 bytes each
    assert cache.nbytes * 2 == StaticKVCache(2, 4, 10, np.float32).nbytes
    k = np.full((2, 3, 4), 1 + 2**-8, np.float32)
    K, V = cache.append(k, -k)
    assert K.dtype == V.dtype == np.float32 and K.shape == (2, 3, 4) and len(cache) == 3
    assert np.all(K == 1.0) and np.all(V == -1.0)  # rounded to bfloat16 on the way in
    K, _ = cache.append(np.zeros((2, 0, 4), np.float32), np.zeros((2, 0, 4), np.float32))
    assert K.shape == (2, 3, 4) and len(cache) == 3


@pytest.mark.parametrize("store, k, v, words", [
    (bfloat16, np.ones((2, 3, 4)), np.ones((2, 3, 4)), "this cache holds float32; got k_new float64"),
    (bfloat16, np.ones((3, 3, 4), np.float32), np.ones((3, 3, 4), np.float32), r"\[Hkv=2, T, d=4\]"),
    (bfloat16, np.ones((2, 11, 4), np.float32), np.ones((2, 11, 4), np.float32), "cache full"),
    (np.float16, np.ones((2, 3, 4), np.float32), np.full((2, 3, 4), 7e4, np.float32),
     "v_new holds 70000, beyond float16's largest value 65504"),
])
def test_a_refused_append_changes_nothing(store, k, v, words):
    cache = LowPrecisionKVCache(2, 4, 10, store)
    cache.append(np.ones((2, 2, 4), np.float32), np.ones((2, 2, 4), np.float32))
    before = cache.k.copy(), cache.v.copy(), len(cache)
    with pytest.raises(ValueError, match=words):
        cache.append(k, v)
    assert np.array_equal(cache.k, before[0]) and np.array_equal(cache.v, before[1]) and len(cache) == before[2]


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(store=np.int8), TypeError, "store must be a floating dtype"),
    (dict(store="nonsense"), TypeError, "store must be a floating dtype"),
    (dict(capacity=-1), ValueError, "capacity must be at least 0"),
    (dict(capacity=2.5), TypeError, "capacity must be an integer"),
])
def test_the_cache_checks_its_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        LowPrecisionKVCache(**{**dict(Hkv=2, d=4, capacity=10), **kwargs})


def test_step_runs_on_a_16_bit_cache():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    W = [rng.standard_normal((8, n)).astype(np.float32) / 3 for n in (8, 4, 4)]  # H = 2, Hkv = 1, d = 4
    out = step(x, *W, LowPrecisionKVCache(1, 4, 5), 2, 1, rope_base=10000.0)
    assert out.dtype == np.float32 and out.shape == (5, 8)


# --------------------------------------------------------------------------------------------- the fp8 cache

def fp8_cache(c, store, per, dtype=np.float64, capacity=None):
    """An 8-bit cache for case c with scales set for numbers up to 3 (the sizes these small layers produce), one
    per tensor or one per KV head (heads given different scales, so that a mix-up between heads shows)."""
    scale = 3 / float(ml_dtypes.finfo(store).max)
    k_scale = scale if per == "tensor" else scale * (1 + np.arange(c["Hkv"]) / 4)
    return LowPrecisionKVCache(c["Hkv"], c["d"], c["N"] + 2 if capacity is None else capacity, store, dtype,
                               k_scale=k_scale, v_scale=k_scale / 2, saturate=True)


class ScaledRounding(StaticKVCache):
    """A StaticKVCache fed what an 8-bit cache holds, rounded by ml_dtypes directly: clip(x / scale) to the format,
    back, times the scale."""

    def __init__(self, cache):
        super().__init__(cache.Hkv, cache.d, cache.capacity, cache.dtype)
        self.like = cache

    def append(self, k_new, v_new):
        top = float(ml_dtypes.finfo(self.like.store).max)

        def rounded(x, scale):
            s = scale.astype(np.float64).reshape(-1, 1, 1)
            return (np.clip(x / s, -top, top).astype(self.like.store).astype(np.float64) * s).astype(x.dtype)

        return super().append(rounded(k_new, self.like.k_scale), rounded(v_new, self.like.v_scale))


@pytest.mark.parametrize("store", [e4m3, e5m2])
@pytest.mark.parametrize("per", ["tensor", "head"])
@given(c=layers(windowed=False))
def test_an_fp8_cache_over_any_chunking_equals_one_full_pass_over_the_rounded_keys(store, per, c):
    """Chunked prefill and decode onto the 8-bit cache against one pass over the whole sequence through a cache that
    rounds the same keys and values another way: in float64, to 1e-12."""
    got = run_chunks(c, fp8_cache(c, store, per), np.float64)
    full = {**c, "chunks": [c["N"]]}
    want = run_chunks(full, ScaledRounding(fp8_cache(c, store, per)), np.float64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@given(c=layers(windowed=False))
def test_an_fp8_cache_keeps_float32(c):
    """float32 in, float32 out; against the float64 pass over the same rounded keys, within 1e-4 (float32 rounding
    of these small layers, as in test_core_properties, plus the rounding of the scaled numbers themselves)."""
    got = run_chunks(c, fp8_cache(c, e4m3, "head", np.float32), np.float32)
    assert got.dtype == np.float32
    want = run_chunks({**c, "chunks": [c["N"]]}, ScaledRounding(fp8_cache(c, e4m3, "head")), np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@given(c=layers(windowed=False), data=st.data())
def test_truncate_then_append_equals_a_cache_that_only_saw_the_first_n(c, data):
    n = data.draw(st.integers(0, c["N"]))
    x = np.random.default_rng(c["seed"]).standard_normal((2, c["Hkv"], c["N"], c["d"]))
    rolled, fresh = fp8_cache(c, e4m3, "head"), fp8_cache(c, e4m3, "head")
    rolled.append(x[0], x[1])
    rolled.truncate(n)
    fresh.append(x[0, :, :n], x[1, :, :n])
    assert len(rolled) == len(fresh) == n
    new = np.random.default_rng(c["seed"] + 1).standard_normal((2, c["Hkv"], 2, c["d"]))
    for a, b in zip(rolled.append(*new), fresh.append(*new), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_fp8_formats():
    rows = {r["name"]: r for r in formats((e4m3, e5m2))}
    assert (rows["float8_e4m3fn"]["exponent"], rows["float8_e4m3fn"]["mantissa"], rows["float8_e4m3fn"]["max"]) \
        == (4, 3, 448.0)
    assert (rows["float8_e5m2"]["exponent"], rows["float8_e5m2"]["mantissa"], rows["float8_e5m2"]["max"]) \
        == (5, 2, 57344.0)


def test_an_fp8_cache_stores_one_byte_a_number_and_counts_its_scales():
    per_tensor = LowPrecisionKVCache(3, 4, 10, e4m3, k_scale=0.5, v_scale=0.25)
    per_head = LowPrecisionKVCache(3, 4, 10, e4m3, k_scale=[0.5, 1, 2], v_scale=[1, 1, 1])
    no_scale = LowPrecisionKVCache(3, 4, 10, e4m3)
    assert no_scale.nbytes == 2 * 3 * 10 * 4  # K and V, [Hkv, capacity, d], one byte each
    assert per_tensor.nbytes == no_scale.nbytes + 2 * 4  # one float32 scale for K, one for V
    assert per_head.nbytes == no_scale.nbytes + 2 * 3 * 4  # one for each KV head, of K and of V
    assert per_head.k_scale.dtype == per_tensor.k_scale.dtype == np.float32
    x = np.full((3, 2, 4), 3.0, np.float32)
    K, V = per_head.append(x, -x)
    assert K.dtype == V.dtype == np.float32 and np.array_equal(K, x) and np.array_equal(V, -x)  # 3 / s is exact
    assert per_head.k[:, 0, 0].astype(np.float32).tolist() == [6.0, 3.0, 1.5]  # stored as x / scale


def test_past_the_largest_value_an_fp8_cache_refuses_or_saturates():
    big = np.full((1, 1, 2), 500.0, np.float32)
    refusing = LowPrecisionKVCache(1, 2, 4, e4m3)
    with pytest.raises(ValueError, match="k_new holds 500, beyond float8_e4m3fn's largest value 448"):
        refusing.append(big, big / 10)
    assert len(refusing) == 0 and not refusing.k.astype(np.float32).any()
    with pytest.raises(ValueError, match="once divided by its scale"):
        LowPrecisionKVCache(1, 2, 4, e4m3, k_scale=0.5, v_scale=0.5).append(big / 2, big / 10)
    clipping = LowPrecisionKVCache(1, 2, 4, e4m3, saturate=True)
    K, V = clipping.append(big, -big)
    assert np.all(K == 448.0) and np.all(V == -448.0)
    assert np.isnan(clipping.append(np.full((1, 1, 2), np.nan, np.float32), big)[0][0, 1]).all()


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(k_scale=0.0), ValueError, "k_scale must be finite and above 0"),
    (dict(v_scale=-1.0), ValueError, "v_scale must be finite and above 0"),
    (dict(k_scale=np.nan), ValueError, "k_scale must be finite and above 0"),
    (dict(k_scale=[1.0, 1.0]), ValueError, r"k_scale must be one number \(per tensor\) or 3"),
    (dict(k_scale="big"), TypeError, "k_scale must be a positive number or one per KV head"),
    (dict(k_scale=True), TypeError, "k_scale must be a positive number"),
    (dict(k_scale={1: 2}), TypeError, "k_scale must be a positive number"),
    (dict(saturate="yes"), TypeError, "saturate must be True or False"),
    (dict(dtype=np.int8), TypeError, "dtype must be a floating dtype"),
])
def test_the_fp8_cache_checks_its_scales(kwargs, error, words):
    with pytest.raises(error, match=words):
        LowPrecisionKVCache(**{**dict(Hkv=3, d=4, capacity=10, store=e4m3), **kwargs})


def test_scale_for_maps_the_largest_number_onto_the_format():
    x = np.zeros((3, 5, 4))
    x[0, 2, 1], x[1, 0, 0] = -896.0, 44.8  # head 2 holds only zeros
    assert scale_for(x, e4m3) == 2.0
    np.testing.assert_array_equal(scale_for(x, e4m3, per="head"), np.array([2.0, 0.1, 1.0], np.float32))
    assert scale_for(x, e5m2) == pytest.approx(896 / 57344)
    for bad, words in [((x, e4m3, "row"), "per must be 'tensor' or 'head'"),
                       ((x[0], e4m3), r"must be a finite, non-empty \[Hkv, S, d\] array"),
                       ((np.full((1, 1, 1), np.inf), e4m3), "finite")]:
        with pytest.raises(ValueError, match=words):
            scale_for(*bad)


ONES = np.ones(4)

JUNK_CASES = [  # (what, call, error, words): before, each raised numpy's words (or a DeprecationWarning), or passed
    ("formats(None)", lambda: formats(None), TypeError, "dtypes must be a list of floating dtypes"),
    ("formats(np.float32)", lambda: formats(np.float32), TypeError, "dtypes must be a list of floating dtypes"),
    ("formats('float32')", lambda: formats("float32"), TypeError, "dtypes must be a list of floating dtypes"),
    ("formats([None])", lambda: formats([None]), TypeError, r"dtypes\[0\] must be a floating dtype .*got None"),
    ("formats([np.float32, 'abc'])", lambda: formats([np.float32, "abc"]), TypeError,
     r"dtypes\[1\] must be a floating dtype .*got dtypes\[1\]='abc'"),
    ("formats([np.int64])", lambda: formats([np.int64]), TypeError, r"dtypes\[0\] must be a floating dtype"),
    ("running_sum(x='abc')", lambda: running_sum("abc", np.float32), TypeError,
     "x must hold real numbers; got dtype <U3"),
    ("pairwise_sum(x=ragged)", lambda: pairwise_sum([[1.0, 2.0], [3.0]], np.float32), ValueError,
     "x is not a rectangular array of numbers"),
    ("kahan_sum(x={})", lambda: kahan_sum({}, np.float32), TypeError, "x must hold real numbers; got dtype object"),
    ("running_sum(x=2.0)", lambda: running_sum(2.0, np.float32), ValueError, "x must have at least one axis"),
    ("running_sum(axis=None)", lambda: running_sum(ONES, np.float32, axis=None), TypeError,
     "axis must be an integer; got axis=None"),
    ("pairwise_sum(axis=an array)", lambda: pairwise_sum(ONES, np.float32, axis=np.ones((2, 2))), TypeError,
     "axis must be an integer"),
    ("kahan_sum(axis=2.5)", lambda: kahan_sum(ONES, np.float32, axis=2.5), TypeError,
     "axis must be an integer; got axis=2.5"),
    ("running_sum(axis=2) of 2 axes", lambda: running_sum(np.ones((2, 3)), np.float32, axis=2), ValueError,
     r"axis=2 is out of range for x of 2 axes"),
    ("running_sum(axis=-3) of 2 axes", lambda: running_sum(np.ones((2, 3)), np.float32, axis=-3), ValueError,
     "axis must be at least -2"),
    ("running_sum(dtype=None)", lambda: running_sum(ONES, None), TypeError,
     "dtype must be a floating dtype .*got None"),
    ("LowPrecisionKVCache(store=None)", lambda: LowPrecisionKVCache(1, 4, 8, store=None), TypeError,
     "store must be a floating dtype .*got None"),
    ("scale_for(per=an array)", lambda: scale_for(np.ones((1, 2, 2)), e4m3, per=np.array([1, 2])), ValueError,
     "per must be 'tensor' or 'head'"),
    ("scale_for(per=None)", lambda: scale_for(np.ones((1, 2, 2)), e4m3, per=None), ValueError,
     "per must be 'tensor' or 'head'"),
]


@pytest.mark.parametrize("what, call, error, words", JUNK_CASES, ids=[case[0] for case in JUNK_CASES])
def test_every_public_function_names_junk(what, call, error, words):
    """Issue 33, item 8: junk fed to each public function of kvlesson.shrink.precision gets an error naming the
    argument, not numpy's own words ('truth value of an array is ambiguous', 'Cannot interpret 3 as a data type',
    'setting an array element with a sequence') or a DeprecationWarning."""
    with pytest.raises(error, match=words):
        call()
