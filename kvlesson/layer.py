"""One attention layer over a cache: project only the new tokens, rotate, cache, attend.

step is the function lesson 03 builds and every later lesson calls. It checks its arguments, then does two things,
each a function of its own so that the model's forward pass (kvlesson.model) can call them without checking again:
    project(x, Wq, Wk, Wv, H, Hkv) -> q, k, v      the new tokens' queries, keys and values
    attend(q, k, v, cache, ...) -> [T, H*d]        rotate at absolute positions, append to the cache, attend
"""
import numpy as np
from numpy.typing import ArrayLike

from kvlesson import atomic, validate
from kvlesson.cache import Cache, CacheLike, checkpoint, rules
from kvlesson.rope import rotate, rotation
from kvlesson.sdpa import attention


def step(x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, cache: CacheLike, H: int, Hkv: int, *,
         window: int | None = None, rope_base: float | None = None, interleaved: bool = False) -> np.ndarray:
    """[T, D] new tokens -> [T, H*d]. Works for prefill, chunked prefill and decode alike.

    Wq [D, H*d], Wk and Wv [D, Hkv*d]. With rope_base, q and k are rotated at their absolute positions
    len(cache) + i, before the keys are cached. A cache with a window brings its own; a cache whose visibility is
    not the offset mask (its mask(T) is not None) brings that instead.
    """
    # every argument is checked before the cache moves: a rejected step leaves it as it was
    x, Wq, Wk, Wv, H, Hkv, d = _check(x, Wq, Wk, Wv, cache, H, Hkv)
    window = _window(cache, window)
    if rope_base is not None:
        rope_base = validate.positive("rope_base", rope_base)
        if d % 2:
            raise ValueError(f"RoPE needs an even head dim d; got d={d} (x {x.shape}, Wq {Wq.shape}, H={H})")
    q, k, v = project(x, Wq, Wk, Wv, H, Hkv)
    with atomic.undo_on_error(checkpoint(cache)):  # cut short after the append, the cache is put back
        return attend(q, k, v, cache, window=window, rope_base=rope_base, interleaved=interleaved)


def project(x: np.ndarray, Wq: np.ndarray, Wk: np.ndarray, Wv: np.ndarray, H: int, Hkv: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, D] -> q [H, T, d], k and v [Hkv, T, d]: only the new tokens are projected."""
    T = x.shape[0]
    d = Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)  # [H, T, d]
    k = (x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
    v = (x @ Wv).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
    return q, k, v


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: CacheLike, *, window: int | None = None,
           rope_base: float | None = None, interleaved: bool = False) -> np.ndarray:
    """[H, T, d] new queries, [Hkv, T, d] new keys and values -> [T, H*d]: the second half of step.

    Rotates q and k at their absolute positions len(cache) + i (or where the cache says they sit), appends k and v
    to the cache, and attends the new queries over everything the cache hands back, under the cache's own mask when
    it has one.
    """
    H, T, d = q.shape
    if rope_base is not None:
        own = isinstance(cache, Cache)
        positions = cache.positions(T) if own else np.arange(len(cache), len(cache) + T)  # S - T + i, absolute
        q, k = turn(q, k, positions, rope_base, interleaved)
    if isinstance(cache, Cache):
        cache.observe(q)  # a cache that evicts by attention needs the queries before the keys arrive
    K, V = cache.append(k, v)  # [Hkv, S, d]
    mask = cache.mask(T) if isinstance(cache, Cache) else None  # a cache's own rule includes any window it has
    out = attention(q, K, V, window=window if mask is None else None, mask=mask)
    return out.transpose(1, 0, 2).reshape(T, H * d)  # [T, H*d]


def turn(q: np.ndarray, k: np.ndarray, positions: np.ndarray, rope_base: float, interleaved: bool
         ) -> tuple[np.ndarray, np.ndarray]:
    """q [H, T, d] and k [Hkv, T, d] rotated at the same positions, in one pass over both (kvlesson.rope)."""
    H = q.shape[0]
    qk = rotate(np.concatenate([q, k]), *rotation(positions, q.shape[-1], rope_base, q.dtype), interleaved)
    return qk[:H], qk[H:]


def _check(x, Wq, Wk, Wv, cache, H, Hkv):
    x, Wq, Wk, Wv = (validate.floats(n, a) for n, a in (("x", x), ("Wq", Wq), ("Wk", Wk), ("Wv", Wv)))
    H, Hkv = validate.integer("H", H, minimum=1), validate.integer("Hkv", Hkv, minimum=1)
    if x.ndim != 2:
        raise ValueError(f"x must be [T, D]; got {x.shape}")
    if H % Hkv:
        raise ValueError(f"H={H} query heads must be a positive multiple of Hkv={Hkv} KV heads")
    D = x.shape[1]
    if Wq.ndim != 2 or Wq.shape[0] != D or Wq.shape[1] % H:
        raise ValueError(f"Wq must be [D={D}, H*d] with H={H}; got {Wq.shape}")
    d = Wq.shape[1] // H
    for name, W in (("Wk", Wk), ("Wv", Wv)):
        if W.shape != (D, Hkv * d):
            raise ValueError(f"{name} must be [D, Hkv*d] = ({D}, {Hkv * d}) to match Wq {Wq.shape}; got {W.shape}")
    if d == 0:
        raise ValueError(f"the head dim d must be at least 1; got Wq {Wq.shape} with H={H}")
    if not all(hasattr(cache, a) for a in ("append", "Hkv", "d", "__len__")):  # the protocol's required part
        raise TypeError(f"cache must be a KV cache (append, len, Hkv, d); got {type(cache).__name__}")
    if (cache.Hkv, cache.d) != (Hkv, d):
        raise ValueError(f"cache holds Hkv={cache.Hkv}, d={cache.d}; this layer has Hkv={Hkv}, d={d}")
    validate.same_dtype(x=x, Wq=Wq, Wk=Wk, Wv=Wv)
    held = rules(cache)[2] or x.dtype
    if held != x.dtype:
        raise ValueError(f"the cache holds {held} but x and the weights are {x.dtype} (cast explicitly)")
    return x, Wq, Wk, Wv, H, Hkv, d


def _window(cache, window):
    window = validate.window(window)
    own = rules(cache)[0]
    if own is not None and window is not None and window != own:
        raise ValueError(f"step(window={window}) disagrees with the cache's window={own}")
    return own if window is None else window
