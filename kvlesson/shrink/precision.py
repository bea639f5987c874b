"""Low-precision numbers for attention: the formats, bfloat16 by hand, sums kept in a narrow type, and a KV cache
stored in 16 or 8 bits.

numpy has no bfloat16; `ml_dtypes` (the package JAX uses for its dtypes) adds it, and float8 formats too.
bfloat16 is the top half of a float32: the same sign and 8 exponent bits, so the same range, but only 7 of the 23
mantissa bits. float16 spends its 16 bits the other way: 5 exponent bits (largest value 65,504), 10 mantissa bits.
The two 8-bit formats of the OCP FP8 specification make the same trade again: e4m3 (4 exponent bits, 3 mantissa bits,
largest value 448, no infinity) and e5m2 (5 and 2, largest 57,344).

Three ways to add n terms in a narrow format, each rounding after every addition: `running_sum` (one loop, an error
that grows with n), `pairwise_sum` (a tree, growing with log n) and `kahan_sum` (a loop that carries the part each
addition rounded away, Kahan 1965).
"""
import math
import warnings

import ml_dtypes
import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache
from kvlesson.sdpa import causal_mask

__all__ = ["bfloat16", "e4m3", "e5m2", "formats", "round_bf16", "running_sum", "pairwise_sum", "kahan_sum",
           "attention_in", "LowPrecisionKVCache", "scale_for"]

bfloat16 = np.dtype(ml_dtypes.bfloat16)
e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)  # "fn": finite, no infinity; what vLLM and FlashAttention-3 call e4m3
e5m2 = np.dtype(ml_dtypes.float8_e5m2)


def formats(dtypes=(np.float64, np.float32, bfloat16, np.float16)):
    """-> one dict per format: name, bits, exponent and mantissa bits, largest value, eps, smallest normal.

    eps is the spacing of the format just above 1, the relative step of its rounding (half of it at worst).
    """
    if isinstance(dtypes, (str, bytes, np.dtype, type)) or not hasattr(dtypes, "__iter__"):
        raise TypeError(f"dtypes must be a list of floating dtypes, e.g. (np.float32, precision.bfloat16); got "
                        f"dtypes={dtypes!r}")
    rows = []
    for i, dt in enumerate(dtypes):
        f = ml_dtypes.finfo(_float_format(f"dtypes[{i}]", dt))
        rows.append(dict(name=np.dtype(dt).name, bits=f.bits, exponent=f.nexp, mantissa=f.nmant,
                         max=float(f.max), eps=float(f.eps), tiny=float(f.smallest_normal)))
    return rows


def round_bf16(x):
    """float32 [...] -> float32 [...]: each value rounded to the nearest bfloat16 (ties to even), kept in float32.

    A bfloat16 is the upper 16 bits of a float32. Rounding adds just under half of the dropped part's range
    (0x7FFF), plus 1 when the kept part is odd, so that an exact half goes to the even neighbour; a carry
    ripples into the exponent (1.99.. -> 2, the largest float32 -> inf) exactly as rounding should.
    """
    x = validate.floats("x", x)
    if x.dtype != np.float32:
        raise TypeError(f"x must be float32 (bfloat16 is its upper half); got dtype {x.dtype}")
    bits = x.view(np.uint32)
    odd = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + odd) & 0xFFFF0000).view(np.float32)  # uint32 wraps only for a NaN
    return np.where(np.isnan(x), x, rounded)


def running_sum(x, dtype, axis=-1):
    """Sum along `axis` as one loop over the terms does: a total kept in `dtype`, rounded after every addition.

    In bfloat16, once the total is 256 times a term, adding it changes nothing: the term is under half a step.
    """
    dtype, terms = _terms(x, dtype, axis)
    total = np.zeros(terms.shape[1:], dtype)
    for term in terms:
        total = (total + term).astype(dtype, copy=False)  # numpy float16 would otherwise keep a float32 total
    return total


def pairwise_sum(x, dtype, axis=-1):
    """Sum along `axis` as a tree: neighbours added in pairs, then the pairs, ... every partial sum rounded to `dtype`.

    Each term passes through about log2(n) additions instead of up to n, so the rounding errors grow with log n. numpy
    sums float32 and float64 this way (in blocks of 128), and float16 too, with float32 partial sums.
    """
    dtype, level = _terms(x, dtype, axis)  # [n, ...]
    if level.shape[0] == 0:
        return np.zeros(level.shape[1:], dtype)
    while level.shape[0] > 1:
        if level.shape[0] % 2:  # an odd one out waits for the next level
            level = np.concatenate([level, np.zeros((1, *level.shape[1:]), dtype)])
        level = (level[0::2] + level[1::2]).astype(dtype, copy=False)
    return level[0]


def kahan_sum(x, dtype, axis=-1):
    """Sum along `axis` in one loop, every operation rounded to `dtype`, carrying what each addition rounded away.

    total + y loses the low part of y; (new total - total) - y is exactly that loss with its sign flipped (with
    round-to-nearest, in any binary format), so the next term is corrected by it first (Kahan 1965).
    """
    dtype, terms = _terms(x, dtype, axis)
    total = np.zeros(terms.shape[1:], dtype)
    lost = np.zeros(terms.shape[1:], dtype)  # minus what the additions so far rounded away
    for term in terms:
        y = (term - lost).astype(dtype, copy=False)
        new = (total + y).astype(dtype, copy=False)
        lost = ((new - total).astype(dtype, copy=False) - y).astype(dtype, copy=False)
        total = new
    return total


def attention_in(q, k, v, *, store, accumulate, p_store=None):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> (scores [H, T, S], weights [H, T, S], out [H, T, d]) in `accumulate`.

    Attention with its inputs rounded to `store`, and every product, sum, exp and division done in `accumulate`.
    A sum in a format narrower than float32 is a running_sum, as a loop with a 16-bit accumulator computes it;
    float32 and float64 sums are numpy's own. With float64 for both it is kvlesson.attention, written out.

    p_store rounds the exps to that format before they multiply V, while their sum is taken before the rounding:
    FlashAttention-2's forward pass feeds its tensor cores a 16-bit P and keeps the row sum in float32. The weights
    returned are then the ones that multiply V: the rounded exps over the unrounded sum.
    """
    q, k, v, _ = validate.attention_inputs(q, k, v)
    store, acc = _float_format("store", store), _float_format("accumulate", accumulate)
    p_store = None if p_store is None else _float_format("p_store", p_store)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    q, k, v = (a.astype(store).astype(acc) for a in (q, k, v))
    kh, vh = k[np.arange(H) // (H // Hkv)], v[np.arange(H) // (H // Hkv)]  # [H, S, d]: head h reads h // G
    s = _sum(q[:, :, None, :] * kh[:, None, :, :], acc, axis=-1)  # [H, T, S], summed over d
    s = (s * acc.type(1 / math.sqrt(d))).astype(acc)
    s = np.where(causal_mask(T, S), s, acc.type(-np.inf))
    e = np.exp(s - s.max(axis=-1, keepdims=True)).astype(acc)  # [H, T, S]
    total = _sum(e, acc, axis=-1)[..., None]  # [H, T, 1]
    if p_store is not None:
        e = e.astype(p_store).astype(acc)
    p = (e / total).astype(acc)  # [H, T, S]
    out = _sum(p[..., None] * vh[:, None, :, :], acc, axis=2)  # [H, T, d], summed over the keys
    return s, p, out


def _terms(x, dtype, axis):
    """-> (dtype, x cast to it with `axis` moved to the front, [n, ...]): what the three sums loop over."""
    dtype = _float_format("dtype", dtype)
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # a ragged nested list
        raise ValueError(f"x is not a rectangular array of numbers ({e})") from None
    if a.dtype.kind not in "iu" and not _is_float(a.dtype):
        raise TypeError(f"x must hold real numbers; got dtype {a.dtype}")
    if a.ndim == 0:
        raise ValueError("x must have at least one axis to sum along; got a single number")
    axis = validate.integer("axis", axis, minimum=-a.ndim)
    if axis >= a.ndim:
        raise ValueError(f"axis={axis} is out of range for x of {a.ndim} axes {a.shape}")
    return dtype, np.moveaxis(a.astype(dtype), axis, 0)


def _sum(x, dtype, axis):
    if ml_dtypes.finfo(dtype).nmant < 23:
        return running_sum(x, dtype, axis)
    return x.astype(dtype, copy=False).sum(axis=axis)


class LowPrecisionKVCache(Cache):
    """A StaticKVCache that stores keys and values in a narrow float format and hands back `dtype` (float32 default).

    store: what is held, bfloat16 or float16 (2 bytes a number) or e4m3 or e5m2 (1 byte). k_scale, v_scale: None to
    store the numbers as they are, or a scale, as fp8 caches keep one: a positive number (one per tensor, the whole
    cache of a layer, vLLM's k_scale and v_scale) or one per KV head, [Hkv]. The cache stores x / scale rounded to
    `store` and hands back stored * scale, so a scale maps the numbers' range onto the format's: scale = the largest
    |x| expected / the format's largest value (`scale_for`). Scales are fixed when the cache is made, as engines load
    them calibrated with the model; nbytes counts them (float32) with the codes.

    A number that falls beyond the store's largest value once scaled is refused (ValueError, nothing changes), or,
    with saturate=True, clipped to it, as vLLM's fp8 cache writes do (__NV_SATFINITE): a calibrated scale can meet a
    key larger than any it was calibrated on.
    """

    appends = "writes past end"

    def __init__(self, Hkv, d, capacity, store=bfloat16, dtype=np.float32, *, k_scale=None, v_scale=None,
                 saturate=False):
        super().__init__(Hkv, d, dtype)
        self.store = _float_format("store", store)
        self.capacity = validate.integer("capacity", capacity)
        self.k_scale, self.v_scale = _scale("k_scale", k_scale, self.Hkv), _scale("v_scale", v_scale, self.Hkv)
        if not isinstance(saturate, (bool, np.bool_)):
            raise TypeError(f"saturate must be True or False; got saturate={saturate!r}")
        self.saturate = bool(saturate)
        self.k = np.zeros((self.Hkv, self.capacity, self.d), self.store)  # [Hkv, capacity, d]
        self.v = np.zeros((self.Hkv, self.capacity, self.d), self.store)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        S = self._seen + T
        if S > self.capacity:
            raise ValueError(f"cache full: it holds {self._seen} of {self.capacity} positions and cannot take T={T} "
                             "more")
        k_low, v_low = self._encode("k_new", k_new, self.k_scale), self._encode("v_new", v_new, self.v_scale)
        self.k[:, self._seen : S] = k_low  # both encoded (and checked) before either is written
        self.v[:, self._seen : S] = v_low
        self._seen = S
        return self._decode(self.k[:, :S], self.k_scale), self._decode(self.v[:, :S], self.v_scale)

    def _encode(self, name, x, scale):
        """[Hkv, T, d] -> the numbers divided by the scale, in `store`; refused (or clipped) past its largest value."""
        top = float(ml_dtypes.finfo(self.store).max)
        scaled = x if scale is None else x / scale.astype(x.dtype).reshape(-1, 1, 1)
        if self.saturate:
            scaled = np.clip(scaled, -top, top)  # nan stays nan
        with np.errstate(over="ignore"):  # an overflow is reported below, as a refusal
            low = scaled.astype(self.store)
        lost = np.isfinite(scaled) & ~np.isfinite(low)  # finite before, inf or nan after: beyond the largest value
        if lost.any():
            scaled_note = "" if scale is None else " once divided by its scale"
            raise ValueError(f"{name} holds {x[lost].flat[0]:g}, beyond {self.store.name}'s largest value {top:g}"
                             f"{scaled_note} (pass saturate=True to clip such numbers)")
        return low

    def _decode(self, low, scale):
        out = low.astype(self.dtype)
        return out if scale is None else out * scale.astype(self.dtype).reshape(-1, 1, 1)

    def truncate(self, n):
        self._seen = self._check_truncate(n)  # the positions past n are overwritten by the next append

    @property
    def nbytes(self):
        scales = sum(0 if s is None else s.nbytes for s in (self.k_scale, self.v_scale))
        return self.k.nbytes + self.v.nbytes + scales


def scale_for(x, store, per="tensor"):
    """x [Hkv, S, d] -> the scale that maps the largest |x| onto `store`'s largest value: a float for per="tensor",
    float32 [Hkv] for per="head" (one per KV head). A head whose numbers are all 0 gets scale 1."""
    x, store = validate.floats("x", x), _float_format("store", store)
    if not isinstance(per, str) or per not in ("tensor", "head"):
        raise ValueError(f"per must be 'tensor' or 'head'; got per={per!r}")
    if x.ndim != 3 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"x must be a finite, non-empty [Hkv, S, d] array; got shape {x.shape}")
    amax = np.abs(x).max() if per == "tensor" else np.abs(x).max(axis=(1, 2))
    scale = np.where(amax > 0, amax / float(ml_dtypes.finfo(store).max), 1.0).astype(np.float32)
    return float(scale) if per == "tensor" else scale


def _scale(name, scale, Hkv):
    """None, a positive number, or one per KV head -> None, or float32 [] or [Hkv]."""
    if scale is None:
        return None
    if isinstance(scale, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name} must be a positive number or one per KV head; got {name}={scale!r}")
    try:
        s = np.asarray(scale, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a positive number or one per KV head; got {name}={scale!r}") from None
    if s.shape not in ((), (Hkv,)):
        raise ValueError(f"{name} must be one number (per tensor) or {Hkv} (one per KV head); got shape {s.shape}")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"{name} must be finite and above 0; got {name}={scale!r}")
    return s.astype(np.float32)  # [] per tensor (4 bytes), [Hkv] per head


def _float_format(name, dtype):
    """-> a numpy dtype for a floating format, ml_dtypes' ones (bfloat16, float8) included."""
    if dtype is None:  # np.dtype(None) is float64: never what a caller who passes nothing meant
        raise TypeError(f"{name} must be a floating dtype (np.float32, np.float16, precision.bfloat16, ...); got None")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # numpy 2's deprecated aliases ('a') are junk here
            dt = np.dtype(dtype)
        if not _is_float(dt):
            raise TypeError
    except (TypeError, ValueError, DeprecationWarning):
        raise TypeError(f"{name} must be a floating dtype (np.float32, np.float16, precision.bfloat16, ...); "
                        f"got {name}={dtype!r}") from None
    return dt


def _is_float(dt):
    """True for a real floating format: numpy's, or ml_dtypes' (whose arrays numpy files under kind 'V')."""
    if dt.kind == "c":  # finfo accepts complex (it describes the parts)
        return False
    try:
        ml_dtypes.finfo(dt)
    except (TypeError, ValueError):
        return False
    return True
