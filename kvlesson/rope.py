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


def inv_freq(
    d: int, base: float = 10000.0, scaling: dict | None = None, length: int | None = None
) -> np.ndarray:
    """-> float64 [d/2]: the frequency ladder, base**(-2m/d) radians per position for pair m.

    scaling: None, or the `rope_scaling` dict of a model's config.json, which stretches the ladder for a longer
    context: "linear" (position interpolation: every frequency / factor), "llama3" (Llama 3.1), "yarn" (YaRN, arXiv
    2309.00071), "dynamic" (dynamic NTK: the base grows with the current length) or "ntk" (NTK-aware: one larger base;
    kvlesson's name, since a config that uses it simply states a larger rope_theta).
    length: the sequence length so far, which only "dynamic" reads (None: within the original context).
    Only the frequencies: YaRN's attention factor scales q and k, not the ladder (see attention_factor).
    """
    d, base = validate.integer("d", d, minimum=2), validate.positive("base", base)
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions, so d must be even; got d={d}")
    length = None if length is None else validate.integer("length", length, minimum=1)
    ladder = _ladder(d, base)
    return ladder.copy() if scaling is None else _scaled(ladder, d, base, scaling, length)


def attention_factor(scaling: dict | None) -> float:
    """-> float: how much a scaling rule multiplies q and k (and so every logit by its square); 1.0 for all but YaRN.

    YaRN sharpens attention with a temperature t < 1, sqrt(1/t) = 0.1 ln(factor) + 1 (arXiv 2309.00071, section 3.4):
    transformers multiplies cos and sin by that number, so both q and k grow by it. A config may state the factor
    ("attention_factor"), or DeepSeek's pair ("mscale", "mscale_all_dim") as a ratio of two such numbers.
    """
    if scaling is None:
        return 1.0
    kind = _kind(scaling)
    if kind != "yarn":
        return 1.0
    if "attention_factor" in scaling:
        return _number(scaling, "attention_factor")
    factor = _number(scaling, "factor")

    def mscale(weight):  # the paper's 0.1 ln(s) + 1, with a weight on the log as DeepSeek's configs give it
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(_number(scaling, "mscale")) / mscale(_number(scaling, "mscale_all_dim"))
    return mscale(1.0)


@functools.lru_cache(maxsize=32)
def _ladder(d, base):
    ladder = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    ladder.flags.writeable = False  # shared by every call with the same d and base
    return ladder


def _kind(scaling):
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be a config.json rope_scaling dict or None; got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type"))  # older configs call it "type"
    if kind not in _RULES:
        raise ValueError(f"scaling rope_type must be one of {sorted(_RULES)}; got rope_type={kind!r}")
    return kind


def _scaled(ladder, d, base, scaling, length=None):
    """The ladder stretched by a config.json rope_scaling dict (keys as Hugging Face configs spell them)."""
    return _RULES[_kind(scaling)](ladder, d, base, scaling, length)


def _number(scaling, key, default=None):
    """-> float: scaling[key] (or the default), a finite number above 0; the error names the key."""
    if key not in scaling and default is None:
        raise ValueError(f"rope_scaling of type {scaling.get('rope_type', scaling.get('type'))!r} needs {key!r}")
    return validate.positive(f"rope_scaling[{key!r}]", scaling.get(key, default))


def _linear(ladder, d, base, scaling, length):
    """Position interpolation: every frequency divided by the factor, so position p turns like p / factor."""
    return ladder / _number(scaling, "factor")


def _llama3(ladder, d, base, scaling, length):
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


def _yarn(ladder, d, base, scaling, length):
    """YaRN's frequencies: pairs that turn more than beta_fast times over the original context are kept, pairs
    that turn fewer than beta_slow times are divided by the factor, with a linear ramp over the pair index between."""
    factor, original = _number(scaling, "factor"), _number(scaling, "original_max_position_embeddings")
    beta_fast, beta_slow = _number(scaling, "beta_fast", 32.0), _number(scaling, "beta_slow", 1.0)
    if beta_fast < beta_slow:  # the ramp would run backwards: fast pairs divided, slow ones kept
        raise ValueError(f"rope_scaling needs beta_fast >= beta_slow (turns over the original context that mark the "
                         f"kept and the divided pairs); got beta_fast={beta_fast}, beta_slow={beta_slow}")

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


def _ntk(ladder, d, base, scaling, length):
    """NTK-aware scaling: one larger base, base * factor**(d / (d - 2)), so the slowest pair turns exactly factor
    times slower while the fastest (m = 0) keeps its frequency; the pairs between stretch by a smooth power law."""
    if d == 2:
        raise ValueError("NTK-aware scaling needs d >= 4: with one pair, base**(d / (d - 2)) has no exponent")
    return _ladder(d, base * _number(scaling, "factor") ** (d / (d - 2))).copy()


def _dynamic(ladder, d, base, scaling, length):
    """Dynamic NTK: within the original context the trained ladder; past it, NTK-aware with the factor that would
    fit the current length, base * (factor * length / original - (factor - 1))**(d / (d - 2)), as transformers
    computes it."""
    factor, original = _number(scaling, "factor"), _number(scaling, "original_max_position_embeddings")
    if length is None or length <= original:
        return ladder.copy()
    return _ntk(ladder, d, base, {"factor": factor * length / original - (factor - 1)}, length)


_RULES = {"linear": _linear, "llama3": _llama3, "yarn": _yarn, "ntk": _ntk, "dynamic": _dynamic}


def rope_angles(positions: ArrayLike, d: int, base: float = 10000.0) -> np.ndarray:
    """[T] -> float64 [T, d/2]: the rotation angle of each pair at each position."""
    return _positions(positions)[:, None] * inv_freq(d, base)[None, :]


# A decode step rotates q and k in every layer at the same positions, so the tables are kept: keyed by the positions,
# the ladder's own bytes (whatever inv_freq returns, a patched one included), the dtype and the pairing.
_TABLES = {}
_MAX_TABLES = 64


def rotation(positions: ArrayLike, d: int, base: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
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


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
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
