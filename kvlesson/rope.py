"""Rotary position embedding (RoPE) at absolute positions.

Each pair of dimensions (x1, x2) is rotated by the angle position * base**(-2m/d), m = 0 .. d/2 - 1.
Two conventions pair the dimensions differently:
  half-split  (Hugging Face):       pair m is (x[m], x[m + d/2])
  interleaved (GGUF, llama.cpp):    pair m is (x[2m], x[2m + 1])
"""
import functools
import math

import numpy as np
from numpy.typing import ArrayLike

from kvlesson import validate


def inv_freq(d: int, base: float = 10000.0, scaling: dict | None = None) -> np.ndarray:
    """-> float64 [d/2]: the frequency ladder, base**(-2m/d) radians per position for pair m.

    scaling: None, or the `rope_scaling` dict of a model's config.json, which stretches the ladder for a longer
    context: "linear" (every frequency / factor), "llama3" (Llama 3.1) or "yarn" (YaRN, arXiv 2309.00071).
    Only the frequencies: YaRN's attention factor scales the scores, not the ladder, and is not returned here.
    """
    d, base = validate.integer("d", d, minimum=2), validate.positive("base", base)
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions, so d must be even; got d={d}")
    ladder = _ladder(d, base)
    return ladder.copy() if scaling is None else _scaled(ladder, d, base, scaling)


@functools.lru_cache(maxsize=32)
def _ladder(d, base):
    ladder = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    ladder.flags.writeable = False  # shared by every call with the same d and base
    return ladder


def _scaled(ladder, d, base, scaling):
    """The ladder stretched by a config.json rope_scaling dict (keys as Hugging Face configs spell them)."""
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be a config.json rope_scaling dict or None; got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type"))  # older configs call it "type"
    rules = {"linear": _linear, "llama3": _llama3, "yarn": _yarn}
    if kind not in rules:
        raise ValueError(f"scaling rope_type must be one of {sorted(rules)}; got rope_type={kind!r}")
    return rules[kind](ladder, d, base, scaling)


def _number(scaling, key, default=None):
    """-> float: scaling[key] (or the default), a finite number above 0; the error names the key."""
    if key not in scaling and default is None:
        raise ValueError(f"rope_scaling of type {scaling.get('rope_type', scaling.get('type'))!r} needs {key!r}")
    return validate.positive(f"rope_scaling[{key!r}]", scaling.get(key, default))


def _linear(ladder, d, base, scaling):
    """Position interpolation: every frequency divided by the factor, so position p turns like p / factor."""
    return ladder / _number(scaling, "factor")


def _llama3(ladder, d, base, scaling):
    """Llama 3.1's rule: pairs with wavelengths shorter than original / high_freq_factor are kept, longer than
    original / low_freq_factor are divided by the factor, and in between the two are blended linearly in
    original / wavelength (the number of turns a pair makes over the original context)."""
    factor, low, high = (_number(scaling, k) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = _number(scaling, "original_max_position_embeddings")
    if high <= low:
        raise ValueError(f"rope_scaling needs high_freq_factor > low_freq_factor; got {high} and {low}")
    wavelength = 2 * math.pi / ladder  # positions per full turn of each pair
    smooth = (original / wavelength - low) / (high - low)  # 0 at the long end of the blend, 1 at the short end
    blend = (1 - smooth) * ladder / factor + smooth * ladder
    return np.where(wavelength < original / high, ladder, np.where(wavelength > original / low, ladder / factor, blend))


def _yarn(ladder, d, base, scaling):
    """YaRN's frequencies: pairs that turn more than beta_fast times over the original context are kept, pairs
    that turn fewer than beta_slow times are divided by the factor, with a linear ramp over the pair index between."""
    factor, original = _number(scaling, "factor"), _number(scaling, "original_max_position_embeddings")
    beta_fast, beta_slow = _number(scaling, "beta_fast", 32.0), _number(scaling, "beta_slow", 1.0)

    def pair_turning(turns):  # the (fractional) pair index m that makes `turns` full turns in `original` positions
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = pair_turning(beta_fast), pair_turning(beta_slow)
    truncate = scaling.get("truncate", True)  # configs may switch rounding off (gpt-oss: "truncate": false)
    if not isinstance(truncate, bool):
        raise TypeError(f"rope_scaling['truncate'] must be true or false; got {truncate!r}")
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if hi == lo:
        hi += 0.001  # as the reference implementation does: a ramp needs some width
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)  # 0: keep the pair, 1: divide by the factor
    return ladder / factor * ramp + ladder * (1 - ramp)


def rope_angles(positions, d, base=10000.0):
    """[T] -> float64 [T, d/2]: the rotation angle of each pair at each position."""
    return _positions(positions)[:, None] * inv_freq(d, base)[None, :]


# A decode step rotates q and k in every layer at the same positions, so the tables are kept: keyed by the positions,
# the ladder's own bytes (whatever inv_freq returns, a patched one included), the dtype and the pairing.
_TABLES = {}
_MAX_TABLES = 64


def rotation(positions, d, base, dtype):
    """[T] positions -> read-only (cos, sin), each [T, d/2] in dtype: the tables `rotate` turns by. Cached."""
    ladder = inv_freq(d, base)  # looked up each time, so that a stretched ladder (lesson 11) takes effect
    positions = np.asarray(positions, dtype=np.float64)
    key = (positions.tobytes(), ladder.tobytes(), np.dtype(dtype).str)
    tables = _TABLES.get(key)
    if tables is None:
        angles = positions[:, None] * ladder[None, :]  # [T, d/2], float64: see apply_rope
        tables = (np.cos(angles).astype(dtype), np.sin(angles).astype(dtype))
        for t in tables:
            t.flags.writeable = False
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.clear()
        _TABLES[key] = tables
    return tables


def rotate(x, cos, sin, interleaved=False):
    """[..., T, d], tables [T, d/2] -> [..., T, d]: each pair (x1, x2) turned to (x1 cos - x2 sin, x1 sin + x2 cos).
    No checks: apply_rope makes them, and the model's forward pass calls this with its own, already checked, data."""
    d = x.shape[-1]
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : d // 2], x[..., d // 2 :])
    out = np.empty_like(x)
    o1, o2 = (out[..., 0::2], out[..., 1::2]) if interleaved else (out[..., : d // 2], out[..., d // 2 :])
    np.subtract(x1 * cos, x2 * sin, out=o1)  # [..., T, d/2]
    np.add(x1 * sin, x2 * cos, out=o2)
    return out


def _positions(positions):
    """-> float64 [T]: finite real positions (integers in practice); bools and NaN refused."""
    p = np.asarray(positions)
    if p.dtype.kind not in "iuf":
        raise TypeError(f"positions must be integers (absolute token positions); got dtype {p.dtype}")
    if p.ndim != 1:
        raise ValueError(f"positions must be one position per token, shape [T]; got shape {p.shape}")
    p = p.astype(np.float64)
    if not np.isfinite(p).all():
        raise ValueError("positions must be finite; got NaN or inf")
    return p


def apply_rope(x: ArrayLike, positions: ArrayLike, base: float = 10000.0, *, interleaved: bool = False) -> np.ndarray:
    """[..., T, d], [T] absolute positions -> [..., T, d], in the dtype of x.

    The angles are computed in float64 (positions reach the thousands, where float32 loses
    the fractional part of the angle) and cast once to x.dtype, so float32 stays float32.
    """
    x = validate.floats("x", x)
    base = validate.positive("base", base)
    if x.ndim < 2 or x.shape[-1] % 2 or x.shape[-1] == 0:
        raise ValueError(f"RoPE needs x [..., T, d] with an even head dim d >= 2; got x {x.shape}")
    d = x.shape[-1]
    positions = _positions(positions)
    if positions.shape != (x.shape[-2],):
        raise ValueError(f"need one position per token: x {x.shape} has T={x.shape[-2]}, positions {positions.shape}")
    return rotate(x, *rotation(positions, d, base, x.dtype), interleaved)
