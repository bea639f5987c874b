"""Three KV caches with one protocol.

    append(k_new, v_new) -> (K, V)   k_new, v_new [Hkv, T, d]; K, V [Hkv, S, d], oldest first:
                                     the keys and values the T new queries attend over
    len(cache)                       tokens seen so far: the absolute position of the next token
    cache.nbytes                     bytes held

An append that is rejected raises ValueError and leaves the cache exactly as it was.
"""
import numpy as np

from kvlesson import validate


class _Cache:
    def __init__(self, Hkv, d, dtype):
        self.Hkv, self.d = validate.integer("Hkv", Hkv, minimum=1), validate.integer("d", d, minimum=1)
        self.dtype = _float_dtype(dtype)
        self._seen = 0  # the one place the position advances

    def __len__(self):
        return self._seen

    def _check(self, k_new, v_new):
        """Validate before touching any state; return (k_new, v_new, T) as arrays."""
        k_new, v_new = validate.floats("k_new", k_new), validate.floats("v_new", v_new)
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have the same shape; got {k_new.shape} and {v_new.shape}")
        if k_new.ndim != 3 or k_new.shape[0] != self.Hkv or k_new.shape[2] != self.d:
            raise ValueError(
                f"this cache holds [Hkv={self.Hkv}, T, d={self.d}] blocks; got k_new {k_new.shape}"
            )
        if k_new.dtype != self.dtype or v_new.dtype != self.dtype:
            raise ValueError(
                f"this cache holds {self.dtype}; got k_new {k_new.dtype}, v_new {v_new.dtype} (cast explicitly)"
            )
        return k_new, v_new, k_new.shape[1]


class KVCache(_Cache):
    """Grows by concatenation: simple, but every append copies the whole cache (quadratic in copies)."""

    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.k = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, S, d]
        self.v = np.zeros((Hkv, 0, d), self.dtype)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        if T:
            self.k = np.concatenate([self.k, k_new], axis=1)
            self.v = np.concatenate([self.v, v_new], axis=1)
            self._seen += T
        return self.k, self.v

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class StaticKVCache(_Cache):
    """Preallocates `capacity` positions and writes each new block in place (no copies of the past)."""

    def __init__(self, Hkv, d, capacity, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.capacity = validate.integer("capacity", capacity)
        self.k = np.zeros((Hkv, capacity, d), self.dtype)  # [Hkv, capacity, d]
        self.v = np.zeros((Hkv, capacity, d), self.dtype)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        S = self._seen + T
        if S > self.capacity:
            raise ValueError(
                f"cache full: it holds {self._seen} of {self.capacity} positions and cannot take T={T} more"
            )
        self.k[:, self._seen : S] = k_new
        self.v[:, self._seen : S] = v_new
        self._seen = S
        return self.k[:, :S], self.v[:, :S]  # views, no copy

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class WindowKVCache(_Cache):
    """A ring buffer for a sliding window of W keys.

    With a window of W, the oldest key the next query can see is W - 1 positions back,
    so between steps the cache keeps only the last W - 1 positions. During a step of T new
    tokens it hands back the last W - 1 + T, because the first new query still needs
    the W - 1 keys before it. Absolute position p lives in slot p % (W - 1).
    """

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.window = validate.integer("window", window, minimum=1)
        self.slots = window - 1
        self.k = np.zeros((Hkv, self.slots, d), self.dtype)  # [Hkv, W - 1, d], ring order
        self.v = np.zeros((Hkv, self.slots, d), self.dtype)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        held = min(self._seen, self.slots)
        ring = np.arange(self._seen - held, self._seen) % max(self.slots, 1)  # [held], oldest first
        K = np.concatenate([self.k[:, ring], k_new], axis=1)  # [Hkv, held + T, d]
        V = np.concatenate([self.v[:, ring], v_new], axis=1)
        # only now, after K and V are assembled, may the new block overwrite old slots
        keep = min(T, self.slots)
        if keep:
            dest = np.arange(self._seen + T - keep, self._seen + T) % self.slots
            self.k[:, dest] = k_new[:, T - keep :]
            self.v[:, dest] = v_new[:, T - keep :]
        self._seen += T
        return K, V

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


def _float_dtype(dtype):
    """-> a numpy floating dtype; a cache of integers would truncate every key."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype such as np.float32; got dtype={dtype!r}") from None
    if dt.kind != "f":
        raise TypeError(f"dtype must be a floating dtype (float16, float32, float64); got dtype={dt}")
    return dt
