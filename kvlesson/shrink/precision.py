"""Low-precision numbers for attention: the formats, bfloat16 by hand, sums kept in a narrow type, a 16-bit KV cache.

numpy has no bfloat16; `ml_dtypes` (the package JAX uses for its dtypes) adds it, and float8 formats too.
bfloat16 is the top half of a float32: the same sign and 8 exponent bits, so the same range, but only 7 of the 23
mantissa bits. float16 spends its 16 bits the other way: 5 exponent bits (largest value 65,504), 10 mantissa bits.
"""
import math

import ml_dtypes
import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache
from kvlesson.sdpa import _checked, causal_mask

__all__ = ["bfloat16", "formats", "round_bf16", "running_sum", "attention_in", "LowPrecisionKVCache"]

bfloat16 = np.dtype(ml_dtypes.bfloat16)


def formats(dtypes=(np.float64, np.float32, bfloat16, np.float16)):
    """-> one dict per format: name, bits, exponent and mantissa bits, largest value, eps, smallest normal.

    eps is the spacing of the format just above 1, the relative step of its rounding (half of it at worst).
    """
    rows = []
    for dt in dtypes:
        f = ml_dtypes.finfo(dt)
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
    dtype = _float_format("dtype", dtype)
    terms = np.moveaxis(np.asarray(x).astype(dtype), axis, 0)
    total = np.zeros(terms.shape[1:], dtype)
    for term in terms:
        total = (total + term).astype(dtype, copy=False)  # numpy float16 would otherwise keep a float32 total
    return total


def attention_in(q, k, v, *, store, accumulate):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> (scores [H, T, S], weights [H, T, S], out [H, T, d]) in `accumulate`.

    Attention with its inputs rounded to `store`, and every product, sum, exp and division done in `accumulate`.
    A sum in a format narrower than float32 is a running_sum, as a loop with a 16-bit accumulator computes it;
    float32 and float64 sums are numpy's own. With float64 for both it is kvlesson.attention, written out.
    """
    q, k, v, _ = _checked(q, k, v, None)
    store, acc = _float_format("store", store), _float_format("accumulate", accumulate)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    q, k, v = (a.astype(store).astype(acc) for a in (q, k, v))
    kh, vh = k[np.arange(H) // (H // Hkv)], v[np.arange(H) // (H // Hkv)]  # [H, S, d]: head h reads h // G
    s = _sum(q[:, :, None, :] * kh[:, None, :, :], acc, axis=-1)  # [H, T, S], summed over d
    s = (s * acc.type(1 / math.sqrt(d))).astype(acc)
    s = np.where(causal_mask(T, S), s, acc.type(-np.inf))
    e = np.exp(s - s.max(axis=-1, keepdims=True)).astype(acc)  # [H, T, S]
    p = (e / _sum(e, acc, axis=-1)[..., None]).astype(acc)  # [H, T, S]
    out = _sum(p[..., None] * vh[:, None, :, :], acc, axis=2)  # [H, T, d], summed over the keys
    return s, p, out


def _sum(x, dtype, axis):
    if ml_dtypes.finfo(dtype).nmant < 23:
        return running_sum(x, dtype, axis)
    return x.astype(dtype, copy=False).sum(axis=axis)


class LowPrecisionKVCache(Cache):
    """A StaticKVCache that stores keys and values in a 16-bit format but takes and hands back float32.

    dtype is what append accepts and returns (float32), `store` what is held (bfloat16 or float16 by default):
    nbytes counts the stored bytes, half of a float32 cache. A block that would overflow the store (float16 tops
    out at 65,504) is refused, and a refused append changes nothing.
    """

    def __init__(self, Hkv, d, capacity, store=bfloat16):
        super().__init__(Hkv, d, np.float32)
        self.store = _float_format("store", store)
        self.capacity = validate.integer("capacity", capacity)
        self.k = np.zeros((self.Hkv, self.capacity, self.d), self.store)  # [Hkv, capacity, d]
        self.v = np.zeros((self.Hkv, self.capacity, self.d), self.store)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        S = self._seen + T
        if S > self.capacity:
            raise ValueError(f"cache full: it holds {self._seen} of {self.capacity} positions and cannot take T={T} "
                             "more")
        with np.errstate(over="ignore"):  # an overflow is reported below, as a refusal
            k16, v16 = k_new.astype(self.store), v_new.astype(self.store)
        for name, new, rounded in (("k_new", k_new, k16), ("v_new", v_new, v16)):
            lost = np.isfinite(new) & ~np.isfinite(rounded)
            if lost.any():
                raise ValueError(f"{name} holds {new[lost].flat[0]:g}, beyond {self.store.name}'s largest value "
                                 f"{float(ml_dtypes.finfo(self.store).max):g}")
        self.k[:, self._seen : S] = k16
        self.v[:, self._seen : S] = v16
        self._seen = S
        return self.k[:, :S].astype(np.float32), self.v[:, :S].astype(np.float32)

    def truncate(self, n):
        self._seen = self._check_truncate(n)

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


def _float_format(name, dtype):
    """-> a numpy dtype for a floating format, ml_dtypes' ones (bfloat16, float8) included."""
    try:
        dt = np.dtype(dtype)
        if dt.kind == "c":  # finfo accepts complex (it describes the parts)
            raise TypeError
        ml_dtypes.finfo(dt)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a floating dtype (np.float32, np.float16, precision.bfloat16, ...); "
                        f"got {name}={dtype!r}") from None
    return dt
