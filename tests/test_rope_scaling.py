"""rope.inv_freq with a config.json rope_scaling dict: Llama 3.1's "llama3" rule, YaRN, and linear interpolation.

Always run: the llama3 rule against the published formula written out as a loop (Meta's reference code for
Llama 3.1, `apply_scaling` in github.com/meta-llama/llama-models), YaRN against values recorded from
transformers 5.24.0. Run where transformers is installed (the reference venv): both against transformers'
own rope initialisation. transformers builds its ladders in float32, so the two agree to float32 rounding
(we measure 3.2e-7 relative), not to float64's; 1e-6 is the bound.
"""
import math

import numpy as np
import pytest

from kvlesson.rope import inv_freq

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
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "rope_type='dynamic'"),
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


@pytest.mark.parametrize("d, base, scaling", [
    (128, 500000.0, LLAMA31),
    (64, 100000.0, LLAMA31),
    (64, 150000.0, GPT_OSS),
    (64, 150000.0, {**GPT_OSS, "truncate": True}),
    (128, 10000.0, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}),
    (64, 10000.0, {"rope_type": "linear", "factor": 4.0}),
])
def test_equals_transformers_rope_initialisation(d, base, scaling):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed; install requirements-reference.txt (CONTRIBUTING.md) "
                               "to compare the ladders with its rope initialisation")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=4 * d, num_attention_heads=4, head_dim=d, rope_theta=base,
                                      max_position_embeddings=1 << 20, rope_scaling=dict(scaling))
    want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, None)
    np.testing.assert_allclose(inv_freq(d, base, scaling), want.double().numpy(), rtol=1e-6)
