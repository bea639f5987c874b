"""The lesson 11 checkers pass kvlesson's own answers and name each typical mistake."""
import numpy as np
import pytest

from kvlesson.shrink.mla import bytes_per_token
from kvlesson.shrink.quant import dequantize, quantize
from kvlesson.shrink.sinks import sink_mask
from kvlesson.teaching.checks import check_channel_quant, check_mla_bytes, check_sink_mask


def quant_with(axis=0, symmetric=False, levels=None, rounding=np.rint, guard=True, dtype=None, bits_override=None,
               in_place=False, codes_only=False):
    """A per-channel round trip with one knob per classic mistake."""
    def fn(x, bits):
        b = bits if bits_override is None else bits_override
        top = 2**b - 1 if levels is None else levels(b)
        if symmetric:
            m = np.abs(x).max(axis=axis, keepdims=True)
            scale = m / (2 ** (b - 1) - 1)
            return np.rint(x / scale) * scale
        lo = x.min(axis=axis, keepdims=True)
        span = x.max(axis=axis, keepdims=True) - lo
        scale = np.where(span > 0, span / top, 1).astype(x.dtype) if guard else span / top
        codes = np.clip(rounding((x - lo) / scale), 0, 2**b - 1)
        if codes_only:
            return codes.astype(x.dtype)
        out = lo + codes * scale
        if in_place:
            x[...] = out
            return x
        return out.astype(dtype) if dtype is not None else out
    return fn


def test_channel_quant_checker_passes_the_package_and_a_hand_written_answer():
    assert check_channel_quant(lambda x, bits: dequantize(*quantize(x, bits, axis=0)))
    assert check_channel_quant(quant_with())


@pytest.mark.parametrize("wrong, hint", [
    (quant_with(axis=1), "scales are per token"),
    (quant_with(symmetric=True), "symmetric quantization"),
    (quant_with(levels=lambda b: 2**b), "(max - min) / 2**bits"),
    (quant_with(rounding=np.floor), "rounded down"),
    (quant_with(codes_only=True), "integer codes"),
    (quant_with(bits_override=8), "matches 8 bits"),
    (quant_with(bits_override=4), "matches 4 bits"),
    (quant_with(guard=False), "0 / 0 is nan"),
    (quant_with(dtype=np.float64), "expected float32"),
    (quant_with(in_place=True), "changed x in place"),
    (lambda x, bits: x.T, "has shape"),
    (lambda x, bits: None, "returned None"),
    (lambda x, bits: x + 0.5, "differ from the reference"),
])
def test_channel_quant_checker_names_the_mistake(wrong, hint):
    verdict = check_channel_quant(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def mla_with(rope=True, kv=1, per_head=False, rope_per_head=False, layers=True, fixed_bytes=None, bits=1):
    def fn(config, b):
        b = b if fixed_bytes is None else fixed_bytes
        H = config["num_attention_heads"]
        per_layer = config["kv_lora_rank"] + (config["qk_rope_head_dim"] * (H if rope_per_head else 1) if rope else 0)
        n = (config["num_hidden_layers"] if layers else 1) * per_layer * kv * (H if per_head else 1)
        return n * b * bits
    return fn


def test_mla_bytes_checker_passes_the_package_and_a_hand_written_answer():
    assert check_mla_bytes(bytes_per_token)
    assert check_mla_bytes(mla_with())


@pytest.mark.parametrize("wrong, hint", [
    (mla_with(rope=False), "only the latent"),
    (mla_with(kv=2), "twice the cache"),
    (mla_with(per_head=True), "once per head"),
    (mla_with(rope_per_head=True), "one RoPE key per head"),
    (mla_with(layers=False), "one layer"),
    (lambda c, b: c["num_hidden_layers"] * c["num_attention_heads"] * (
        c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * b, "plain multi-head attention"),
    (mla_with(fixed_bytes=2), "whatever bytes_per_element is"),
    (mla_with(bits=8), "in bits"),
    (lambda c, b: bytes_per_token(c, b) / 1024, "whole number"),
    (lambda c, b: str(bytes_per_token(c, b)), "expected a number"),
    (lambda c, b: bytes_per_token(c, b) + 1, "expected 70,272"),
])
def test_mla_bytes_checker_names_the_mistake(wrong, hint):
    verdict = check_mla_bytes(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def positions(T, S):
    return np.arange(S - T, S)[:, None], np.arange(S)[None, :]  # [T, 1] query positions, [1, S] key positions


def right(T, S, sinks, W):
    p, j = positions(T, S)
    return (j <= p) & ((j < sinks) | (j > p - W))


def test_sink_mask_checker_passes_the_package_and_a_hand_written_answer():
    assert check_sink_mask(lambda T, S, s, W: sink_mask(np.arange(S), np.arange(S - T, S), s, W))
    assert check_sink_mask(right)


@pytest.mark.parametrize("wrong, hint", [
    (lambda T, S, s, W: (positions(T, S)[1] < s) | ((positions(T, S)[1] <= positions(T, S)[0])
                                                    & (positions(T, S)[1] > positions(T, S)[0] - W)),
     "sink that comes after it"),
    (lambda T, S, s, W: right(T, S, s, W + 1), "window + 1 recent keys"),
    (lambda T, S, s, W: (positions(T, S)[1] <= positions(T, S)[0]) & (
        (positions(T, S)[1] < s) | (positions(T, S)[1] > np.arange(T)[:, None] - W)), "misses the offset"),
    (lambda T, S, s, W: right(T, S, 0, W), "plain window"),
    (lambda T, S, s, W: right(T, S, 0, S + 1), "plain causal"),
    (lambda T, S, s, W: right(T, S, s + 1, W), "sinks + 1 first positions"),
    (lambda T, S, s, W: right(T, S, s, W).astype(int), "expected bool"),
    (lambda T, S, s, W: right(S, S, s, W), "has shape"),
    (lambda T, S, s, W: right(T, S, s, W) & (positions(T, S)[1] != 1), "it should see"),
])
def test_sink_mask_checker_names_the_mistake(wrong, hint):
    verdict = check_sink_mask(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_unfilled_exercises_get_the_stub_verdict():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (check_channel_quant, check_mla_bytes, check_sink_mask):
        verdict = check(todo)
        assert not verdict and verdict.stub
