"""One attention layer over a cache: project only the new tokens, rotate, cache, attend."""
import numpy as np

from kvlesson.rope import apply_rope
from kvlesson.sdpa import attention


def step(x, Wq, Wk, Wv, cache, H, Hkv, *, window=None, rope_base=None, interleaved=False):
    """[T, D] new tokens -> [T, H*d]. Works for prefill, chunked prefill and decode alike.

    Wq [D, H*d], Wk and Wv [D, Hkv*d]. With rope_base, q and k are rotated at their absolute
    positions len(cache) + i, before the keys are cached. A WindowKVCache brings its own window.
    """
    d = _check(x, Wq, Wk, Wv, cache, H, Hkv)
    window = _window(cache, window)
    T = x.shape[0]
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)  # [H, T, d]
    k = (x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
    v = (x @ Wv).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
    if rope_base is not None:
        positions = np.arange(len(cache), len(cache) + T)  # absolute: S - T + i after the append
        q = apply_rope(q, positions, rope_base, interleaved=interleaved)
        k = apply_rope(k, positions, rope_base, interleaved=interleaved)
    K, V = cache.append(k, v)  # [Hkv, S, d]
    return attention(q, K, V, window=window).transpose(1, 0, 2).reshape(T, H * d)


def _check(x, Wq, Wk, Wv, cache, H, Hkv):
    if x.ndim != 2:
        raise ValueError(f"x must be [T, D]; got {x.shape}")
    if H < 1 or Hkv < 1 or H % Hkv:
        raise ValueError(f"H={H} query heads must be a positive multiple of Hkv={Hkv} KV heads")
    D = x.shape[1]
    if Wq.ndim != 2 or Wq.shape[0] != D or Wq.shape[1] % H:
        raise ValueError(f"Wq must be [D={D}, H*d] with H={H}; got {Wq.shape}")
    d = Wq.shape[1] // H
    for name, W in (("Wk", Wk), ("Wv", Wv)):
        if W.shape != (D, Hkv * d):
            raise ValueError(f"{name} must be [D, Hkv*d] = ({D}, {Hkv * d}) to match Wq {Wq.shape}; got {W.shape}")
    if (cache.Hkv, cache.d) != (Hkv, d):
        raise ValueError(f"cache holds Hkv={cache.Hkv}, d={cache.d}; this layer has Hkv={Hkv}, d={d}")
    return d


def _window(cache, window):
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got window={window}")
    own = getattr(cache, "window", None)
    if own is not None and window is not None and window != own:
        raise ValueError(f"step(window={window}) disagrees with the cache's window={own}")
    return own if window is None else window
