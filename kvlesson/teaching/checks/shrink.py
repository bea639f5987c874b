"""Checkers for lesson 11: keys quantized before RoPE, MLA cache bytes from a config, sinks moved to cache positions.

Each runs the learner's function on seeded cases and rejects any answer that differs from kvlesson's. To say why,
it compares the answer with the classic slips: keys quantized after RoPE, or never turned back, or turned the wrong
way; scales along the wrong axis, 2**bits levels, floor for round, a constant channel turned into nan, integer codes
returned; the MLA cache counted twice (K and V), per head, without its RoPE key or its layers, or in whole bytes;
sinks turned by the query's position, the wrong way, one slot off, or further back than the text they came from.
"""
import math

import numpy as np

from kvlesson.rope import apply_rope
from kvlesson.shrink.mla import DEEPSEEK_V3
from kvlesson.shrink.mla import bytes_per_token as _mla_bytes
from kvlesson.shrink.quant import dequantize, quantize
from kvlesson.teaching.verdict import (
    Slip,
    as_array,
    as_number,
    checker,
    distinct_digits,
    first_slip,
    passed,
    reject,
    reject_slip,
    run,
)

__all__ = ["check_prerope_keys", "check_mla_bytes", "check_sink_rerotation"]


# ------------------------------------------------------------------------------------ keys quantized before RoPE

def _channels(x, bits, axis=0):
    """Each channel (axis=0: over the tokens) quantized between its min and max, then dequantized, in x's dtype."""
    return dequantize(*quantize(x, bits, axis=axis), x.dtype)


def _prerope(k, positions, bits, base, interleaved, turn_back=-1, turn_again=1, axis=0, quantizer=None):
    """The reference, with one knob per classic slip: which way the keys are turned before and after (0: not at all),
    the axis the scales run along, and the quantizer itself."""
    p = np.asarray(positions)
    raw = apply_rope(k, turn_back * p, base, interleaved=interleaved) if turn_back else k
    back = quantizer(raw, bits) if quantizer else _channels(raw, bits, axis)
    return apply_rope(back, turn_again * p, base, interleaved=interleaved) if turn_again else back


def _symmetric(x, bits):
    top = np.abs(x).max(axis=0, keepdims=True)
    scale = np.where(top > 0, top / (2 ** (bits - 1) - 1), 1).astype(x.dtype)
    return np.rint(x / scale) * scale


def _levels_2_to_the_bits(x, bits):
    lo = x.min(axis=0, keepdims=True)
    span = x.max(axis=0, keepdims=True) - lo
    scale = np.where(span > 0, span / 2**bits, 1).astype(x.dtype)
    return lo + np.clip(np.rint((x - lo) / scale), 0, 2**bits - 1) * scale


def _floored(x, bits):
    _, scale, lo = quantize(x, bits, axis=0)
    return lo + np.floor((x - lo) / scale) * scale


_PREROPE_SLIPS = [
    Slip("after RoPE", lambda k, p, b, base, il: _channels(k, b),
         "for {case} you quantized the keys as the cache holds them, after RoPE",
         "RoPE turns each pair of channels by a different angle at every position, so a channel that is steady before "
         "RoPE swings between +-its size after it. Turn each key back first: rotating by -p undoes rotating by p"),
    Slip("not turned again", lambda k, p, b, base, il: _prerope(k, p, b, base, il, turn_again=0),
         "for {case} your keys are still turned back: they came out without RoPE",
         "after dequantizing, rotate every key again at its own position, so attention sees what it saw before"),
    Slip("turned forward twice", lambda k, p, b, base, il: _prerope(k, p, b, base, il, turn_back=1),
         "for {case} you turned the keys further forward instead of back before quantizing",
         "the cache's keys are already rotated by p; apply_rope(k, p) turns them to 2p. Undo it with the negative "
         "positions, -p, then quantize, then rotate by +p"),
    Slip("turned back twice", lambda k, p, b, base, il: _prerope(k, p, b, base, il, turn_again=-1),
         "for {case} you turned the keys back twice: they end up at -p",
         "the second rotation restores RoPE: use +p there, not -p"),
    Slip("other pairing", lambda k, p, b, base, il: _prerope(k, p, b, base, not il),
         "for {case} you rotated with the other pairing of channels",
         "pass interleaved= through to apply_rope: GGUF models pair (2m, 2m + 1), Hugging Face ones (m, m + d/2)"),
    Slip("positions from 0", lambda k, p, b, base, il: _prerope(k, np.arange(len(p)), b, base, il),
         "for {case} you turned the keys by 0, 1, 2, ... rather than by the positions given",
         "these keys sit at the positions you are handed (a block later in the text starts there): use them"),
    Slip("scales per token", lambda k, p, b, base, il: _prerope(k, p, b, base, il, axis=1),
         "for {case} your scales are per token (one per row)",
         "per channel means one scale per column: min and max over the tokens, axis=0 with keepdims=True"),
    Slip("symmetric absmax", lambda k, p, b, base, il: _prerope(k, p, b, base, il, quantizer=_symmetric),
         "for {case} your result matches symmetric quantization (max |x|, no minimum)",
         "asymmetric, as KIVI's: lo = min, scale = (max - min) / (2**bits - 1), code = round((x - lo) / scale)"),
    Slip("2**bits steps", lambda k, p, b, base, il: _prerope(k, p, b, base, il, quantizer=_levels_2_to_the_bits),
         "for {case} your step is (max - min) / 2**bits",
         "bits bits give 2**bits codes, 0 .. 2**bits - 1: 2**bits - 1 steps from min to max"),
    Slip("floor", lambda k, p, b, base, il: _prerope(k, p, b, base, il, quantizer=_floored),
         "for {case} your codes are rounded down", "round to the nearest code (np.rint), not down (floor or int())"),
]


def _prerope_cases():
    rng = np.random.default_rng(11)
    steady = rng.standard_normal((16, 8)) * 0.3
    steady[:, 1] += 6.0  # an outlier channel, steady before RoPE, as SmolLM2's keys have
    constant = rng.standard_normal((6, 4))
    constant[:, [1, 3]] = 0.0  # a pair of channels that is 0 for every token, before RoPE and after: a span of 0

    def at(raw, positions, base, interleaved):  # keys as the cache holds them: rotated at their positions
        return apply_rope(raw, positions, base, interleaved=interleaved)

    return [
        ("k [8, 4] at positions 0..7, bits=4, base=100", at(rng.standard_normal((8, 4)), np.arange(8), 100.0, False),
         np.arange(8), 4, 100.0, False),
        ("k [16, 8] with an outlier channel, float32, at positions 40..55, bits=4, base=10000, interleaved",
         at(steady, np.arange(40, 56), 10000.0, True).astype(np.float32), np.arange(40, 56), 4, 10000.0, True),
        ("k [12, 6] at positions 3..14, bits=2, base=50", at(rng.standard_normal((12, 6)), np.arange(3, 15), 50.0,
                                                             False), np.arange(3, 15), 2, 50.0, False),
        ("k [6, 4] whose channels 1 and 3 are 0 for every token, at positions 0..5, bits=4, base=100",
         at(constant, np.arange(6), 100.0, False), np.arange(6), 4, 100.0, False),
        ("k [5, 4] at positions 7..11, bits=8, base=10, interleaved", at(rng.standard_normal((5, 4)) * 3,
                                                                         np.arange(7, 12), 10.0, True),
         np.arange(7, 12), 8, 10.0, True),
        ("one key, k [1, 4] at position 1000, bits=4, base=100", at(rng.standard_normal((1, 4)), [1000], 100.0,
                                                                    False), np.array([1000]), 4, 100.0, False),
    ]


@checker
def check_prerope_keys(fn):
    """fn(k [S, d], positions [S], bits, base, interleaved) -> [S, d] in k's dtype: the keys (rotated at their
    positions, as the cache holds them) turned back to before RoPE, each channel quantized over the S tokens between
    its min and max, dequantized, and rotated again."""
    for case, k, positions, bits, base, interleaved in _prerope_cases():
        before = k.copy()
        got = as_array(run(fn, k, positions.copy(), bits, base, interleaved, case=case), case)
        if not np.array_equal(k, before):
            reject(f"for {case} your function changed k in place", "compute the result in new arrays")
        _prerope_verdict(got, k, positions, bits, base, interleaved, case)
    return passed("keys turned back by -p, each channel quantized over the tokens (2**bits - 1 steps, rounded to the "
                  "nearest code), turned again by +p; float32, both pairings, positions past 0, a constant channel and "
                  "a single key included")


def _prerope_verdict(got, k, positions, bits, base, interleaved, case):
    want = _prerope(k, positions, bits, base, interleaved)
    if got.dtype.kind in "biu":
        reject(f"for {case} your function returned integers ({got.dtype}): these look like the codes",
               "return the keys themselves: dequantize (lo + scale * code) and rotate again, in k's dtype")
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "one key per row, as k came in; keepdims=True keeps min and max broadcastable over the rows")
    if got.dtype != want.dtype:
        hint = ("keep k's dtype: a float64 constant (np.float64, .astype(float)) upcasts float32; Python numbers do "
                "not" if got.dtype.kind == "f" else "return floating-point keys in k's dtype")
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}", hint)
    if not np.isfinite(got).all():
        reject(f"for {case} your result has nan or inf",
               "a channel whose values are all equal has max - min = 0, and 0 / 0 is nan: give it scale 1 (or any "
               "nonzero number), so its codes are 0 and it comes back as its min, exactly")
    raw = apply_rope(k.astype(np.float64), -np.asarray(positions), base, interleaved=interleaved)  # before RoPE
    span = raw.max(axis=0) - raw.min(axis=0)
    step = float(span[span > 1e-9].min(initial=1.0)) / (2**bits - 1)
    tol = 1e-3 * step if k.dtype == np.float64 else 1e-4 * max(step, float(np.abs(raw).max()))
    if np.allclose(got, want, rtol=0, atol=tol) or _on_the_grid(got, raw, positions, bits, base, interleaved, tol):
        return
    slip = first_slip(got, _PREROPE_SLIPS, (k, positions, bits, base, interleaved),
                      same=lambda g, w: np.shape(g) == np.shape(w) and np.allclose(g, w, rtol=0, atol=tol))
    if slip is not None:
        reject_slip(slip, case)
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} the keys differ from the reference by up to {err:.3g} (one step is at least {step:.3g})",
           "turn back (apply_rope at -positions), quantize each column (lo = min, scale = (max - min) / (2**bits - 1),"
           " code = rint((x - lo) / scale)), dequantize, rotate again at +positions")


def _on_the_grid(got, raw, positions, bits, base, interleaved, tol):
    """A float32 answer may round a number that sits on a boundary between two codes the other way: accept any
    answer whose keys, turned back, lie on the reference's levels and within half a step (and a rounding) of raw."""
    back = apply_rope(got.astype(np.float64), -np.asarray(positions), base, interleaved=interleaved)
    _, scale, lo = quantize(raw, bits, axis=0)
    codes = (back - lo) / scale
    on_levels = np.abs(codes - np.rint(codes)) * scale <= tol
    close = np.abs(back - raw) <= scale / 2 + tol
    return bool(on_levels.all() and close.all() and (np.rint(codes) >= -0.5).all()
                and (np.rint(codes) <= 2**bits - 0.5).all())


# ------------------------------------------------------------------------------------------ MLA bytes per token

_SMALL = {"num_hidden_layers": 4, "num_attention_heads": 12, "hidden_size": 256, "kv_lora_rank": 32,
          "qk_nope_head_dim": 24, "qk_rope_head_dim": 16, "v_head_dim": 20}
_NO_ROPE = {**_SMALL, "num_hidden_layers": 3, "kv_lora_rank": 48, "qk_rope_head_dim": 0}
_ODD = {**_SMALL, "num_hidden_layers": 3, "kv_lora_rank": 45, "qk_rope_head_dim": 8}  # 159 numbers a token


_FRACTION = ("a token's bytes can be fractional when a number takes a fraction of a byte (an average over tokens): "
             "drop the int(), //, round() or ceil()")


def _whole_bytes(c, b, whole):
    per_element = whole(b)
    return c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * per_element


_MLA_SLIPS = [  # whole bytes before "K and V": 0.5 rounded up to 1 byte also doubles the count
    Slip("2 bytes", lambda c, b: _mla_bytes(c, 2) if b != 2 else None,
         "for {case} you counted 2 bytes per number whatever bytes_per_element is", "multiply by bytes_per_element"),
    Slip("whole bytes per number", lambda c, b: _whole_bytes(c, b, int) if b != int(b) else None,
         "for {case} you cut bytes_per_element down to a whole number",
         "a number can take a fraction of a byte: 0.5 for 4-bit codes, 34 / 32 for int8 with a 16-bit scale per 32. "
         "Multiply by bytes_per_element as it is (no int(), //, or round())"),
    Slip("whole bytes per number, up", lambda c, b: _whole_bytes(c, b, math.ceil) if b != math.ceil(b) else None,
         "for {case} you rounded bytes_per_element up to a whole number",
         "a number can take a fraction of a byte: multiply by bytes_per_element as it is (no ceil())"),
    Slip("whole bytes per token", lambda c, b: math.floor(_mla_bytes(c, b)) if _mla_bytes(c, b) % 1 else None,
         "for {case} you rounded the bytes down to a whole number", _FRACTION),
    Slip("whole bytes per token, up", lambda c, b: math.ceil(_mla_bytes(c, b)) if _mla_bytes(c, b) % 1 else None,
         "for {case} you rounded the bytes up to a whole number", _FRACTION),
    Slip("no rope key", lambda c, b: c["num_hidden_layers"] * c["kv_lora_rank"] * b,
         "for {case} you counted only the latent", "each token also caches its RoPE key, qk_rope_head_dim numbers "
                                                   "per layer, next to the kv_lora_rank of the latent"),
    Slip("K and V", lambda c, b: 2 * _mla_bytes(c, b), "for {case} your count is twice the cache",
         "there is no separate V: one latent per token and layer, from which both K and V are expanded, so no "
         "factor 2"),
    Slip("per head", lambda c, b: c["num_attention_heads"] * _mla_bytes(c, b),
         "for {case} you counted the latent once per head",
         "the latent and the RoPE key are shared by all heads: per layer, kv_lora_rank + qk_rope_head_dim numbers"),
    Slip("rope per head", lambda c, b: c["num_hidden_layers"] * (c["kv_lora_rank"] + c["num_attention_heads"]
                                                                  * c["qk_rope_head_dim"]) * b,
         "for {case} you counted one RoPE key per head", "MLA's RoPE key is one small key shared by every head"),
    Slip("one layer", lambda c, b: (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * b,
         "for {case} you counted one layer", "every layer caches its own latent: multiply by num_hidden_layers"),
    Slip("MHA", lambda c, b: c["num_hidden_layers"] * c["num_attention_heads"] * (
        c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * b,
         "for {case} you counted every head's K and V, as plain multi-head attention would cache them",
         "MLA caches the latent instead: kv_lora_rank + qk_rope_head_dim numbers per token and layer"),
    Slip("bits", lambda c, b: 8 * _mla_bytes(c, b), "for {case} your count is in bits", "count bytes: no factor 8"),
]


@checker
def check_mla_bytes(fn):
    """fn(config, bytes_per_element) -> a number: the cache bytes one token adds to an MLA model, from its config.json;
    bytes_per_element may be a fraction (4-bit codes, or int8 with its scales)."""
    # a case of 4 bytes first: there, a fixed 2 bytes, K and V counted twice, and bits are three different numbers
    cases = [("a small MLA config in float32 (4 bytes)", _SMALL, 4),
             ("DeepSeek-V3 in fp8 (1 byte a number)", DEEPSEEK_V3, 1),
             ("DeepSeek-V3 with 4-bit latents (0.5 bytes a number)", DEEPSEEK_V3, 0.5),
             ("an MLA config without a RoPE part (qk_rope_head_dim 0), 2 bytes", _NO_ROPE, 2),
             ("a small config in int8 with a 16-bit scale per 32 numbers (34 / 32 bytes a number)", _SMALL, 34 / 32),
             ("an MLA config of 3 layers x (45 + 8) numbers, 4-bit (0.5 bytes a number)", _ODD, 0.5)]
    for case, config, b in cases:
        config = dict(config)
        got = as_number(run(fn, config, b, case=case), case)
        want = _mla_bytes(config, b)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        slip = first_slip(got, _MLA_SLIPS, (config, b), same=lambda g, w: math.isclose(g, w, rel_tol=1e-9))
        if slip is not None:
            reject_slip(slip, case)
        mine, theirs = distinct_digits(got, want)
        reject(f"for {case} you got {mine} bytes; expected {theirs}",
               "num_hidden_layers x (kv_lora_rank + qk_rope_head_dim) x bytes_per_element")
    return passed("MLA caches layers x (kv_lora_rank + qk_rope_head_dim) numbers per token, at any bytes per number: "
                  "fp8, 4-bit and int8 with scales included")


# ---------------------------------------------------------------------------- sinks moved to cache positions

def _shifted(k, p, window, base, interleaved, extra=0, clamp=True, sign=1):
    """The reference turn of the sinks for the query at p, with one knob per classic slip."""
    n = k.shape[-2]
    shift = p - (n + window - 1) + extra
    shift = max(shift, 0) if clamp else shift
    return apply_rope(k, np.full(n, sign * shift), base, interleaved=interleaved)


_SINK_SLIPS = [
    Slip("unchanged", lambda k, p, W, base, il: k if p > k.shape[-2] + W - 1 else None,
         "for {case} the sinks came back as they were, still at their positions in the text",
         "kvlesson.step rotated sink j at its text position j, p - j behind the query. In the cache the query sits "
         "right after the sinks and the window: work out how far behind it each sink must be, and turn the sink "
         "further forward by the difference"),
    Slip("turned by p", lambda k, p, W, base, il: apply_rope(k, np.full(k.shape[-2], p), base, interleaved=il),
         "for {case} you turned the sinks by the query's whole position p",
         "the sinks are already rotated at 0 .. n - 1: turn them by the difference between where they must sit and "
         "where they are, which is the same for every sink"),
    Slip("wrong way", lambda k, p, W, base, il: _shifted(k, p, W, base, il, sign=-1),
         "for {case} you turned the sinks backwards, further away from the query",
         "moving a key closer to a later query means a larger position: turn by +shift"),
    Slip("one too far", lambda k, p, W, base, il: _shifted(k, p, W, base, il, extra=1) if p >= k.shape[-2] + W - 1
         else None, "for {case} your sinks sit one position too far forward",
         "the cache holds the sinks, then the last W - 1 keys, then the query: with n sinks the query's cache position "
         "is n + W - 1"),
    Slip("one too near", lambda k, p, W, base, il: _shifted(k, p, W, base, il, extra=-1) if p > k.shape[-2] + W - 1
         else None, "for {case} your sinks sit one position too far back",
         "count the window as W keys with the query among them: W - 1 held keys, then the query"),
    Slip("no clamp", lambda k, p, W, base, il: _shifted(k, p, W, base, il, clamp=False) if p < k.shape[-2] + W - 1
         else None, "for {case} you turned the sinks back in time although the query is still close to them",
         "until the window reaches past the sinks, the cache holds every token, so cache positions are text "
         "positions: the shift is never negative (max(..., 0))"),
    Slip("other pairing", lambda k, p, W, base, il: _shifted(k, p, W, base, not il),
         "for {case} you rotated with the other pairing of channels",
         "pass interleaved= through to apply_rope: GGUF models pair (2m, 2m + 1), Hugging Face ones (m, m + d/2)"),
]


def _sink_cases():
    rng = np.random.default_rng(8)
    return [
        ("3 sinks [3, 4], query at 20, window 5, base 100", rng.standard_normal((3, 4)), 20, 5, 100.0, False),
        ("4 sinks [4, 8] in float32, query at 100, window 32, base 10000, interleaved",
         rng.standard_normal((4, 8)).astype(np.float32), 100, 32, 10000.0, True),
        ("2 sinks, query at 7, window 5 (just past the sinks)", rng.standard_normal((2, 6)), 7, 5, 100.0, False),
        ("2 sinks, query at 6, window 5 (the window meets the sinks)", rng.standard_normal((2, 6)), 6, 5, 100.0,
         False),
        ("1 sink, query at 3, window 8 (the text is shorter than the window)", rng.standard_normal((1, 4)), 3, 8,
         100.0, True),
        ("2 KV heads of 4 sinks [2, 4, 6], query at 50, window 10, base 500", rng.standard_normal((2, 4, 6)), 50, 10,
         500.0, False),
    ]


@checker
def check_sink_rerotation(fn):
    """fn(k_sinks [..., n, d], p, window, base, interleaved) -> [..., n, d] in k's dtype: the n sinks, which step
    rotated at their text positions 0 .. n - 1, rotated so that each sits as far behind the query at text position p
    as it does in a cache that numbers its keys 0, 1, 2, ... (the sinks, then the last window - 1, then the query)."""
    for case, k, p, window, base, interleaved in _sink_cases():
        before = k.copy()
        got = as_array(run(fn, k, p, window, base, interleaved, case=case), case)
        if not np.array_equal(k, before):
            reject(f"for {case} your function changed k_sinks in place", "compute the result in a new array")
        want = _shifted(k, p, window, base, interleaved)
        if got.shape != want.shape:
            reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
                   "return the sinks' keys themselves, one per row, turned: not the shift, not the positions")
        if got.dtype != want.dtype:
            reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
                   "keep k's dtype: apply_rope does, and a float64 constant upcasts float32")
        tol = dict(rtol=1e-10, atol=1e-10) if k.dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
        if np.allclose(got, want, **tol):
            continue
        slip = first_slip(got, _SINK_SLIPS, (k, p, window, base, interleaved),
                          same=lambda g, w, tol=tol: np.shape(g) == np.shape(w) and np.allclose(g, w, **tol))
        if slip is not None:
            reject_slip(slip, case)
        reject(f"for {case} your sinks differ from the reference by up to "
               f"{np.abs(got.astype(np.float64) - want).max():.3g}",
               "scores under RoPE depend only on the distance between query and key: work out the distance in the "
               "cache, compare it with the distance in the text, and turn every sink by the difference")
    return passed("every sink turned forward by the same shift, which puts it where the cache numbering does; the "
                  "window reaching the sinks, a text shorter than the window, both pairings and float32 included")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_prerope_keys.reference = _prerope
check_mla_bytes.reference = _mla_bytes
check_sink_rerotation.reference = _shifted
