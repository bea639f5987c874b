"""Scaled dot-product attention (sdpa) with the offset causal mask and grouped KV heads."""
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from kvlesson import validate


def causal_mask(T: int, S: int, window: int | None = None) -> np.ndarray:
    """(T, S) -> bool [T, S]: True where query i may see key j.

    Query i sits at absolute position S - T + i, so it sees every key j <= S - T + i.
    A window of W also drops keys W or more positions behind: j > S - T + i - W.
    """
    T, S, window = validate.integer("T", T), validate.integer("S", S), validate.window(window)
    if T > S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    pos_q = np.arange(S - T, S)[:, None]  # [T, 1] absolute positions of the queries
    pos_k = np.arange(S)[None, :]  # [1, S]
    mask = pos_k <= pos_q  # [T, S]
    if window is not None:
        mask &= pos_k > pos_q - window
    return mask


def tree_mask(parents: Sequence[int], S: int) -> np.ndarray:
    """parents: T ints, parents[i] < i or -1 (a child of the last cached token) -> bool [T, S + T].

    Node i of a tree of T new tokens (speculative decoding's drafts, lesson 14) sees every one of the S cached keys
    and, among the new ones, itself and its ancestors: a branch never sees its siblings. It sits at position
    S + depth(i) (`tree_depths`), not S + i. A chain, parents = [-1, 0, 1, ...], gives lesson 04's offset mask.
    """
    S = validate.integer("S", S)
    parents = validate.parents(parents)
    T = len(parents)
    ancestors = np.eye(T, dtype=bool)  # [T, T]: row i, the nodes on the path from the root to i
    for i, p in enumerate(parents):
        if p >= 0:
            ancestors[i] |= ancestors[p]  # p < i, so its row is complete
    return np.concatenate([np.ones((T, S), bool), ancestors], axis=1)


def tree_depths(parents: Sequence[int]) -> np.ndarray:
    """-> int [T]: each node's depth, 0 for a child of the last cached token; node i sits at position S + depth."""
    parents = validate.parents(parents)
    depth = np.zeros(len(parents), dtype=np.intp)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, window: int | None = None,
              mask: ArrayLike | None = None) -> np.ndarray:
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], in the dtype of q.

    Query i sits at position S - T + i of the keys it is given, and sees key j when j <= S - T + i
    (and j > S - T + i - window). A cache whose rule is not a plain window (sinks, say) passes its own
    bool [T, S] `mask` instead; every row must keep at least one key.

    Query head h reads KV head h // G. Rather than copying every KV head G times
    (np.repeat(k, G, axis=0)), the G query heads of a group are stacked into one
    matrix of G*T rows, so a single batched matmul per KV head does the work.

    Scores and sums are kept in float32 at least (float16's largest value, 65,504, is one score of a long
    context). A key or value a query cannot see never reaches its output, even if it is inf or NaN; a query
    that sees one gets what IEEE arithmetic gives it. Finite inputs whose scores overflow are a ValueError.
    """
    q, k, v, window = validate.attention_inputs(q, k, v, window)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv
    if mask is not None:
        mask = _checked_mask(mask, T, S, window)
    elif T > 1 or window is not None:  # one query at S - 1 sees every key anyway
        mask = causal_mask(T, S, window)
    if T == 0:
        return np.zeros_like(q)
    acc = np.result_type(q.dtype, np.float32)  # float16 in, float32 sums
    with np.errstate(over="ignore", invalid="ignore"):  # an inf or NaN key stays in the rows that see it (below)
        qg = q.reshape(Hkv, G * T, d).astype(acc, copy=False)  # heads h = g*G .. g*G+G-1 share KV head g
        s = qg @ k.astype(acc, copy=False).transpose(0, 2, 1)  # [Hkv, G*T, S]
        s *= 1 / math.sqrt(d)  # a Python float is weak under NumPy 2: float32 stays float32
        p = softmax(s.reshape(Hkv, G, T, S), mask, q, k).reshape(Hkv, G * T, S)
        out = weighted_values(p, v.astype(acc, copy=False), mask)  # [Hkv, G*T, d]
    return out.reshape(H, T, d).astype(q.dtype, copy=False)


def softmax(s: np.ndarray, mask: np.ndarray | None, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Scores s [..., S] (float32 or wider, written over), a bool mask that broadcasts to them or None, and the q and k
    they came from -> p [..., S]: each row's softmax over the keys its mask keeps. Every row must keep one.

    The row max is subtracted first, so exp never overflows; with every row keeping a key, the max is finite unless a
    score itself overflowed, which for finite q and k is a ValueError (inputs that large are out of range)."""
    if mask is not None:
        np.copyto(s, -np.inf, where=np.logical_not(mask))  # in place: a second score array would double the peak memory
    top = s.max(axis=-1, keepdims=True)
    if np.isposinf(top).any() and np.isfinite(q).all() and np.isfinite(k).all():
        raise ValueError(f"attention scores overflow {s.dtype}: some q . k / sqrt(d) is beyond "
                         f"{np.finfo(s.dtype).max:.3g} (inputs this large are out of range; normalise them)")
    s -= top
    p = np.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    return p


def weighted_values(p, v, visible=None):
    """p [..., R, S] @ v [..., S, d] -> [..., R, d], except that a value a row cannot see never touches its output.

    visible: the keys each row sees, bool [T, S] with R = G*T rows (row g*T + i is query i, the layout of grouped
    heads) or anything broadcastable to p; None: every key. A hidden key's weight is 0, but 0 * inf is NaN, so the
    plain product would carry an inf or NaN value to rows that never see it. A row that does see one gets what IEEE
    arithmetic gives it: p * inf, or 0 * inf = NaN for a seen key of weight 0.
    """
    if visible is None or np.isfinite(v).all():
        return p @ v
    bad = ~np.isfinite(v).all(axis=-1)  # [..., S] keys whose value holds an inf or a NaN
    out = p @ np.where(bad[..., None], 0, v)  # [..., R, d]: every row, over the finite values only
    visible = np.asarray(visible)
    if visible.ndim >= 2 and visible.shape[-2] not in (1, p.shape[-2]):  # [T, S] for R = G*T rows
        visible = np.tile(visible, (p.shape[-2] // visible.shape[-2], 1))
    visible = np.broadcast_to(visible, p.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in np.flatnonzero(bad.reshape(-1, bad.shape[-1]).any(axis=0)):  # each poisoned key, added back alone
            sees = visible[..., j, None] & bad[..., j, None, None]  # [..., R, 1] rows that see key j's bad value
            out += np.where(sees, p[..., j, None] * v[..., None, j, :], 0)
    return out


def _checked_mask(mask, T, S, window):
    mask = np.asarray(mask)
    if window is not None:
        raise ValueError(f"pass a window or a mask, not both (window={window})")
    if mask.dtype != bool or mask.shape != (T, S):
        raise ValueError(f"mask must be bool [T={T}, S={S}]; got {mask.dtype} {mask.shape}")
    if T and not mask.any(axis=-1).all():
        raise ValueError("every query must see at least one key; a row of the mask is all False")
    return mask
