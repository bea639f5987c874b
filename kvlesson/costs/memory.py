"""The price of the KV cache in bytes, and the decode floor it sets.

    bytes per token     2 (K and V) x n_layers x Hkv x d x bytes per element
    bytes per sequence  what one sequence holds at a context length (windowed layers stop growing)
    decode floor        (weight bytes + KV bytes) / memory bandwidth: each step streams both once
    experts read        a mixture of experts at batch B reads the union of the experts its B tokens route to

Units follow the numbers' own nature: cache sizes are powers of two, so `iec` writes them in KiB (2**10 B)
and GiB (2**30 B); vendors state weights, memory and bandwidth in GB (1e9 B) and TB/s, so `si` writes those.
"""
import math
from numbers import Integral, Real

import ml_dtypes
import numpy as np

from kvlesson.configs import Config

BF16 = np.dtype(ml_dtypes.bfloat16)  # the default: how checkpoints and caches are usually kept


def element_bytes(dtype):
    """A numpy dtype (ml_dtypes' bfloat16, float8_e4m3fn and int4 included) -> bytes per element.

    Counted from the type's bits, so 4-bit types give 0.5: stored packed, two per byte, as real caches do.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype such as np.float32 or ml_dtypes.bfloat16; got {dtype!r}") \
            from None
    for info in (ml_dtypes.finfo, ml_dtypes.iinfo):  # int4 is kind "V" like bfloat16, so ask both
        try:
            bits = info(dt).bits
            return bits / 8 if bits % 8 else bits // 8
        except (ValueError, TypeError):
            pass
    raise TypeError(f"dtype must be a number type; got {dt}")


def kv_bytes_per_token(spec, dtype=BF16):
    """Bytes one token adds to the cache while every layer still grows: 2 x n_layers x Hkv x d x bytes per element.

    The 2 is K and V. Only the Hkv KV heads are stored, never the H query heads: that is all GQA saves.
    """
    _check_spec(spec)
    return _whole(2 * spec.n_layers * spec.Hkv * spec.d * element_bytes(dtype))


def kv_bytes_per_sequence(spec, context, dtype=BF16):
    """Bytes one sequence holds in the cache after `context` tokens.

    Full-attention layers hold all `context` positions. A windowed layer holds min(context, window): during a
    decode step its newest query reads exactly `window` keys, itself and the window - 1 before it, so that many
    must be resident at once, and engines size their sliding-window buffers to the window. (kvlesson's
    WindowKVCache keeps window - 1 between steps and borrows the new token's slot during one: one position per
    windowed layer less, at rest.)
    """
    _check_spec(spec)
    _check_count("context", context, low=0)
    full = spec.n_layers - spec.window_layers
    windowed = min(context, spec.window) if spec.window_layers else 0
    positions = full * context + spec.window_layers * windowed  # summed over layers
    return _whole(2 * spec.Hkv * spec.d * element_bytes(dtype) * positions)


def kv_bytes(spec, context, batch=1, dtype=BF16):
    """Bytes the cache holds for `batch` sequences of `context` tokens each (each sequence has its own K and V)."""
    _check_count("batch", batch, low=1)
    return batch * kv_bytes_per_sequence(spec, context, dtype)


def weight_bytes(spec, dtype=BF16, *, active=False):
    """Bytes of the weights, params x bytes per element; with active=True only what one token reads (MoE)."""
    _check_spec(spec)
    n = spec.active_params if active and spec.active_params is not None else spec.params
    return math.ceil(n * element_bytes(dtype))


def experts_read(spec, batch=1):
    """Routed experts one layer of a mixture of experts is expected to read in a decode step of `batch` tokens.

    Each token's router picks k = experts_per_token distinct experts of E. Under uniform routing, independent from
    token to token, a given expert escapes one token with probability 1 - k/E and all B tokens with (1 - k/E)^B, so
    the step reads E (1 - (1 - k/E)^B) of them: k at batch 1, nearly E once B is several times E / k. A router
    that sends a batch's tokens to the same experts reads fewer (k at the least), so this is the cost of a
    balanced router, the state load-balancing losses train for. 0 for a dense model.
    """
    _check_spec(spec)
    _check_count("batch", batch, low=1)
    if spec.experts is None:
        return 0
    E, k = spec.experts, spec.experts_per_token
    return k + (E - k) * (1 - (1 - k / E) ** (batch - 1))  # the first token's k, then what later tokens add


def step_weight_bytes(spec, batch=1, dtype=BF16):
    """Bytes of weights one decode step of `batch` tokens reads, each weight once, whatever the batch.

    Dense: every weight. Mixture of experts: what every token reads (active_params less its k experts' share),
    and the experts_read(spec, batch) of E experts per layer that the batch's tokens route to.
    """
    _check_spec(spec)
    if spec.experts is None:
        return weight_bytes(spec, dtype, active=True)
    per_expert = spec.expert_params / spec.experts  # one expert, summed over the layers
    extra = (experts_read(spec, batch) - spec.experts_per_token) * per_expert  # experts beyond one token's own
    return math.ceil((spec.active_params + extra) * element_bytes(dtype))


def decode_floor(spec, accel, context, batch=1, *, kv_dtype=BF16, weight_dtype=BF16):
    """Seconds per decode step, at best: (weight bytes + KV bytes) / bandwidth.

    One step reads every weight it uses once (shared by the whole batch) and every cached K and V once (one cache
    per sequence), and memory cannot deliver them faster than its bandwidth. A dense model uses every weight. A
    mixture of experts uses what every token reads plus the union of the experts its tokens route to, expected
    under uniform routing (experts_read): at batch 1 that is its active parameters, at larger batches more.
    Compute, kernel launches and communication only add to it.
    """
    if not (isinstance(accel.bandwidth, Real) and accel.bandwidth > 0):
        raise ValueError(f"bandwidth must be positive bytes/s; {accel.name!r} has {accel.bandwidth!r}")
    moved = step_weight_bytes(spec, batch, weight_dtype) + kv_bytes(spec, context, batch, kv_dtype)
    return moved / accel.bandwidth


def matmul_intensity(n_out, n_in, batch=1, dtype=BF16):
    """FLOPs per byte moved for Y = W X, W [n_out, n_in], X [n_in, batch].

    FLOPs: 2 x n_out x n_in x batch (a multiply and an add per weight per vector).
    Bytes: every weight once, plus the inputs and outputs: (n_out x n_in + batch x (n_in + n_out)) x bytes.
    At batch 1 in BF16 that is about 1 FLOP per byte; the weights' cost is shared by the batch, so it grows ~batch.
    """
    for name, n in (("n_out", n_out), ("n_in", n_in), ("batch", batch)):
        _check_count(name, n, low=1)
    flops = 2 * n_out * n_in * batch
    moved = (n_out * n_in + batch * (n_in + n_out)) * element_bytes(dtype)
    return flops / moved


def iec(n, digits=2):
    """Bytes in binary units: 131072 -> '128 KiB', 2**30 -> '1 GiB' (trailing zeros dropped)."""
    return _fmt(n, 1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], digits)


def si(n, unit=None, digits=2):
    """Bytes in decimal units, the vendors' way: si(16.06e9) -> '16.06 GB'; si(5.4e8, 'GB') -> '0.54 GB'.

    Rounded to `digits` decimals, trailing zeros dropped (80e9 -> '80 GB').
    """
    units = ["B", "kB", "MB", "GB", "TB", "PB"]
    if unit is not None:
        if unit not in units:
            raise ValueError(f"unit must be one of {units}; got {unit!r}")
        return _fmt(n, 1000, units, digits, units.index(unit))
    return _fmt(n, 1000, units, digits)


def _fmt(n, base, units, digits, i=None):
    """n / base**i to `digits` decimals, trailing zeros dropped; i defaults to the largest unit <= n."""
    if isinstance(n, bool) or not isinstance(n, Real) or n < 0:
        raise ValueError(f"need a byte count >= 0; got {n!r}")
    if i is None:
        i = 0
        while i + 1 < len(units) and n >= base ** (i + 1):
            i += 1
    text = f"{n / base ** i:,.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {units[i]}"


def _whole(x):
    """An exact byte count as an int; a fractional one (odd element sizes) stays a float."""
    return int(x) if float(x).is_integer() else x


def _check_count(name, n, low):
    if isinstance(n, bool) or not isinstance(n, Integral) or n < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {name}={n!r}")


def _check_spec(spec):
    if not isinstance(spec, Config):
        raise TypeError(f"need a kvlesson.configs.Config (see MODELS); got a {type(spec).__name__}")
    for field in ("n_layers", "H", "Hkv", "d"):
        _check_count(f"{spec.name}: {field}", getattr(spec, field), low=1)
    if spec.H % spec.Hkv:
        raise ValueError(f"{spec.name}: H={spec.H} query heads must be a multiple of Hkv={spec.Hkv} KV heads")
    if not 0 <= spec.window_layers <= spec.n_layers:
        raise ValueError(f"{spec.name}: window_layers={spec.window_layers} must lie in 0..n_layers={spec.n_layers}")
    if spec.window_layers and (spec.window is None or spec.window < 1):
        raise ValueError(f"{spec.name}: {spec.window_layers} windowed layers need a window >= 1; got "
                         f"window={spec.window!r}")
    if not (isinstance(spec.params, Real) and spec.params > 0):
        raise ValueError(f"{spec.name}: params must be positive; got params={spec.params!r}")
    moe = (spec.experts, spec.experts_per_token, spec.expert_params)
    if moe == (None, None, None):
        return
    E, k, n = moe
    if isinstance(E, bool) or not isinstance(E, Integral) or E < 1 or isinstance(k, bool) or \
            not isinstance(k, Integral) or not 1 <= k <= E:
        raise ValueError(f"{spec.name}: a mixture of experts needs integers 1 <= experts_per_token <= experts; got "
                         f"experts={E!r}, experts_per_token={k!r}")
    if isinstance(n, bool) or not isinstance(n, Real) or not 0 < n <= spec.params:
        raise ValueError(f"{spec.name}: expert_params must be positive and at most params={spec.params!r}; got "
                         f"expert_params={n!r}")
    if spec.active_params is None or not n * k / E <= spec.active_params:
        raise ValueError(f"{spec.name}: active_params must hold its {k} experts' share of expert_params "
                         f"({n * k / E:.4g}); got active_params={spec.active_params!r}")
