"""Attention without the score matrix: the online softmax (FlashAttention's forward pass) and split-KV decode.

Both equal `kvlesson.attention` and take the same arguments; neither ever holds the scores of more than one block
(or one split) of keys at a time.

The running state of a query row, after it has seen some of its keys:
    m   the largest score so far                          [..., R, 1]   (-inf before any key)
    l   sum of exp(score - m) over those keys             [..., R, 1]
    o   sum of exp(score - m) * value over those keys     [..., R, d]   (not yet divided by l)
When a new block raises the max from m to m', everything summed so far was scaled by exp(-m) where exp(-m') is now
due, so l and o are both multiplied by alpha = exp(m - m') before the block is added. At the end, out = o / l.

Split-KV decode (flash-decoding) cuts the keys into splits that need not see each other: each returns its own
normalised output and the log-sum-exp of its scores, lse = m + log(l), and `merge_partials` weighs each split by
its share of the total, exp(lse_i - lse).
"""
import math

import numpy as np

from kvlesson import validate
from kvlesson.sdpa import _checked

__all__ = ["online_attention", "split_kv_attention", "online_update", "merge_partials"]


def online_attention(q, k, v, *, block=128, window=None):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], walking the keys `block` at a time.

    Same semantics as kvlesson.attention (query i at position S - T + i, GQA by sharing KV heads, T = 0 gives an
    empty result, the output has the input dtype). Sums run in float32 at least: float16 inputs are upcast one
    block at a time. Blocks that no query's window reaches are never scored.
    """
    q, k, v, window = _checked(q, k, v, window)
    block = validate.integer("block", block, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    if T == 0:
        return np.zeros_like(q)
    qg, acc = _grouped_queries(q, Hkv)  # [Hkv, G*T, d], scaled by 1/sqrt(d)
    m, l, o = _empty_state(qg.shape[:-1], d, acc)
    first = 0 if window is None else max(0, S - T + 1 - window)  # the oldest key any query still sees
    for start in range(first, S, block):
        stop = min(start + block, S)
        s = _scores(qg, k[:, start:stop], acc, H // Hkv, T, S, start, window)  # [Hkv, G*T, <= block]
        m, l, o = online_update(m, l, o, s, v[:, start:stop].astype(acc, copy=False))
    return (o / l).reshape(H, T, d).astype(q.dtype, copy=False)


def split_kv_attention(q, k, v, *, splits=4, window=None):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], from `splits` independent slices of the keys.

    The keys are cut into `splits` contiguous slices of nearly equal length (some are empty when splits > S).
    Each slice gives a normalised partial output and its log-sum-exp, with no reference to the others, so a GPU
    can run them side by side; `merge_partials` then combines them exactly. Same semantics as kvlesson.attention.
    """
    q, k, v, window = _checked(q, k, v, window)
    splits = validate.integer("splits", splits, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    if T == 0:
        return np.zeros_like(q)
    qg, acc = _grouped_queries(q, Hkv)
    bounds = [S * i // splits for i in range(splits + 1)]
    outs, lses = [], []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        if stop == start:  # an empty slice has nothing to say; it would merge with weight 0 anyway
            continue
        s = _scores(qg, k[:, start:stop], acc, H // Hkv, T, S, start, window)  # [Hkv, G*T, stop - start]
        m, l, o = online_update(*_empty_state(qg.shape[:-1], d, acc), s, v[:, start:stop].astype(acc, copy=False))
        seen = l > 0  # rows that see no key of this slice (causal or window) get lse = -inf, weight 0
        outs.append(np.where(seen, o / np.where(seen, l, 1), 0))  # [Hkv, G*T, d]
        lses.append(np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)[..., 0])  # [Hkv, G*T]
    return merge_partials(np.stack(outs), np.stack(lses)).reshape(H, T, d).astype(q.dtype, copy=False)


def online_update(m, l, o, s, v):
    """One block of keys into the running state: (m, l, o), s [..., R, b], v [..., b, d] -> (m, l, o).

    m, l [..., R, 1] and o [..., R, d] as in the module docstring; masked scores are -inf. A row that has still
    seen no key keeps m = -inf, l = 0, o = 0.
    """
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isneginf(m_new), 0, m_new)  # exp(-inf - -inf) would be nan; exp(-inf - 0) is 0
    alpha = np.exp(m - shift)  # rescales what was summed under the old max; 1 when the max did not move
    p = np.exp(s - shift)  # [..., R, b], the only score-sized array
    return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + p @ v


def merge_partials(outs, lses):
    """[n, ..., R, d], [n, ..., R] -> [..., R, d]: the softmax over all n slices' keys at once.

    outs[i] is slice i's output, normalised over its own keys; lses[i] the log-sum-exp of its scores (-inf for
    a slice that saw no key). Slice i holds the share exp(lses[i] - lse) of the total weight, lse = log sum exp
    over the slices; shifting by the largest lse first keeps every exp at most 1.
    """
    top = lses.max(axis=0)  # [..., R]; finite because every row sees some key
    w = np.exp(lses - top)[..., None]  # [n, ..., R, 1]
    return (w * outs).sum(axis=0) / w.sum(axis=0)


def _grouped_queries(q, Hkv):
    """-> q as [Hkv, G*T, d] scaled by 1/sqrt(d), in the accumulation dtype (float32 at least), and that dtype."""
    H, T, d = q.shape
    acc = np.result_type(q.dtype, np.float32)
    qg = q.reshape(Hkv, H // Hkv * T, d).astype(acc)  # query heads g*G .. g*G+G-1 share KV head g
    qg *= 1 / math.sqrt(d)  # a Python float: float32 stays float32
    return qg, acc


def _empty_state(rows, d, acc):
    return np.full((*rows, 1), -np.inf, acc), np.zeros((*rows, 1), acc), np.zeros((*rows, d), acc)


def _scores(qg, k, acc, G, T, S, start, window):
    """Scores of all queries against keys start .. start + b - 1, masked with -inf: [Hkv, G*T, b]."""
    Hkv, b, _ = k.shape
    s = qg @ k.astype(acc, copy=False).transpose(0, 2, 1)  # [Hkv, G*T, b]
    pos_q = np.arange(S - T, S)[:, None]  # [T, 1]
    pos_k = np.arange(start, start + b)[None, :]  # [1, b]
    visible = pos_k <= pos_q  # [T, b]
    if window is not None:
        visible &= pos_k > pos_q - window
    if not visible.all():
        s = np.where(visible, s.reshape(Hkv, G, T, b), -np.inf).reshape(Hkv, G * T, b)
    return s
