"""The lesson 11 checkers pass kvlesson's own answers and hand-written ones, and name each typical mistake.

Each checker has its table of wrong answers below: the mistake, written as a learner would write it, and the words
its hint must contain.
"""
import math

import numpy as np
import pytest

from kvlesson.rope import apply_rope
from kvlesson.shrink.mla import DEEPSEEK_V3, bytes_per_token
from kvlesson.shrink.quant import QuantizedKVCache
from kvlesson.shrink.sinks import StreamingSinkKVCache
from kvlesson.teaching.checks import check_mla_bytes, check_prerope_keys, check_sink_rerotation

# ---------------------------------------------------------------------------------- keys quantized before RoPE


def prerope_with(back=-1, again=1, interleaved=None, from_zero=False, axis=0, levels=None, rounding=np.rint,
                 guard=True, upcast=False, codes_only=False, in_place=False, skip_back=False):
    """A hand-written answer with one knob per classic mistake."""
    def fn(k, positions, bits, base, il):
        il = il if interleaved is None else interleaved
        p = np.arange(len(positions)) if from_zero else positions
        raw = k if skip_back else apply_rope(k, back * p, base, interleaved=il)
        top = 2**bits - 1 if levels is None else levels(bits)
        lo = raw.min(axis=axis, keepdims=True)
        span = raw.max(axis=axis, keepdims=True) - lo
        scale = np.where(span > 0, span / top, 1).astype(k.dtype) if guard else span / top
        codes = np.clip(rounding((raw - lo) / scale), 0, 2**bits - 1)
        if codes_only:
            return codes.astype(np.uint8)
        out = lo + codes * scale
        if upcast:
            out = out.astype(np.float64)
        out = apply_rope(out, again * p, base, interleaved=il) if again else out
        if in_place:
            k[...] = out
            return k
        return out
    return fn


def test_prerope_checker_passes_a_hand_written_answer_and_agrees_with_the_cache():
    assert check_prerope_keys(prerope_with())
    rng = np.random.default_rng(5)
    for S, d, bits, base, il in [(8, 4, 4, 100.0, False), (16, 8, 2, 10000.0, True), (5, 6, 8, 50.0, False)]:
        raw = rng.standard_normal((S, d))
        raw[:, 0] += 3.0  # a steady outlier channel
        k = apply_rope(raw, np.arange(S), base, interleaved=il)
        cache = QuantizedKVCache(1, d, bits, key_scales="channel", block=S, rope_base=base, interleaved=il,
                                 dtype=np.float64)
        cache.append(k[None], k[None])
        K, _ = cache.append(np.zeros((1, 1, d)), np.zeros((1, 1, d)))  # the next query reads the block quantized
        np.testing.assert_allclose(K[0, :S], check_prerope_keys.reference(k, np.arange(S), bits, base, il),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("wrong, hint", [
    (prerope_with(skip_back=True, again=0), "after RoPE"),
    (prerope_with(again=0), "came out without RoPE"),
    (prerope_with(back=1), "further forward instead of back"),
    (prerope_with(again=-1), "turned the keys back twice"),
    (prerope_with(interleaved=False), "other pairing"),
    (prerope_with(from_zero=True), "0, 1, 2"),
    (prerope_with(axis=1), "scales are per token"),
    (prerope_with(levels=lambda b: 2**b), "(max - min) / 2**bits"),
    (prerope_with(rounding=np.floor), "rounded down"),
    (prerope_with(guard=False), "0 / 0 is nan"),
    (prerope_with(upcast=True), "float64 constant"),
    (prerope_with(codes_only=True), "look like the codes"),
    (prerope_with(in_place=True), "changed k in place"),
    (lambda k, positions, bits, base, il: k.T, "has shape"),
    (lambda k, positions, bits, base, il: None, "returned None"),
    (lambda k, positions, bits, base, il: k + 0.5, "differ from the reference"),
])
def test_prerope_checker_names_the_mistake(wrong, hint):
    verdict = check_prerope_keys(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_integer_codes_do_not_get_the_upcast_hint():
    """Issue 18: returning uint8 codes was told "a float64 constant upcasts float32", which is not what went wrong."""
    verdict = check_prerope_keys(prerope_with(codes_only=True))
    assert "upcast" not in repr(verdict) and "codes" in repr(verdict)
    verdict = check_prerope_keys(lambda k, positions, bits, base, il: np.rint(k).astype(np.int64))
    assert "upcast" not in repr(verdict) and "integers (int64)" in repr(verdict)


def test_a_float32_answer_that_rounds_a_boundary_key_the_other_way_still_passes():
    """Turning back by another formula changes float32 keys in the last bit, which can move one number across the
    boundary between two codes: the checker accepts any answer on the reference's levels within half a step."""
    def own_rotation(k, positions, bits, base, il):
        d = k.shape[1]
        angle = np.asarray(positions, np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)  # [S, d/2]
        c, s = np.cos(angle).astype(k.dtype), np.sin(angle).astype(k.dtype)

        def turn(x, sign):
            a, b = (x[:, 0::2], x[:, 1::2]) if il else (x[:, : d // 2], x[:, d // 2:])
            out = np.empty_like(x)
            ra, rb = a * c - sign * b * s, sign * a * s + b * c
            if il:
                out[:, 0::2], out[:, 1::2] = ra, rb
            else:
                out[:, : d // 2], out[:, d // 2:] = ra, rb
            return out

        raw = turn(k, -1)
        lo = raw.min(axis=0, keepdims=True)
        span = raw.max(axis=0, keepdims=True) - lo
        scale = np.where(span > 0, span / (2**bits - 1), 1).astype(k.dtype)
        return turn(lo + np.clip(np.rint((raw - lo) / scale), 0, 2**bits - 1) * scale, 1)

    assert check_prerope_keys(own_rotation)


# ------------------------------------------------------------------------------------------ MLA bytes per token


def mla_with(rope=True, kv=1, per_head=False, rope_per_head=False, layers=True, fixed_bytes=None, bits=1,
             whole=None, result=None):
    def fn(config, b):
        b = b if fixed_bytes is None else fixed_bytes
        b = b if whole is None else whole(b)
        H = config["num_attention_heads"]
        per_layer = config["kv_lora_rank"] + (config["qk_rope_head_dim"] * (H if rope_per_head else 1) if rope else 0)
        n = (config["num_hidden_layers"] if layers else 1) * per_layer * kv * (H if per_head else 1)
        total = n * b * bits
        return total if result is None else result(total)
    return fn


def test_mla_bytes_checker_passes_the_package_and_a_hand_written_answer():
    assert check_mla_bytes(bytes_per_token)
    assert check_mla_bytes(mla_with())
    assert check_mla_bytes(lambda c, b: float(bytes_per_token(c, b)))  # a float that is whole is fine


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
    # the integer-bytes shortcuts (issue 18): each passes every case whose bytes per number are whole
    (mla_with(whole=int), "down to a whole number"),
    (mla_with(whole=round), "down to a whole number"),
    (mla_with(whole=math.ceil), "up to a whole number"),
    (mla_with(result=int), "rounded the bytes down"),
    (mla_with(result=lambda x: x // 1), "rounded the bytes down"),
    (mla_with(result=round), "rounded the bytes up"),
    (mla_with(result=math.ceil), "rounded the bytes up"),
    (lambda c, b: str(bytes_per_token(c, b)), "expected a number"),
    (lambda c, b: bytes_per_token(c, b) + 1, "got 769 bytes; expected 768"),
    (lambda c, b: None, "expected a number"),
])
def test_mla_bytes_checker_names_the_mistake(wrong, hint):
    verdict = check_mla_bytes(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_mla_bytes_checker_never_asks_for_the_figure_the_lesson_prints():
    """Lesson 11 prints DeepSeek-V3's bf16 bytes (70,272) in its MLA section, which a student copy keeps: the checker
    must not hinge on that one case, so a hard-coded 70,272 fails it."""
    assert not check_mla_bytes(lambda c, b: 70_272)
    assert "70,272" not in repr(check_mla_bytes(mla_with(kv=2)))


# ---------------------------------------------------------------------------- sinks moved to cache positions


def shift_with(extra=0, clamp=True, sign=1, by_p=False, interleaved=None, unchanged=False, per_sink=False):
    def fn(k, p, window, base, il):
        il = il if interleaved is None else interleaved
        n = k.shape[-2]
        if unchanged:
            return k.copy()
        if by_p:
            return apply_rope(k, np.full(n, p), base, interleaved=il)
        s = p - (n + window - 1) + extra
        s = max(s, 0) if clamp else s
        turns = np.arange(n) + s if per_sink else np.full(n, sign * s)
        return apply_rope(k, turns, base, interleaved=il)
    return fn


def sinks_from_the_cache(k, p, window, base, il):
    """The sinks a decode query at text position p reads from StreamingSinkKVCache: its own turned copy of them,
    handed back after the keys at their text positions, or the originals while the query needs no copy."""
    k3 = k.reshape(-1, *k.shape[-2:])
    Hkv, n, d = k3.shape
    cache = StreamingSinkKVCache(Hkv, d, n, window, base, interleaved=il, dtype=k.dtype)
    past = np.zeros((Hkv, p, d), k.dtype)
    past[:, :n] = k3[:, :p]
    cache.append(past, past)
    K, _ = cache.append(np.zeros((Hkv, 1, d), k.dtype), np.zeros((Hkv, 1, d), k.dtype))
    held = cache.key_positions(1).size  # the keys at their text positions; any copies come after them
    return (K[:, held:] if K.shape[1] > held else K[:, :n]).reshape(k.shape)


def test_sink_checker_passes_what_the_streaming_cache_hands_back_and_a_hand_written_answer():
    assert check_sink_rerotation(shift_with())
    assert check_sink_rerotation(sinks_from_the_cache)


@pytest.mark.parametrize("wrong, hint", [
    (shift_with(unchanged=True), "came back as they were"),
    (shift_with(by_p=True), "whole position p"),
    (shift_with(sign=-1), "backwards"),
    (shift_with(extra=1), "one position too far forward"),
    (shift_with(extra=-1), "one position too far back"),
    (shift_with(clamp=False), "back in time"),
    (shift_with(interleaved=False), "other pairing"),
    (shift_with(per_sink=True), "differ from the reference"),
    (lambda k, p, window, base, il: p - (k.shape[-2] + window - 1), "has shape"),
    (lambda k, p, window, base, il: shift_with()(k, p, window, base, il).astype(np.float64), "expected float32"),
    (lambda k, p, window, base, il: None, "returned None"),
])
def test_sink_checker_names_the_mistake(wrong, hint):
    verdict = check_sink_rerotation(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_unfilled_exercises_get_the_stub_verdict():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (check_prerope_keys, check_mla_bytes, check_sink_rerotation):
        verdict = check(todo)
        assert not verdict and verdict.stub


def test_the_references_later_cells_fall_back_on_are_kvlesson_s_own():
    assert check_mla_bytes.reference(DEEPSEEK_V3, 2) == bytes_per_token(DEEPSEEK_V3, 2)
    assert check_prerope_keys(check_prerope_keys.reference)
    assert check_sink_rerotation(check_sink_rerotation.reference)
