"""The price of the cache: the card's figures exactly, the window convention, the decode floor, bad input."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import KVCache, StaticKVCache, WindowKVCache
from kvlesson.configs import ACCELERATORS, CHECKPOINT_BYTES, MODELS, Accelerator, Config
from kvlesson.costs.memory import (
    BF16,
    decode_floor,
    element_bytes,
    experts_read,
    iec,
    kv_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    matmul_intensity,
    si,
    step_weight_bytes,
    weight_bytes,
)

LLAMA = MODELS["Llama 3.1 8B"]
H100 = ACCELERATORS["H100 SXM"]


# ------------------------------------------------------------------------------------------ the card

def test_card_bytes_per_token_is_128_kib():
    assert kv_bytes_per_token(LLAMA, ml_dtypes.bfloat16) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert iec(kv_bytes_per_token(LLAMA)) == "128 KiB"


def test_card_one_sequence_at_8192_tokens_is_1_gib():
    assert kv_bytes_per_sequence(LLAMA, 8192) == 2 ** 30
    assert iec(kv_bytes(LLAMA, 8192)) == "1 GiB"


def test_card_decode_floor_on_h100_is_4_95_ms():
    w, kv = weight_bytes(LLAMA), kv_bytes(LLAMA, 4096)
    assert w == 8_030_261_248 * 2 == 16_060_522_496
    assert kv == 131_072 * 4096 == 536_870_912
    assert (si(w), si(kv, "GB"), si(H100.bandwidth, "TB")) == ("16.06 GB", "0.54 GB", "3.35 TB")
    floor = decode_floor(LLAMA, H100, 4096)
    assert floor == (w + kv) / 3.35e12
    assert f"{floor * 1e3:.2f} ms" == "4.95 ms"


def test_card_rounding_the_printed_terms_would_give_4_96():
    """The card's 4.95 ms comes from unrounded bytes: the GB figures it prints, added, would give 4.96 ms."""
    w, kv = weight_bytes(LLAMA), kv_bytes(LLAMA, 4096)
    rounded = float(si(w).split()[0]) * 1e9 + float(si(kv, "GB").split()[0]) * 1e9  # 16.06 GB + 0.54 GB
    assert f"{rounded / H100.bandwidth * 1e3:.2f}" == "4.96"
    assert f"{decode_floor(LLAMA, H100, 4096) * 1e3:.2f}" == "4.95"


def test_parameter_counts_agree_with_the_published_figures():
    published = {"Llama 3.1 8B": 8.03e9, "Llama 3.1 70B": 70.6e9, "Llama 3.1 405B": 406e9, "Llama 2 7B": 6.74e9,
                 "Mistral 7B v0.1": 7.24e9, "Qwen2.5-7B": 7.61e9, "Qwen3-32B": 32.8e9, "SmolLM2-135M": 135e6}
    for name, figure in published.items():
        assert abs(MODELS[name].params - figure) <= 0.01 * figure, name
    assert MODELS["SmolLM2-135M"].params == 134_515_008  # summed by hand from config.json shapes


# -------------------------------------------------------------------------------------- the tables

def test_a_head_dim_set_on_its_own_is_the_one_priced():
    """Qwen3-32B: hidden 5120 over 64 heads would be 80, but config.json sets head_dim 128 (lesson 05's table)."""
    q = MODELS["Qwen3-32B"]
    assert (q.D, q.H, q.Hkv, q.d) == (5120, 64, 8, 128) and q.D // q.H == 80
    assert kv_bytes_per_token(q) == 2 * 64 * 8 * 128 * 2 == 256 * 1024
    assert q.params - q.vocab * q.D * 2 == 31_206_282_240  # the model card's 31.2B without embeddings


def test_gpt_oss_checkpoint_does_not_fit_beside_8_full_fp8_caches():
    """Lesson 05: the published 60.8 GiB checkpoint, not 116.8B x 4 bits, decides whether batch 8 fits."""
    g = MODELS["gpt-oss-120b"]
    ckpt, source = CHECKPOINT_BYTES["gpt-oss-120b"]
    assert ckpt == 60.8 * 2 ** 30 and "2508.10925" in source
    kv = kv_bytes(g, 131072, 8, ml_dtypes.float8_e4m3fn)
    assert weight_bytes(g, ml_dtypes.int4) + kv <= H100.memory < ckpt + kv  # the estimate fits; the file does not
    assert (H100.memory - ckpt) // kv_bytes(g, 131072, 1, ml_dtypes.float8_e4m3fn) == 6


def test_lesson_07_fields_of_gpt_oss():
    g = MODELS["gpt-oss-120b"]
    assert (g.n_layers, g.H, g.Hkv, g.d, g.window, g.window_layers) == (36, 64, 8, 64, 128, 18)


def test_every_entry_is_consistent_and_sourced():
    for key, m in MODELS.items():
        assert m.name == key and m.source and m.H % m.Hkv == 0 and 0 <= m.window_layers <= m.n_layers
        assert kv_bytes_per_token(m) > 0
    for key, a in ACCELERATORS.items():
        assert a.name == key and a.source and a.memory > 0 and a.bandwidth > 0
    assert (H100.memory, H100.bandwidth) == (80e9, 3.35e12)
    assert ACCELERATORS["RTX 4090"].bandwidth == 1008e9


# ------------------------------------------------------------------------------------ the formulas

def test_gqa_saves_exactly_h_over_hkv():
    mha = dataclasses.replace(LLAMA, Hkv=LLAMA.H)
    assert kv_bytes_per_token(mha) == 4 * kv_bytes_per_token(LLAMA) == 512 * 1024
    assert kv_bytes_per_token(MODELS["Llama 2 7B"]) == kv_bytes_per_token(mha)  # Llama 2 7B was plain MHA


def test_cache_dtypes_scale_the_bytes():
    base = kv_bytes_per_token(LLAMA, BF16)
    types = (np.float32, ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, np.int8, ml_dtypes.int4)
    got = [kv_bytes_per_token(LLAMA, t) for t in types]
    assert got == [2 * base, base, base, base // 2, base // 2, base // 4]  # int4 is counted packed, two per byte
    assert all(type(v) is int for v in got)
    assert kv_bytes_per_token(LLAMA, "bfloat16") == base  # a dtype's name works, as np.dtype reads it


def test_window_layers_stop_growing_at_the_window():
    g = MODELS["gpt-oss-120b"]
    per_layer_token = 2 * 8 * 64 * 2
    assert kv_bytes_per_sequence(g, 100) == 36 * 100 * per_layer_token  # inside the window: every layer grows
    assert kv_bytes_per_sequence(g, 128) == kv_bytes_per_token(g) * 128
    assert kv_bytes_per_sequence(g, 1000) == (18 * 1000 + 18 * 128) * per_layer_token
    mistral = MODELS["Mistral 7B v0.1"]
    assert kv_bytes_per_sequence(mistral, 32768) == kv_bytes_per_sequence(mistral, 4096) == 512 * 2 ** 20


@given(st.integers(0, 300_000), st.sampled_from(sorted(MODELS)))
def test_sequence_bytes_grow_no_faster_than_per_token(context, name):
    m = MODELS[name]
    here, more = kv_bytes_per_sequence(m, context), kv_bytes_per_sequence(m, context + 1)
    assert here <= more <= here + kv_bytes_per_token(m)
    assert here <= kv_bytes_per_token(m) * context
    if not m.window_layers or context <= m.window:
        assert here == kv_bytes_per_token(m) * context


def test_batch_multiplies_the_cache_not_the_weights():
    assert kv_bytes(LLAMA, 4096, batch=8) == 8 * kv_bytes(LLAMA, 4096)
    one, eight = decode_floor(LLAMA, H100, 4096, 1), decode_floor(LLAMA, H100, 4096, 8)
    assert eight * H100.bandwidth == pytest.approx(weight_bytes(LLAMA) + 8 * kv_bytes(LLAMA, 4096))
    assert eight < 8 * one


def test_a_mixture_of_experts_reads_its_active_weights_at_batch_1():
    g = MODELS["gpt-oss-120b"]
    assert weight_bytes(g) == 233_600_000_000 and weight_bytes(g, active=True) == 10_200_000_000
    assert weight_bytes(LLAMA, active=True) == weight_bytes(LLAMA)  # dense: all weights are active
    assert step_weight_bytes(g, 1) == weight_bytes(g, active=True) and experts_read(g, 1) == 4
    assert decode_floor(g, H100, 0) == 10.2e9 / 3.35e12


def test_a_batch_reads_the_union_of_its_tokens_experts():
    """Issue 18: at batch 16 and 8,192 tokens gpt-oss-120b needs about 29.6 ms on an H100, not the 4.51 ms of
    "active parameters once per step, whatever the batch"."""
    g = MODELS["gpt-oss-120b"]
    E, k = 128, 4  # num_local_experts, num_experts_per_tok in its config.json
    for B in (1, 2, 16, 100, 1000):
        assert experts_read(g, B) == pytest.approx(E * (1 - (1 - k / E) ** B), rel=1e-12)
    assert experts_read(g, 16) == pytest.approx(50.98, abs=0.01)  # of 128 per layer; 16 x 4 = 64 if none were shared
    per_expert = g.expert_params / E  # one expert, every layer
    assert step_weight_bytes(g, 16) == pytest.approx(2 * (5.1e9 + (experts_read(g, 16) - k) * per_expert), abs=1)
    ms = decode_floor(g, H100, 8192, 16) * 1e3
    assert f"{ms:.1f}" == "29.6"
    only_active = (weight_bytes(g, active=True) + kv_bytes(g, 8192, 16)) / H100.bandwidth * 1e3
    assert f"{only_active:.2f}" == "4.51"  # the old model, for the record


def test_experts_read_grows_to_every_expert_and_matches_a_simulation():
    """The formula against routing done by hand: each token picks k distinct experts of E, uniformly."""
    g = MODELS["gpt-oss-120b"]
    reads = [experts_read(g, B) for B in range(1, 400)]
    assert (np.diff(reads) > 0).all() and 127.9 < reads[-1] <= 128
    rng = np.random.default_rng(18)
    for B in (2, 16, 64):
        union = [len({int(e) for _ in range(B) for e in rng.choice(128, 4, replace=False)}) for _ in range(400)]
        assert abs(np.mean(union) - experts_read(g, B)) < 4 * np.std(union) / np.sqrt(len(union)) + 1e-9


def test_dense_models_read_every_weight_at_any_batch():
    for B in (1, 7, 64):
        assert step_weight_bytes(LLAMA, B) == weight_bytes(LLAMA) and experts_read(LLAMA, B) == 0


def test_the_gpt_oss_parameter_split_adds_up():
    """Counted experts (114.70e9) against the model card's 116.8B total and 5.1B active: what every token reads
    plus the token table it reads one row of is what lies outside the experts, to 1%."""
    g = MODELS["gpt-oss-120b"]
    assert g.expert_params == 114_701_598_720
    shared = g.active_params - g.expert_params * 4 / 128
    assert shared + 201088 * 2880 == pytest.approx(g.params - g.expert_params, rel=0.01)


@pytest.mark.parametrize("change, words", [
    (dict(experts=None), ["experts=None", "experts_per_token=4"]),
    (dict(experts_per_token=200), ["experts_per_token=200"]),
    (dict(experts_per_token=0), ["experts_per_token=0"]),
    (dict(expert_params=-1.0), ["expert_params=-1.0"]),
    (dict(expert_params=200e9), ["expert_params=2"]),
    (dict(active_params=1e9), ["active_params=1000000000.0"]),
])
def test_a_broken_mixture_of_experts_is_refused_by_name(change, words):
    with pytest.raises(ValueError) as err:
        decode_floor(dataclasses.replace(MODELS["gpt-oss-120b"], **change), H100, 10, 2)
    for w in words:
        assert w in str(err.value)


def test_matvec_is_about_one_flop_per_byte_in_bf16():
    n_out, n_in = 14336, 4096
    assert matmul_intensity(n_out, n_in) == 2 * n_out * n_in / (2 * (n_out * n_in + n_in + n_out))
    assert 0.99 < matmul_intensity(n_out, n_in) < 1
    assert 0.95 * 64 < matmul_intensity(n_out, n_in, batch=64) < 64  # activations start to count
    assert matmul_intensity(n_out, n_in, dtype=np.float32) == pytest.approx(matmul_intensity(n_out, n_in) / 2)


def test_the_formula_matches_kvlesson_caches():
    """nbytes of real caches, one layer, 2-byte elements: the formula's per-layer share, token for token."""
    Hkv, d, T, W = 8, 128, 10, 4
    one_layer = kv_bytes_per_token(Config(name="one layer", n_layers=1, H=32, Hkv=Hkv, d=d, total_params=1.0),
                                   np.float16)
    k = np.zeros((Hkv, T, d), np.float16)
    grow = KVCache(Hkv, d, np.float16)
    grow.append(k, k)
    fixed = StaticKVCache(Hkv, d, T, np.float16)
    window = WindowKVCache(Hkv, d, W, np.float16)
    window.append(k, k)
    assert grow.nbytes == fixed.nbytes == one_layer * T == 2 * Hkv * d * 2 * T
    assert window.nbytes == one_layer * (W - 1)  # at rest it keeps W - 1: one less than the priced W


def test_formats():
    assert [iec(n) for n in (0, 1023, 1536, 2 ** 20, 5 * 2 ** 30 + 2 ** 29)] == ["0 B", "1,023 B", "1.5 KiB",
                                                                                    "1 MiB", "5.5 GiB"]
    assert [si(n) for n in (999, 80e9, 233.6e9, 1.008e12)] == ["999 B", "80 GB", "233.6 GB", "1.01 TB"]
    assert si(5.36870912e8, "GB") == "0.54 GB" and si(3.35e12, "TB", digits=3) == "3.35 TB"


# ---------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, words", [
    (lambda: kv_bytes_per_sequence(LLAMA, -1), ["context", "-1"]),
    (lambda: kv_bytes_per_sequence(LLAMA, 2.5), ["context", "2.5"]),
    (lambda: kv_bytes(LLAMA, 10, batch=0), ["batch", "0"]),
    (lambda: kv_bytes(LLAMA, 10, batch=True), ["batch", "True"]),
    (lambda: kv_bytes_per_token(dataclasses.replace(LLAMA, Hkv=5)), ["H=32", "Hkv=5"]),
    (lambda: kv_bytes_per_token(dataclasses.replace(LLAMA, Hkv=0)), ["Hkv", "0"]),
    (lambda: kv_bytes_per_token(dataclasses.replace(LLAMA, window_layers=40)), ["window_layers=40", "n_layers=32"]),
    (lambda: kv_bytes_per_sequence(dataclasses.replace(LLAMA, window_layers=4), 9), ["window=None", "4"]),
    (lambda: weight_bytes(dataclasses.replace(LLAMA, total_params=-1)), ["params=-1"]),
    (lambda: weight_bytes(Config(name="no shape", n_layers=2, H=4, Hkv=2, d=8)), ["no shape", "total_params"]),
    (lambda: decode_floor(LLAMA, Accelerator(name="broken", memory=1e9, bandwidth=0), 10),
     ["broken", "bandwidth", "0"]),
    (lambda: matmul_intensity(0, 4096), ["n_out", "0"]),
    (lambda: si(-5), ["-5"]),
    (lambda: si(5, "GiB"), ["GiB"]),
])
def test_bad_input_raises_a_value_error_naming_the_values(call, words):
    with pytest.raises(ValueError) as err:
        call()
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("dtype, error", [("bf17", TypeError), (None, None), (0, TypeError), ("U3", TypeError),
                                          (object, TypeError)])
def test_a_dtype_must_be_a_number_type(dtype, error):
    if error is None:  # np.dtype(None) is float64, as numpy reads it
        assert element_bytes(dtype) == 8
        return
    with pytest.raises(error, match="dtype"):
        kv_bytes_per_token(LLAMA, dtype)


def test_the_tiny_model_config_is_priced_like_any_other():
    from kvlesson.model import tiny_config
    c = tiny_config()
    assert kv_bytes_per_token(c, np.float32) == 2 * c.n_layers * c.Hkv * c.d * 4
    assert weight_bytes(c, np.float32) == 4 * c.params


def test_pricing_needs_a_config():
    with pytest.raises(TypeError, match="need a kvlesson.configs.Config"):
        kv_bytes_per_token({"n_layers": 32})
