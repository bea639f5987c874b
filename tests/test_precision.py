"""kvlesson.shrink.precision: the formats, bfloat16 rounding by hand, narrow running sums, and the 16-bit KV cache."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import StaticKVCache, attention, step
from kvlesson.shrink.precision import LowPrecisionKVCache, attention_in, bfloat16, formats, round_bf16, running_sum
from tests.test_core_properties import layers, reference, run_chunks

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


@pytest.mark.parametrize("dtype", [int, np.complex64, "not a dtype", ml_dtypes.int4])
def test_running_sum_refuses_what_is_not_a_floating_format(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        running_sum(np.ones(3), dtype)


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
