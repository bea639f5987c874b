"""The KV cache protocol, written down once, and three caches that follow it.

A cache needs only three things for `kvlesson.step` to take it (a class of your own in lesson 03 has just these):

    Hkv, d                           its KV heads and head dim
    append(k_new, v_new) -> (K, V)   k_new, v_new [Hkv, T, d]; K, V [Hkv, S, d], oldest first: the keys and values
                                     the T new queries attend over, the new ones last
    len(cache)                       tokens seen so far: the absolute position of the next token

`Cache` below is the base class of every kvlesson cache. It adds the optional parts, each with the meaning a cache
without it has, so that nothing has to be probed for:

    dtype                            the floating dtype it holds: step refuses anything else
    nbytes                           bytes it holds
    window                           W when its keys are a sliding window (None: a query sees every earlier key)
    capacity                         positions it can hold (None: it grows)
    positions(T)                     the absolute positions of the next T tokens, what RoPE turns them by
                                     (len(cache) .. len(cache) + T - 1; a tree of drafts puts node i at its depth)
    mask(T)                          None when the T newest queries see their keys by the offset causal mask (with the
                                     window), else bool [T, S] over the keys the append of those T tokens handed back;
                                     it answers for the cache as it stands, so it depends on len(cache), not on calls
    truncate(n)                      keep the first n positions, as if the rest had never been appended (speculative
                                     decoding rolls a cache back this way); ValueError, naming how far back it can go,
                                     when a cache cannot
    checkpoint()                     -> restore(): a function that puts the cache back exactly as it is now, after
                                     appends or truncates meanwhile (a forward pass cut short by Ctrl-C is undone this
                                     way, kvlesson.atomic)
    observe(q)                       q [H, T, d]: the next append's queries, rotated, handed over just before it;
                                     ignored unless the cache evicts by attention (kvlesson.shrink.evict)

A rejected append or truncate raises ValueError (or TypeError) and leaves the cache exactly as it was.
"""
import copy
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from kvlesson import validate

__all__ = ["CacheLike", "Cache", "KVCache", "StaticKVCache", "WindowKVCache", "rules", "checkpoint", "float_dtype"]


@runtime_checkable
class CacheLike(Protocol):
    """The required part of the protocol: what step needs of any cache, a learner's own class included."""

    Hkv: int
    d: int

    def __len__(self) -> int: ...

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class Cache:
    """The base class of kvlesson's caches: the protocol's optional parts and their defaults, and the checks an append
    makes before any state moves. A subclass sets self._seen in the one place its position advances."""

    window = None
    capacity = None
    # What an append does to the arrays already held, which decides what checkpoint() must keep:
    #   "writes anywhere"   may overwrite held positions (a ring buffer): keep a copy of the whole state;
    #   "new arrays"        builds new arrays and never writes into the old ones: keep references to them;
    #   "writes past end"   writes only past len(cache), and truncate only moves the length: keep the length.
    appends = "writes anywhere"

    def __init__(self, Hkv: int, d: int, dtype: np.dtype):
        self.Hkv, self.d = validate.integer("Hkv", Hkv, minimum=1), validate.integer("d", d, minimum=1)
        self.dtype = float_dtype(dtype)
        self._seen = 0  # the one place the position advances

    def __len__(self) -> int:
        return self._seen

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def positions(self, T: int) -> np.ndarray:
        """-> int [T]: the absolute positions the next T tokens sit at, one after another from len(self)."""
        return np.arange(len(self), len(self) + T)

    def mask(self, T: int) -> np.ndarray | None:
        """None: the T newest queries see the keys handed back by the offset causal mask (and the window)."""
        return None

    def observe(self, q: np.ndarray) -> None:
        """q [H, T, d]: the next append's queries, rotated where attention will use them, handed over just before it.
        Most caches have no use for them; one that evicts by attention (kvlesson.shrink.evict) scores its keys."""

    def truncate(self, n: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot roll back")

    def checkpoint(self) -> Callable[[], None]:
        """-> restore(): puts the cache back exactly as it is now, after appends or truncates in between (a forward
        pass cut short, a rollback that another layer's cache refused). It keeps what `appends` says an append can
        change: a copy of everything (cheap for the small caches that write anywhere, a window's ring), the references
        to the arrays, or only the length."""
        if self.appends == "writes past end":
            n = self._seen
            return lambda: setattr(self, "_seen", n)
        saved = dict(vars(self)) if self.appends == "new arrays" else copy.deepcopy(vars(self))

        def restore():
            vars(self).clear()
            vars(self).update(saved)
        return restore

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

    def _check_truncate(self, n, oldest=0):
        """-> n, checked: a position between `oldest` (the furthest back this cache can roll) and len(self)."""
        n = validate.integer("n", n)
        if n > self._seen:
            raise ValueError(f"truncate(n={n}): the cache holds only {self._seen} positions")
        if n < oldest:
            raise ValueError(f"truncate(n={n}): this {type(self).__name__} can roll back only to position {oldest} "
                             f"({self._seen - oldest} of its {self._seen} positions)")
        return n


def checkpoint(cache: CacheLike) -> Callable[[], None]:
    """-> restore() for any cache: its own checkpoint(), or for a class of your own with only the required parts,
    truncate back to its length when it has truncate (else nothing can be put back, and the next forward pass refuses
    layer caches that disagree on their length)."""
    if hasattr(cache, "checkpoint"):
        return cache.checkpoint()
    n = len(cache)
    return lambda: cache.truncate(n) if hasattr(cache, "truncate") and len(cache) > n else None


def rules(cache: CacheLike) -> tuple[int | None, int | None, np.dtype | None]:
    """-> (window, capacity, dtype) of any cache, with the protocol's defaults for a class that has only the required
    parts. The one place kvlesson reads a cache's optional attributes."""
    if isinstance(cache, Cache):
        return cache.window, cache.capacity, cache.dtype
    return getattr(cache, "window", None), getattr(cache, "capacity", None), getattr(cache, "dtype", None)


class KVCache(Cache):
    """Grows by concatenation: simple, but every append copies the whole cache (quadratic in copies)."""

    appends = "new arrays"

    def __init__(self, Hkv: int, d: int, dtype: np.dtype = np.float64):
        super().__init__(Hkv, d, dtype)
        self.k = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, S, d]
        self.v = np.zeros((Hkv, 0, d), self.dtype)

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k_new, v_new, T = self._check(k_new, v_new)
        if T:
            self.k = np.concatenate([self.k, k_new], axis=1)
            self.v = np.concatenate([self.v, v_new], axis=1)
            self._seen += T
        return self.k, self.v

    def truncate(self, n: int) -> None:
        n = self._check_truncate(n)
        self.k, self.v, self._seen = self.k[:, :n].copy(), self.v[:, :n].copy(), n

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class StaticKVCache(Cache):
    """Preallocates `capacity` positions and writes each new block in place (no copies of the past)."""

    appends = "writes past end"

    def __init__(self, Hkv: int, d: int, capacity: int, dtype: np.dtype = np.float64):
        super().__init__(Hkv, d, dtype)
        self.capacity = validate.integer("capacity", capacity)
        self.k = np.zeros((Hkv, capacity, d), self.dtype)  # [Hkv, capacity, d]
        self.v = np.zeros((Hkv, capacity, d), self.dtype)

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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

    def truncate(self, n: int) -> None:
        self._seen = self._check_truncate(n)  # the positions past n are overwritten by the next append

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class WindowKVCache(Cache):
    """A ring buffer for a sliding window of W keys.

    With a window of W, the oldest key the next query can see is W - 1 positions back, so between steps the cache
    needs only the last W - 1 positions. During a step of T new tokens it hands back the last W - 1 + T, because the
    first new query still needs the W - 1 keys before it. `slack` more slots keep that many older positions too: they
    are never attended over, but they let truncate roll the cache back by up to `slack` positions (a ring of exactly
    W - 1 slots has already overwritten what a rollback would need). Absolute position p lives in slot p % slots.
    """

    def __init__(self, Hkv: int, d: int, window: int, dtype: np.dtype = np.float64, *, slack: int = 0):
        super().__init__(Hkv, d, dtype)
        self.window = validate.integer("window", window, minimum=1)
        self.slack = validate.integer("slack", slack)
        self.slots = window - 1 + self.slack
        self.k = np.zeros((Hkv, self.slots, d), self.dtype)  # [Hkv, W - 1 + slack, d], ring order
        self.v = np.zeros((Hkv, self.slots, d), self.dtype)
        self._oldest = 0  # the furthest back truncate may go: positions before it have been overwritten

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k_new, v_new, T = self._check(k_new, v_new)
        held = min(self._seen, self.window - 1)  # only the last W - 1 are attended over
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
        if self._seen > self.slots:  # position seen - slots - 1 was just overwritten, and a query at p needs p - W + 1
            self._oldest = max(self._oldest, self._seen - self.slack)
        return K, V

    def truncate(self, n: int) -> None:
        self._seen = self._check_truncate(n, self._oldest)
        # the slots of positions n .. are stale, and positions n - slots .. n - 1 are all still in the ring

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def float_dtype(dtype: np.dtype) -> np.dtype:
    """-> a numpy floating dtype; a cache of integers would truncate every key."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype such as np.float32; got dtype={dtype!r}") from None
    if dt.kind != "f":
        raise TypeError(f"dtype must be a floating dtype (float16, float32, float64); got dtype={dt}")
    return dt
