"""rope.inv_freq with a config.json rope_scaling dict: "linear", "llama3", "yarn", "dynamic" and NTK-aware "ntk".

Always run: the llama3 rule against the published formula written out as a loop (Meta's reference code for
Llama 3.1, `apply_scaling` in github.com/meta-llama/llama-models), YaRN against values recorded from
transformers 5.24.0, NTK-aware and dynamic NTK against their formula (bloc97's and emozilla's, as transformers
credits them). Run where transformers is installed (the reference venv): every rule transformers has against its
own rope initialisation, the attention factor included, and NTK-aware against transformers' dynamic rule at the
length where the two coincide (transformers has no static NTK-aware type). transformers builds its ladders in
float32, so the two agree to float32 rounding (we measure 3.2e-7 relative), not to float64's; 1e-6 is the bound.
"""
import math

import numpy as np
import pytest

from kvlesson.rope import attention_factor, inv_freq

LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
           "rope_type": "llama3"}  # config.json of huggingface.co/meta-llama/Llama-3.1-8B, rope_theta 500000
GPT_OSS = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
           "rope_type": "yarn", "truncate": False}  # config.json of huggingface.co/openai/gpt-oss-120b, theta 150000


def published_llama3(d, base, factor, low_freq_factor, high_freq_factor, original):
    """Llama 3.1's rule, one frequency at a time, as Meta's reference code states it."""
    out = []
    for m in range(d // 2):
        freq = base ** (-2 * m / d)
        wavelength = 2 * math.pi / freq
        if wavelength < original / high_freq_factor:
            out.append(freq)
        elif wavelength > original / low_freq_factor:
            out.append(freq / factor)
        else:
            smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


@pytest.mark.parametrize("d, base, scaling", [
    (128, 500000.0, LLAMA31),
    (64, 100000.0, LLAMA31),
    (64, 10000.0, {**LLAMA31, "factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                   "original_max_position_embeddings": 2048}),
])
def test_llama3_equals_the_published_formula(d, base, scaling):
    want = published_llama3(d, base, scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                            scaling["original_max_position_embeddings"])
    np.testing.assert_allclose(inv_freq(d, base, scaling), want, rtol=1e-14, atol=0)


def test_llama3_keeps_short_wavelengths_and_divides_long_ones():
    plain, scaled = inv_freq(128, 500000.0), inv_freq(128, 500000.0, LLAMA31)
    wavelength = 2 * np.pi / plain
    short, long_ = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert short.sum() and long_.sum() and (~short & ~long_).sum()  # all three regions exist for Llama 3.1
    np.testing.assert_array_equal(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long_], plain[long_] / 8, rtol=1e-15)
    middle = ~short & ~long_
    assert ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()


# inv_freq of gpt-oss-120b's rope (d = 64, rope_theta 150000, GPT_OSS) at pairs 0, 8, 12, 16, 20, 24, 31, as
# transformers 5.24.0's _compute_yarn_parameters returned them (float32, printed to 9 digits).
GPT_OSS_RECORDED = [1.00000000e+00, 5.08132726e-02, 6.79495931e-03, 4.56483918e-04, 1.81883370e-05, 4.09997847e-06,
                    3.02351140e-07]


def test_yarn_equals_values_recorded_from_transformers():
    got = inv_freq(64, 150000.0, GPT_OSS)[[0, 8, 12, 16, 20, 24, 31]]
    np.testing.assert_allclose(got, GPT_OSS_RECORDED, rtol=1e-6)


def test_yarn_keeps_fast_pairs_and_divides_slow_ones():
    plain, scaled = inv_freq(64, 150000.0), inv_freq(64, 150000.0, GPT_OSS)
    turns = 4096 * plain / (2 * np.pi)  # full turns each pair makes over the original context
    np.testing.assert_array_equal(scaled[turns > 32], plain[turns > 32])
    np.testing.assert_allclose(scaled[turns < 1], plain[turns < 1] / 32, rtol=1e-15)
    assert (np.diff(scaled / plain) <= 0).all()  # the ramp only ever moves towards interpolation


def test_linear_divides_every_frequency_and_none_changes_nothing():
    plain = inv_freq(64, 10000.0)
    np.testing.assert_array_equal(plain, 10000.0 ** (-np.arange(0, 64, 2) / 64))
    np.testing.assert_array_equal(inv_freq(64, 10000.0, None), plain)
    np.testing.assert_allclose(inv_freq(64, 10000.0, {"type": "linear", "factor": 4.0}), plain / 4, rtol=1e-15)
    assert inv_freq(64, 10000.0, LLAMA31).dtype == np.float64


@pytest.mark.parametrize("scaling, error, words", [
    ([("factor", 8.0)], TypeError, "rope_scaling dict"),
    ({"rope_type": "longrope", "factor": 2.0}, ValueError, "rope_type='longrope'"),
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "needs 'original_max_position_embeddings'"),
    ({**GPT_OSS, "beta_fast": 0.5}, ValueError, "beta_fast >= beta_slow"),
    ({"factor": 2.0}, ValueError, "rope_type=None"),
    ({**LLAMA31, "low_freq_factor": -1.0}, ValueError, "low_freq_factor"),
    ({k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"}, ValueError,
     "needs 'original_max_position_embeddings'"),
    ({**LLAMA31, "high_freq_factor": 1.0}, ValueError, "high_freq_factor > low_freq_factor"),
    ({**GPT_OSS, "factor": "32"}, TypeError, "factor"),
])
def test_bad_scaling_is_named(scaling, error, words):
    with pytest.raises(error, match=words):
        inv_freq(64, 10000.0, scaling)


def test_yarn_with_beta_fast_below_beta_slow_is_refused_rather_than_inverted():
    """Issue 19: swapped betas ran the ramp backwards, dividing the fast pairs and keeping the slow ones."""
    with pytest.raises(ValueError, match="beta_fast=1.0, beta_slow=32.0"):
        inv_freq(64, 150000.0, {**GPT_OSS, "beta_fast": 1.0, "beta_slow": 32.0})
    equal = inv_freq(64, 150000.0, {**GPT_OSS, "beta_fast": 8.0, "beta_slow": 8.0})  # a step, but the right way
    assert (np.diff(equal / inv_freq(64, 150000.0)) <= 0).all()


def test_ntk_aware_is_one_larger_base():
    plain = inv_freq(64, 100000.0)
    ntk = inv_freq(64, 100000.0, {"rope_type": "ntk", "factor": 8.0})
    np.testing.assert_allclose(ntk, (100000.0 * 8.0 ** (64 / 62)) ** (-np.arange(0, 64, 2) / 64), rtol=1e-14)
    assert ntk[0] == plain[0]  # the fastest pair keeps its frequency
    np.testing.assert_allclose(ntk[-1], plain[-1] / 8.0, rtol=1e-14)  # the slowest turns 8 times slower
    assert (np.diff(plain / ntk) > 0).all()  # and the stretch grows smoothly from one to the other


def test_dynamic_ntk_is_the_trained_ladder_within_the_context_and_ntk_aware_past_it():
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8192}
    plain = inv_freq(64, 100000.0)
    for length in (None, 1, 128, 8192):
        np.testing.assert_array_equal(inv_freq(64, 100000.0, dynamic, length=length), plain)
    # at 3x the context the base grows by (2 * 3 - 1)**(d / (d - 2)): NTK-aware with a factor of 5
    np.testing.assert_allclose(inv_freq(64, 100000.0, dynamic, length=3 * 8192),
                               inv_freq(64, 100000.0, {"rope_type": "ntk", "factor": 5.0}), rtol=1e-14)
    with pytest.raises(ValueError, match="length must be at least 1"):
        inv_freq(64, 100000.0, dynamic, length=0)


def test_attention_factor_is_yarns_alone():
    assert attention_factor(None) == attention_factor(LLAMA31) == attention_factor({"type": "linear", "factor": 4.0}
                                                                                   ) == 1.0
    assert attention_factor(GPT_OSS) == pytest.approx(0.1 * math.log(32) + 1)  # 1.347: every logit x 1.813
    assert attention_factor({**GPT_OSS, "attention_factor": 1.25}) == 1.25
    deepseek = {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096}  # DeepSeek-V3's config: the two cancel
    assert attention_factor(deepseek) == 1.0
    assert attention_factor({**GPT_OSS, "factor": 1.0}) == 1.0


def transformers_rope(rope_type, d, base, scaling, seq_len=None):
    """-> (inv_freq float64 [d/2], attention factor) from transformers' own rope initialisation."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed; install requirements-reference.txt (CONTRIBUTING.md) "
                               "to compare the ladders with its rope initialisation")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(scaling)
    # transformers' dynamic rule reads the trained length from max_position_embeddings, the others from the dict
    max_len = scaling.pop("original_max_position_embeddings") if rope_type == "dynamic" else 1 << 20
    config = transformers.LlamaConfig(hidden_size=4 * d, num_attention_heads=4, head_dim=d, rope_theta=base,
                                      max_position_embeddings=max_len, rope_scaling={**scaling, "rope_type": rope_type})
    want, factor = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    return want.double().numpy(), factor


@pytest.mark.parametrize("d, base, scaling", [
    (128, 500000.0, LLAMA31),
    (64, 100000.0, LLAMA31),
    (64, 150000.0, GPT_OSS),
    (64, 150000.0, {**GPT_OSS, "truncate": True}),
    (128, 10000.0, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}),
    (64, 100000.0, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}),
    (64, 10000.0, {"rope_type": "linear", "factor": 4.0}),
])
def test_equals_transformers_rope_initialisation(d, base, scaling):
    want, factor = transformers_rope(scaling["rope_type"], d, base, scaling)
    np.testing.assert_allclose(inv_freq(d, base, scaling), want, rtol=1e-6)
    assert attention_factor(scaling) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("length", [100, 8192, 8193, 20000, 65536])
def test_dynamic_equals_transformers_at_every_length(length):
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8192}
    want, factor = transformers_rope("dynamic", 64, 100000.0, dynamic, seq_len=length)
    np.testing.assert_allclose(inv_freq(64, 100000.0, dynamic, length=length), want, rtol=1e-6)
    assert attention_factor(dynamic) == factor == 1.0


@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
def test_ntk_aware_equals_transformers_dynamic_where_they_coincide(factor):
    """Dynamic NTK with factor 1 at length factor x the context grows the base by factor**(d / (d - 2)): NTK-aware."""
    want, _ = transformers_rope("dynamic", 64, 100000.0, {"factor": 1.0, "original_max_position_embeddings": 4096},
                                seq_len=int(factor * 4096))
    np.testing.assert_allclose(inv_freq(64, 100000.0, {"rope_type": "ntk", "factor": factor}), want, rtol=1e-6)
