"""Scaled dot-product attention (sdpa) with the offset causal mask and grouped KV heads."""
import math

import numpy as np


def causal_mask(T, S, window=None):
    """(T, S) -> bool [T, S]: True where query i may see key j.

    Query i sits at absolute position S - T + i, so it sees every key j <= S - T + i.
    A window of W also drops keys W or more positions behind: j > S - T + i - W.
    """
    if T < 0 or S < 0 or T > S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got window={window}")
    pos_q = np.arange(S - T, S)[:, None]  # [T, 1] absolute positions of the queries
    pos_k = np.arange(S)[None, :]  # [1, S]
    mask = pos_k <= pos_q  # [T, S]
    if window is not None:
        mask &= pos_k > pos_q - window
    return mask


def attention(q, k, v, *, window=None):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], in the dtype of q.

    Query head h reads KV head h // G. Rather than copying every KV head G times
    (np.repeat(k, G, axis=0)), the G query heads of a group are stacked into one
    matrix of G*T rows, so a single batched matmul per KV head does the work.
    """
    _check_shapes(q, k, v, window)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv
    if T == 0:
        return np.zeros_like(q)
    qg = q.reshape(Hkv, G * T, d)  # heads h = g*G .. g*G+G-1 share KV head g
    s = qg @ k.transpose(0, 2, 1)  # [Hkv, G*T, S]
    s *= 1 / math.sqrt(d)  # a Python float is weak under NumPy 2: float32 stays float32
    s = s.reshape(Hkv, G, T, S)
    if T > 1 or window is not None:  # one query at S - 1 sees every key anyway
        s = np.where(causal_mask(T, S, window), s, -np.inf)
    # subtract the row max so exp never overflows; every row keeps its own key, so the max is finite
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    out = p.reshape(Hkv, G * T, S) @ v  # [Hkv, G*T, d]
    return out.reshape(H, T, d)


def _check_shapes(q, k, v, window):
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"need q [H, T, d] and k, v [Hkv, S, d]; got q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
    (H, T, d), (Hkv, S, dk) = q.shape, k.shape
    if d != dk:
        raise ValueError(f"head dims differ: q {q.shape} has d={d}, k {k.shape} has d={dk}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"H={H} query heads must be a multiple of Hkv={Hkv} KV heads (q {q.shape}, k {k.shape})")
    if T > S:
        raise ValueError(f"more queries than keys: T={T} > S={S} (q {q.shape}, k {k.shape})")
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got window={window}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
