"""Attention without the score matrix: the online softmax (FlashAttention's forward pass), split-KV decode, and the
backward pass that recomputes the weights from the log-sum-exp.

Both forward functions equal `kvlesson.attention` and take the same arguments; neither ever holds the scores of more
than one block (or one split) of keys at a time.

The running state of a query row, after it has seen some of its keys (Milakov & Gimelshein's online normaliser,
arXiv 1805.02867, carried with the output as FlashAttention does, arXiv 2205.14135):
    m   the largest score so far                          [..., R, 1]   (-inf before any key)
    l   sum of exp(score - m) over those keys             [..., R, 1]
    o   sum of exp(score - m) * value over those keys     [..., R, d]   (not yet divided by l: FlashAttention-2)
When a new block raises the max from m to m', everything summed so far was scaled by exp(-m) where exp(-m') is now
due, so l and o are both multiplied by alpha = exp(m - m') before the block is added. `finish` turns the state into
the output o / l and the log-sum-exp of every score the row saw, lse = m + log(l).

Split-KV decode (flash-decoding) cuts the keys into splits that need not see each other: each is finished into its
own normalised output and lse, and `merge_partials` weighs each split by its share of the total, exp(lse_i - lse).
A row that saw no key at all has output 0 and lse -inf: that pair is the merge's identity, so it changes nothing it
is merged with, and a tree of merges may put it anywhere. A NaN is never mistaken for it: a row whose query, or a key
it sees, holds NaN carries NaN through every step to its output, as kvlesson.attention gives it.

The backward pass needs no stored weights: with the lse of each row, exp(score - lse) is the softmax weight itself,
so `attention_backward` recomputes the weights one block of keys at a time, as FlashAttention's backward does.
"""
import math

import numpy as np

from kvlesson import validate
from kvlesson.sdpa import weighted_values

__all__ = ["online_attention", "split_kv_attention", "partial_attention", "empty_state", "online_update", "finish",
           "merge_partials", "attention_backward"]


def online_attention(q, k, v, *, block=128, window=None, return_lse=False):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], walking the keys `block` at a time.

    Same semantics as kvlesson.attention (query i at position S - T + i, GQA by sharing KV heads, T = 0 gives an
    empty result, the output has the input dtype, NaN and inf give what they give there). Sums run in float32 at
    least: float16 inputs are upcast one block at a time. Blocks that no query's window reaches are never scored,
    and a masked key adds nothing, not even the nan or inf its value may hold. return_lse=True also returns each
    row's log-sum-exp [H, T] (in the accumulation dtype), what the backward pass needs.
    """
    q, k, v, window = validate.attention_inputs(q, k, v, window)
    block = validate.integer("block", block, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    qg, acc = _grouped_queries(q, Hkv)  # [Hkv, G*T, d], scaled by 1/sqrt(d)
    m, l, o = empty_state(qg.shape[:-1], d, acc)
    first = 0 if window is None else max(0, S - T + 1 - window)  # the oldest key any query still sees
    pos_q = _queries(T, S)
    for start in range(first, S if T else 0, block):
        stop = min(start + block, S)
        pos_k = np.arange(start, stop)
        s = _scores(qg, k[:, start:stop], acc, H // Hkv, pos_q, pos_k, window)  # [Hkv, G*T, <= block]
        vb, seen = _values(v[:, start:stop], pos_q, pos_k, acc, window)
        m, l, o = online_update(m, l, o, s, vb, visible=seen)
    out, lse = _every_row_saw_its_own_key(*finish(m, l, o))
    out = out.reshape(H, T, d).astype(q.dtype, copy=False)
    return (out, lse.reshape(H, T)) if return_lse else out


def split_kv_attention(q, k, v, *, splits=4, window=None):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], from `splits` independent slices of the keys.

    The keys are cut into `splits` contiguous slices of nearly equal length (some are empty when splits > S).
    Each slice gives a normalised partial output and its log-sum-exp, with no reference to the others, so a GPU
    can run them side by side; `merge_partials` then combines them exactly. Same semantics as kvlesson.attention.
    """
    q, k, v, window = validate.attention_inputs(q, k, v, window)
    splits = validate.integer("splits", splits, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    if T == 0:
        return np.zeros_like(q)
    qg, acc = _grouped_queries(q, Hkv)
    pos_q = _queries(T, S)
    bounds = [S * i // splits for i in range(splits + 1)]
    outs, lses = [], []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        if stop == start:  # an empty slice has nothing to say; it would merge as the identity anyway
            continue
        pos_k = np.arange(start, stop)
        s = _scores(qg, k[:, start:stop], acc, H // Hkv, pos_q, pos_k, window)  # [Hkv, G*T, stop - start]
        vb, seen = _values(v[:, start:stop], pos_q, pos_k, acc, window)
        out, lse = finish(*online_update(*empty_state(qg.shape[:-1], d, acc), s, vb, visible=seen))
        outs.append(out)  # [Hkv, G*T, d]; 0 for a row the slice's keys are all hidden from (causal or window)
        lses.append(lse)  # [Hkv, G*T]; -inf there, so it weighs nothing in the merge
    out, _ = _every_row_saw_its_own_key(*merge_partials(np.stack(outs), np.stack(lses)))
    return out.reshape(H, T, d).astype(q.dtype, copy=False)


def partial_attention(q, k, v, pos_q, pos_k, *, window=None):
    """Queries at positions pos_q [T] over keys at positions pos_k [S] -> (out [H, T, d], lse [H, T]), a partial
    result that merge_partials combines with the partials of the other keys.

    q [H, T, d], k and v [Hkv, S, d]; the positions are absolute, where each query and key sits in the whole text,
    and need be neither contiguous nor in order: a block of a cache sharded over devices (kvlesson.parallel.ring).
    Key j is visible to query i when pos_k[j] <= pos_q[i] (and pos_k[j] > pos_q[i] - window): lesson 04's offset
    mask, computed from positions rather than from T and S. A row that sees no key here gets out 0 and lse -inf,
    the merge's identity. Sums in float32 at least; out has the input dtype, lse the accumulation dtype.
    """
    q, k, v, window = validate.attention_inputs(q, k, v, window, offset=False)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    pos_q, pos_k = _positions("pos_q", pos_q, T), _positions("pos_k", pos_k, S)
    qg, acc = _grouped_queries(q, Hkv)  # [Hkv, G*T, d], scaled
    s = _scores(qg, k, acc, H // Hkv, pos_q, pos_k, window)  # [Hkv, G*T, S], -inf where hidden
    vb, seen = _values(v, pos_q, pos_k, acc, window)
    out, lse = finish(*online_update(*empty_state(qg.shape[:-1], d, acc), s, vb, visible=seen))
    return out.reshape(H, T, d).astype(q.dtype, copy=False), lse.reshape(H, T)


def _positions(name, pos, n):
    """-> int64 [n]: one absolute position per query or key, each a true integer at least 0."""
    pos = np.asarray(pos)
    if pos.shape != (n,) or (n and pos.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be {n} integer positions, one per row; got {pos.dtype} {pos.shape}")
    if n and pos.min() < 0:
        raise ValueError(f"{name} must be positions of the text, at least 0; got {pos.min()}")
    return pos.astype(np.int64, copy=False)


def online_update(m, l, o, s, v, *, visible=None):
    """One block of keys into the running state: (m, l, o), s [..., R, b], v [..., b, d] -> (m, l, o).

    m, l [..., R, 1] and o [..., R, d] as in the module docstring; masked scores are -inf. A row that has still
    seen no key keeps m = -inf, l = 0, o = 0, and a masked key's value never reaches o, even if it is nan or inf.
    visible: bool, the keys each row may see, as kvlesson.sdpa.weighted_values takes it (None: those whose score is
    above -inf); it matters only for a value that holds inf or nan, which a seen key of weight 0 turns into
    0 * inf = nan, as attention does. A nan score makes the row's m, l and o nan, and they stay nan.
    """
    with np.errstate(invalid="ignore"):  # inf - inf and 0 * inf: a nan or inf input gives nan, as in attention
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isneginf(m_new), 0, m_new)  # exp(-inf - -inf) would be nan; exp(-inf - 0) is 0
        alpha = np.exp(m - shift)  # rescales what was summed under the old max; 1 when the max did not move
        p = np.exp(s - shift)  # [..., R, b], the only score-sized array
        if visible is None and not np.isfinite(v).all():
            visible = ~np.isneginf(s)
        pv = weighted_values(p, v, visible)  # [..., R, d]
        return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + pv


def finish(m, l, o):
    """The state after the last block -> (out [..., R, d], lse [..., R]): o / l, and the log-sum-exp of every score
    the row saw, log sum_j exp(s_j) = m + log(l). A row that saw no key gives out 0 and lse -inf; a nan row stays
    nan (nan is not 0, so it is never taken for a row that saw nothing)."""
    empty = l == 0  # [..., R, 1]
    safe = np.where(empty, 1, l)
    out = o / safe  # o itself where empty: 0, or the nan of a seen value 0 * inf
    lse = np.where(empty, -np.inf, m + np.log(safe))[..., 0]
    return out.astype(o.dtype, copy=False), lse.astype(m.dtype, copy=False)


def merge_partials(outs, lses):
    """[n, ..., R, d], [n, ..., R] -> (out [..., R, d], lse [..., R]): the n slices as if they were one.

    outs[i] is slice i's output, normalised over its own keys; lses[i] the log-sum-exp of its scores (-inf for a
    slice that saw no key). Slice i holds the share exp(lses[i] - lse) of the total weight, lse = log sum exp over
    the slices; shifting by the largest lse first keeps every exp at most 1. The merged (out, lse) is itself a
    slice: merging it again with others gives what one merge of all of them gives. A row that no slice saw comes
    out 0 with lse -inf.
    """
    top = lses.max(axis=0)  # [..., R]; nan where a slice is nan
    empty = np.isneginf(top)  # no slice saw a key of this row
    shift = np.where(empty, 0, top)
    with np.errstate(invalid="ignore"):  # a nan slice makes its rows nan
        w = np.exp(lses - shift)[..., None]  # [n, ..., R, 1], each at most 1; 0 for a slice the row did not see
        total = w.sum(axis=0)  # [..., R, 1], at least 1 where a slice saw a key
        out = (w * outs).sum(axis=0) / np.where(empty[..., None], 1, total)
        lse = np.where(empty, -np.inf, shift + np.log(np.where(empty, 1, total[..., 0])))
    return out.astype(outs.dtype, copy=False), lse.astype(lses.dtype, copy=False)


def _every_row_saw_its_own_key(out, lse):
    """(out [..., R, d], lse [..., R]) of attention, where every query sees at least its own key -> the same, with nan
    for a row whose lse is -inf: every score it saw was -inf, and softmax over them is 0 / 0, as attention gives."""
    return np.where(np.isneginf(lse)[..., None], np.nan, out).astype(out.dtype, copy=False), lse


def attention_backward(q, k, v, out, lse, d_out, *, block=128, window=None):
    """Gradients of online_attention: -> (dq [H, T, d], dk, dv [Hkv, S, d]), from out [H, T, d], lse [H, T] (its
    return_lse) and d_out [H, T, d], the gradient of the loss with respect to out.

    Nothing [T, S] is stored or built: each block of keys has its weights recomputed as exp(score - lse), then
        dv += p^T d_out,   dp = d_out v^T,   ds = p * (dp - D),   dq += ds k / sqrt(d),   dk += ds^T q / sqrt(d),
    where D = rowsum(d_out * out) equals rowsum(p * dp) over all the keys, so no block needs another block's p.
    float32 in, float32 out (sums in float32 at least, as in the forward pass).
    """
    q, k, v, window = validate.attention_inputs(q, k, v, window)
    block = validate.integer("block", block, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv
    out, d_out = validate.floats("out", out), validate.floats("d_out", d_out)
    lse = validate.floats("lse", lse)
    if out.shape != q.shape or d_out.shape != q.shape or lse.shape != (H, T):
        raise ValueError(f"need out and d_out like q {q.shape} and lse [H, T] = {(H, T)}; got out {out.shape}, "
                         f"d_out {d_out.shape}, lse {lse.shape}")
    qg, acc = _grouped_queries(q, Hkv)  # [Hkv, G*T, d], scaled
    do = d_out.reshape(Hkv, G * T, d).astype(acc)  # [Hkv, G*T, d]
    L = lse.reshape(Hkv, G * T, 1).astype(acc)
    D = (do * out.reshape(Hkv, G * T, d).astype(acc)).sum(axis=-1, keepdims=True)  # [Hkv, G*T, 1]
    dqg = np.zeros_like(qg)
    dk, dv = np.zeros((Hkv, S, d), acc), np.zeros((Hkv, S, d), acc)
    for start in range(0, S if T else 0, block):
        stop = min(start + block, S)
        s = _scores(qg, k[:, start:stop], acc, G, _queries(T, S), np.arange(start, stop), window)  # masked -inf
        p = np.exp(s - L)  # the softmax weights themselves: exp(s - lse) needs no max and no sum
        kb, vb = k[:, start:stop].astype(acc, copy=False), v[:, start:stop].astype(acc, copy=False)
        dv[:, start:stop] = p.transpose(0, 2, 1) @ do
        ds = p * (do @ vb.transpose(0, 2, 1) - D)  # [Hkv, G*T, b]
        dqg += ds @ kb
        dk[:, start:stop] = ds.transpose(0, 2, 1) @ qg  # qg already carries 1 / sqrt(d)
    dq = (dqg * (1 / math.sqrt(d))).reshape(H, T, d)
    return dq.astype(q.dtype, copy=False), dk.astype(k.dtype, copy=False), dv.astype(v.dtype, copy=False)


def _grouped_queries(q, Hkv):
    """-> q as [Hkv, G*T, d] scaled by 1/sqrt(d), in the accumulation dtype (float32 at least), and that dtype."""
    H, T, d = q.shape
    acc = np.result_type(q.dtype, np.float32)
    qg = q.reshape(Hkv, H // Hkv * T, d).astype(acc)  # query heads g*G .. g*G+G-1 share KV head g
    qg *= 1 / math.sqrt(d)  # a Python float: float32 stays float32
    return qg, acc


def empty_state(rows, d, acc):
    """-> (m, l, o) of rows that have seen no key yet: -inf, 0 and zeros [*rows, d], in dtype acc."""
    return np.full((*rows, 1), -np.inf, acc), np.zeros((*rows, 1), acc), np.zeros((*rows, d), acc)


def _queries(T, S):
    """[T] the positions of T queries that end S keys: S - T + i."""
    return np.arange(S - T, S)


def _scores(qg, k, acc, G, pos_q, pos_k, window):
    """Scores of the queries at positions pos_q [T] against the keys k [Hkv, b, d] at positions pos_k [b], masked
    with -inf where a key sits after the query (or a window or more behind it): [Hkv, G*T, b]."""
    Hkv, b, _ = k.shape
    T = len(pos_q)
    with np.errstate(invalid="ignore"):  # inf * 0 in a product: nan, as attention has it
        s = qg @ k.astype(acc, copy=False).transpose(0, 2, 1)  # [Hkv, G*T, b]
    visible = _visible(pos_q, pos_k, window)
    if not visible.all():
        s = np.where(visible, s.reshape(Hkv, G, T, b), -np.inf).reshape(Hkv, G * T, b)
    return s


def _visible(pos_q, pos_k, window):
    """-> bool [T, b]: which of the keys at positions pos_k [b] each query at pos_q [T] sees (lesson 04's rule)."""
    pos_q, pos_k = pos_q[:, None], pos_k[None, :]  # [T, 1], [1, b]
    visible = pos_k <= pos_q  # [T, b]
    if window is not None:
        visible &= pos_k > pos_q - window
    return visible


def _values(v, pos_q, pos_k, acc, window):
    """-> (v [Hkv, b, d] in dtype acc, and which keys each query sees, bool [T, b]): that matters only to a value
    holding inf or nan, so for finite values it is None (and holds no memory)."""
    v = v.astype(acc, copy=False)
    return v, None if np.isfinite(v).all() else _visible(pos_q, pos_k, window)
