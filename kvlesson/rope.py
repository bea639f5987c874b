"""Rotary position embedding (RoPE) at absolute positions.

Each pair of dimensions (x1, x2) is rotated by the angle position * base**(-2m/d), m = 0 .. d/2 - 1.
Two conventions pair the dimensions differently:
  half-split  (Hugging Face):       pair m is (x[m], x[m + d/2])
  interleaved (GGUF, llama.cpp):    pair m is (x[2m], x[2m + 1])
"""
import numpy as np

from kvlesson import validate


def inv_freq(d, base=10000.0):
    """-> float64 [d/2]: the frequency ladder, base**(-2m/d) radians per position for pair m."""
    d, base = validate.integer("d", d, minimum=2), validate.positive("base", base)
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions, so d must be even; got d={d}")
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def rope_angles(positions, d, base=10000.0):
    """[T] -> float64 [T, d/2]: the rotation angle of each pair at each position."""
    return _positions(positions)[:, None] * inv_freq(d, base)[None, :]


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


def apply_rope(x, positions, base=10000.0, *, interleaved=False):
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
    angles = rope_angles(positions, d, base)  # [T, d/2]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    r1 = x1 * cos - x2 * sin  # [..., T, d/2]
    r2 = x1 * sin + x2 * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = r1, r2
    else:
        out[..., : d // 2], out[..., d // 2 :] = r1, r2
    return out
