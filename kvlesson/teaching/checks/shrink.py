"""Checkers for lesson 11: per-channel quantization, MLA cache bytes from a config, and the attention-sink mask.

Each runs the learner's function on seeded cases and rejects any answer that differs from kvlesson's. To say why,
it compares the answer with the classic slips: scales along the wrong axis, symmetric or 2**bits levels, floor for
round, a constant channel turned into nan; the MLA cache counted twice (K and V), per head, without its RoPE key
or without its layers; sinks that see the future, a window one key too wide, a bound without its offset.
"""
import numpy as np

from kvlesson.shrink.mla import DEEPSEEK_V3
from kvlesson.shrink.mla import bytes_per_token as _mla_bytes
from kvlesson.shrink.quant import dequantize, quantize
from kvlesson.shrink.sinks import sink_mask as _sink_mask
from kvlesson.teaching.verdict import Slip, as_array, as_number, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_channel_quant", "check_mla_bytes", "check_sink_mask"]


# ---------------------------------------------------------------------------------- per-channel quantization

def _round_trip(x, bits, axis=0):
    return dequantize(*quantize(x, bits, axis=axis))


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
    codes, scale, lo = quantize(x, bits, axis=0)
    return lo + np.floor((x - lo) / scale) * scale


_QUANT_SLIPS = [
    Slip("scales per token", lambda x, bits: _round_trip(x, bits, axis=1),
         "for {case} your scales are per token (one per row)",
         "per channel means one scale per column: take min and max over the tokens, axis=0 with keepdims=True, so "
         "an outlier channel gets its own wide step and the others keep their fine ones"),
    Slip("symmetric absmax", _symmetric, "for {case} your result matches symmetric quantization (max |x|, no minimum)",
         "this exercise is asymmetric, as KIVI's: lo = min, scale = (max - min) / (2**bits - 1), "
         "x ~ lo + scale * round((x - lo) / scale); every level then lies inside [min, max]"),
    Slip("2**bits steps", _levels_2_to_the_bits, "for {case} your step is (max - min) / 2**bits",
         "bits bits give 2**bits codes, 0 .. 2**bits - 1: that is 2**bits - 1 steps from min to max, so "
         "scale = (max - min) / (2**bits - 1), and max itself is a level"),
    Slip("floor", _floored, "for {case} your codes are rounded down",
         "round to the nearest code (np.rint), not down (floor or int()): floor errs by up to a whole step, "
         "rounding by at most half of one"),
    Slip("codes returned", lambda x, bits: quantize(x, bits, axis=0)[0].astype(x.dtype),
         "for {case} you returned the integer codes",
         "return the round trip: lo + scale * code, numbers close to x, in x's dtype"),
    Slip("ignores bits", lambda x, bits: _round_trip(x, 8) if bits != 8 else None,
         "for {case} your result matches 8 bits, whatever bits is", "use the bits argument: 2**bits - 1 steps"),
    Slip("ignores bits", lambda x, bits: _round_trip(x, 4) if bits != 4 else None,
         "for {case} your result matches 4 bits, whatever bits is", "use the bits argument: 2**bits - 1 steps"),
]


def _quant_cases():
    rng = np.random.default_rng(11)
    keys = rng.standard_normal((16, 6))
    keys[:, 2] *= 8  # an outlier channel, as real keys have
    constant = rng.standard_normal((6, 4))
    constant[:, 1] = 0.25  # a channel whose values are all equal: its span is 0
    return [
        ("x [8, 4], bits=4", rng.standard_normal((8, 4)), 4),
        ("keys [16, 6] with an outlier channel, float32, bits=4", keys.astype(np.float32), 4),
        ("x [5, 3], bits=8", rng.standard_normal((5, 3)) * 3, 8),
        ("x [12, 4], bits=2", rng.standard_normal((12, 4)), 2),
        ("x [6, 4] whose channel 1 is constant (0.25 in every row), bits=4", constant, 4),
        ("one token, x [1, 5], bits=4", rng.standard_normal((1, 5)), 4),
    ]


@checker
def check_channel_quant(fn):
    """fn(x [S, d], bits) -> [S, d] in x's dtype: each channel (column) quantized to 2**bits levels between its
    min and max, then dequantized."""
    for case, x, bits in _quant_cases():
        before = x.copy()
        got = as_array(run(fn, x, bits, case=case), case)
        if not np.array_equal(x, before):
            reject(f"for {case} your function changed x in place", "compute codes and the result in new arrays")
        _quant_verdict(got, _round_trip(x, bits), x, bits, case)
    return passed("per-channel scales, 2**bits - 1 steps from min to max, rounding to the nearest code; float32, "
                  "a constant channel and a single token included")


def _quant_verdict(got, want, x, bits, case):
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "the round trip has the shape of x; keepdims=True keeps min and max broadcastable over the rows")
    if got.dtype != want.dtype:
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}",
               "keep x's dtype: a float64 constant (np.float64, .astype(float)) upcasts float32; Python numbers do not")
    span = x.max(axis=0) - x.min(axis=0)
    step = float(span[span > 0].min(initial=1.0)) / (2**bits - 1)
    if np.allclose(got, want, rtol=0, atol=1e-3 * step):
        return
    if not np.isfinite(got).all():
        reject(f"for {case} your result has nan or inf",
               "a channel whose values are all equal has max - min = 0, and 0 / 0 is nan: give it scale 1 (or any "
               "nonzero number), so its codes are 0 and it comes back as its min, exactly")
    slip = first_slip(got, _QUANT_SLIPS, (x, bits), same=lambda g, w: np.allclose(g, w, rtol=0, atol=1e-3 * step))
    if slip is not None:
        reject_slip(slip, case)
    err = np.abs(got.astype(np.float64) - want).max()
    reject(f"for {case} the values differ from the reference by up to {err:.3g} (one step is at least {step:.3g})",
           "per column: lo = min, scale = (max - min) / (2**bits - 1), code = rint((x - lo) / scale), "
           "result = lo + code * scale")


# ------------------------------------------------------------------------------------------ MLA bytes per token

_SMALL = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 256, "kv_lora_rank": 32,
          "qk_nope_head_dim": 24, "qk_rope_head_dim": 16, "v_head_dim": 20}
_NO_ROPE = {**_SMALL, "num_hidden_layers": 3, "kv_lora_rank": 48, "qk_rope_head_dim": 0}


_MLA_SLIPS = [  # "2 bytes" first: with 1 byte a number, a fixed 2 would also read as "twice the cache"
    Slip("2 bytes", lambda c, b: _mla_bytes(c, 2) if b != 2 else None,
         "for {case} you counted 2 bytes per number whatever bytes_per_element is", "multiply by bytes_per_element"),
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
    """fn(config, bytes_per_element) -> int: the cache bytes one token adds to an MLA model, from its config.json."""
    cases = [("DeepSeek-V3 in bf16 (2 bytes a number)", DEEPSEEK_V3, 2),
             ("DeepSeek-V3 in fp8 (1 byte a number)", DEEPSEEK_V3, 1),
             ("a small MLA config in float32 (4 bytes)", _SMALL, 4),
             ("an MLA config without a RoPE part (qk_rope_head_dim 0), 2 bytes", _NO_ROPE, 2)]
    for case, config, b in cases:
        config = dict(config)
        got = as_number(run(fn, config, b, case=case), case, integer=True)
        if got == _mla_bytes(config, b):
            continue
        slip = first_slip(got, _MLA_SLIPS, (config, b), same=lambda g, w: g == w)
        if slip is not None:
            reject_slip(slip, case)
        reject(f"for {case} you got {got:,} bytes; expected {_mla_bytes(config, b):,}",
               "num_hidden_layers x (kv_lora_rank + qk_rope_head_dim) x bytes_per_element")
    return passed(f"MLA caches layers x (kv_lora_rank + qk_rope_head_dim) numbers per token: "
                  f"{_mla_bytes(DEEPSEEK_V3, 2):,} bytes for DeepSeek-V3 in bf16")


# --------------------------------------------------------------------------------------------- the sink mask

def _rule(T, S, sinks, window, causal_sinks=True, wide=0, offset=True, with_sinks=True, with_window=True,
          sink_edge=0):
    """A sink mask with one knob per classic mistake (the defaults are the right rule)."""
    p = (np.arange(S - T, S) if offset else np.arange(T))[:, None]  # [T, 1]
    j = np.arange(S)[None, :]  # [1, S]
    causal = j <= np.arange(S - T, S)[:, None]
    sink = (j < sinks + sink_edge) & (causal if causal_sinks else True)
    recent = causal & ((j > p - window - wide) if with_window else True)
    return (recent | sink) if with_sinks else recent


_SINK_SLIPS = [
    Slip("sinks see the future", lambda T, S, s, W: _rule(T, S, s, W, causal_sinks=False),
         "for {case} a query sees a sink that comes after it",
         "a sink is still a key: query p sees sink j only when j <= p. Keep the causal bound on the sinks too: "
         "(j <= p) & ((j < sinks) | (j > p - window))"),
    Slip("W + 1 keys", lambda T, S, s, W: _rule(T, S, s, W, wide=1),
         "for {case} each query sees window + 1 recent keys",
         "the window counts the query's own key: j > p - window (strict), not >="),
    Slip("no offset", lambda T, S, s, W: _rule(T, S, s, W, offset=False),
         "for {case} the window bound misses the offset",
         "query i sits at position p = S - T + i; the window is j > S - T + i - window"),
    Slip("no sinks", lambda T, S, s, W: _rule(T, S, s, W, with_sinks=False),
         "for {case} your mask is a plain window: the sinks are gone", "add (j < sinks), under the causal bound"),
    Slip("no window", lambda T, S, s, W: _rule(T, S, s, W, with_window=False),
         "for {case} your mask is plain causal: nothing leaves the window", "add the lower bound j > p - window"),
    Slip("sinks + 1", lambda T, S, s, W: _rule(T, S, s, W, sink_edge=1),
         "for {case} your mask keeps sinks + 1 first positions", "positions 0 .. sinks - 1 are the sinks: j < sinks"),
]


@checker
def check_sink_mask(fn):
    """fn(T, S, sinks, window) -> bool [T, S]: query i (at S - T + i) sees key j when j <= S - T + i and
    (j < sinks or j > S - T + i - window)."""
    # the first case has T > window, so a bound without its offset cannot pass for plain causal there
    cases = [(6, 9, 1, 2), (3, 10, 2, 3), (1, 12, 4, 4), (6, 6, 2, 2), (5, 8, 6, 2), (4, 9, 0, 3), (2, 8, 3, 10),
             (0, 5, 2, 2)]
    for T, S, sinks, window in cases:
        case = f"T={T}, S={S}, sinks={sinks}, window={window}"
        got = as_array(run(fn, T, S, sinks, window, case=case), case)
        want = _sink_mask(np.arange(S), np.arange(S - T, S), sinks, window)
        if got.shape != want.shape:
            reject(f"for {case} the mask has shape {got.shape}; expected {want.shape}",
                   "one row per new query, one column per key: [T, S]")
        if got.dtype != bool:
            reject(f"for {case} the mask is {got.dtype}; expected bool", "build it from comparisons (<=, <, >, |, &)")
        if np.array_equal(got, want):
            continue
        slip = first_slip(got, _SINK_SLIPS, (T, S, sinks, window), same=lambda g, w: np.array_equal(g, w))
        if slip is not None:
            reject_slip(slip, case)
        i = int(np.flatnonzero((got != want).any(axis=1))[0])
        reject(f"for {case} query {i} (position {S - T + i}) sees keys {np.flatnonzero(got[i]).tolist()}; it "
               f"should see {np.flatnonzero(want[i]).tolist()}", "j <= p and (j < sinks or j > p - window)")
    return passed("sinks under the causal bound, a window of exactly W keys at the offset position; "
                  "decode, a prefill, sinks = 0, a window longer than the text and T = 0 included")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_channel_quant.reference = _round_trip
check_mla_bytes.reference = _mla_bytes
check_sink_mask.reference = _rule
