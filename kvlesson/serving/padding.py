"""Ragged sequences in one rectangular batch: left padding, a mask per sequence, positions per sequence.

B sequences of different lengths are padded on the left to a common T, so that they all end in the same column and
each decode step appends one column for all of them. Two things must then be per sequence:
  - the mask: the offset causal mask of lesson 04 (j <= S - T + i), and also j >= pads[b], so that no real query
    ever reads a pad;
  - the positions RoPE rotates by: column c of sequence b is its token c - pads[b], not c.

    batch [B, T, ...]    pads [B]    mask [B, T, S]    positions [B, T]    K, V [B, Hkv, S, d]

The test of all of it is batch invariance: each sequence in the batch must give what it gives alone, in its outputs
and in the keys and values it leaves in the cache.
"""
import math

import numpy as np

from kvlesson import validate
from kvlesson.rope import apply_rope
from kvlesson.sdpa import causal_mask


def pad_left(seqs, value=0):
    """B arrays [L_b, ...] -> (batch [B, T, ...], pads [B]): T = max L_b, and sequence b starts at column pads[b]."""
    seqs = [np.asarray(s) for s in seqs]
    if not seqs or any(s.ndim == 0 for s in seqs) or len({s.shape[1:] for s in seqs}) > 1:
        raise ValueError(f"need a non-empty list of arrays [L_b, ...] with equal trailing shapes; got "
                         f"{[s.shape for s in seqs]}")
    T = max(len(s) for s in seqs)
    batch = np.full((len(seqs), T, *seqs[0].shape[1:]), value, dtype=np.result_type(*seqs))
    pads = np.array([T - len(s) for s in seqs], dtype=np.int64)
    for row, s, p in zip(batch, seqs, pads, strict=True):
        row[p:] = s
    return batch, pads


def pad_mask(pads, T, S):
    """[B] pads -> bool [B, T, S]: query i of sequence b sees key j when pads[b] <= j <= S - T + i.

    A query that is itself a pad sees only its own key: a row with no key at all would give 0/0 = NaN in the
    softmax, and a NaN does not stay put. The next layer weights that pad's value by 0, and 0 * NaN is NaN.
    """
    T, S = validate.integer("T", T), validate.integer("S", S)
    pads = _pads(pads, S)
    if T > S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    col_q = np.arange(S - T, S)[None, :, None]  # [1, T, 1] the queries' columns
    col_k = np.arange(S)[None, None, :]  # [1, 1, S]
    first = pads[:, None, None]  # [B, 1, 1] each sequence's first real column
    real = causal_mask(T, S)[None] & (col_k >= first)  # [B, T, S]
    return real | ((col_q < first) & (col_k == col_q))


def pad_positions(pads, T, S):
    """[B] pads -> int64 [B, T]: the position RoPE rotates column S - T + i of sequence b by, S - T + i - pads[b].

    Pads themselves get position 0; their outputs are never read.
    """
    T, S = validate.integer("T", T), validate.integer("S", S)
    pads = _pads(pads, S)
    if T > S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    return np.maximum(np.arange(S - T, S)[None, :] - pads[:, None], 0)


def batched_attention(q, k, v, mask):
    """[B, H, T, d], [B, Hkv, S, d], [B, Hkv, S, d], bool [B, T, S] -> [B, H, T, d], in the dtype of q.

    B independent attentions, each under its own mask; every row of the mask must keep at least one key. Query
    head h reads KV head h // G, by the same reshape as kvlesson.attention.
    """
    q, k, v = validate.floats("q", q), validate.floats("k", k), validate.floats("v", v)
    validate.same_dtype(q=q, k=k, v=v)
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] \
            or q.shape[3] == 0 or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"need q [B, H, T, d] and k, v [B, Hkv, S, d] with H % Hkv == 0; got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    (B, H, T, d), (_, Hkv, S, _) = q.shape, k.shape
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape != (B, T, S):
        raise ValueError(f"mask must be bool [B={B}, T={T}, S={S}]; got {mask.dtype} {mask.shape}")
    if T and not mask.any(axis=-1).all():
        raise ValueError("every query must see at least one key; a row of the mask is all False")
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * T, d)  # query heads g*G .. g*G + G - 1 read KV head g
    # one query per head (decode): B * Hkv stacks of G matrix-vector products, which np.matvec runs without the
    # per-matrix cost of np.matmul's loop over B * Hkv small matrices; longer chunks are matrix products
    s = np.matvec(k[:, :, None], qg) if T == 1 else qg @ k.swapaxes(-1, -2)  # [B, Hkv, G*T, S]
    s *= 1 / math.sqrt(d)  # a Python float: float32 stays float32
    s = np.where(mask[:, None, None], s.reshape(B, Hkv, G, T, S), -np.inf)
    s -= s.max(axis=-1, keepdims=True)  # every row keeps a key, so the max is finite
    p = np.exp(s, out=s).reshape(B, Hkv, G * T, S)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.vecmat(p, v[:, :, None]) if T == 1 else p @ v  # [B, Hkv, G*T, d]
    return out.reshape(B, H, T, d)


def padded_step(x, Wq, Wk, Wv, K, V, pads, H, Hkv, *, rope_base=None, interleaved=False):
    """One attention layer over a left-padded batch. x [B, T, D] the new columns; K, V [B, Hkv, S - T, d] the
    columns before them (S - T may be 0) -> (out [B, T, H*d], K, V [B, Hkv, S, d]).

    Projects the new columns only, rotates them at their per-sequence positions, appends them and attends under
    the per-sequence mask: lesson 03's step, with a batch axis in front.
    """
    x, Wq, Wk, Wv, K, V = (validate.floats(n, a) for n, a in (("x", x), ("Wq", Wq), ("Wk", Wk), ("Wv", Wv),
                                                                ("K", K), ("V", V)))
    H, Hkv = validate.integer("H", H, minimum=1), validate.integer("Hkv", Hkv, minimum=1)
    validate.same_dtype(x=x, Wq=Wq, Wk=Wk, Wv=Wv, K=K, V=V)
    if x.ndim != 3 or Wq.ndim != 2 or Wq.shape[0] != x.shape[2] or Wq.shape[1] % H or H % Hkv:
        raise ValueError(f"need x [B, T, D], Wq [D, H*d] and H % Hkv == 0; got x {x.shape}, Wq {Wq.shape}, "
                         f"H={H}, Hkv={Hkv}")
    (B, T, D), d = x.shape, Wq.shape[1] // H
    if Wk.shape != (D, Hkv * d) or Wv.shape != Wk.shape or K.shape != V.shape or K.shape[:2] != (B, Hkv) \
            or K.ndim != 4 or K.shape[3] != d:
        raise ValueError(f"need Wk, Wv [D={D}, Hkv*d={Hkv * d}] and K, V [B={B}, Hkv={Hkv}, S, d={d}]; got "
                         f"Wk {Wk.shape}, Wv {Wv.shape}, K {K.shape}, V {V.shape}")
    S = K.shape[2] + T
    mask = pad_mask(pads, T, S)  # [B, T, S]; also checks the pads
    q = (x @ Wq).reshape(B, T, H, d).transpose(0, 2, 1, 3)  # [B, H, T, d]
    k = (x @ Wk).reshape(B, T, Hkv, d).transpose(0, 2, 1, 3)  # [B, Hkv, T, d]
    v = (x @ Wv).reshape(B, T, Hkv, d).transpose(0, 2, 1, 3)
    if rope_base is not None:
        positions = pad_positions(pads, T, S)  # [B, T]
        q = rope_rows(q, positions, rope_base, interleaved=interleaved)
        k = rope_rows(k, positions, rope_base, interleaved=interleaved)
    K, V = np.concatenate([K, k], axis=2), np.concatenate([V, v], axis=2)  # [B, Hkv, S, d]
    out = batched_attention(q, K, V, mask)  # [B, H, T, d]
    return out.transpose(0, 2, 1, 3).reshape(B, T, H * d), K, V


def rope_rows(x, positions, base, *, interleaved=False):
    """[B, n, T, d], int [B, T] -> [B, n, T, d]: RoPE with a position for each sequence and column.

    apply_rope takes one position per token, so the B x T tokens are laid side by side as one row of B*T.
    """
    B, n, T, d = x.shape
    flat = x.transpose(1, 0, 2, 3).reshape(n, B * T, d)  # [n, B*T, d]
    flat = apply_rope(flat, np.asarray(positions).reshape(B * T), base, interleaved=interleaved)
    return flat.reshape(n, B, T, d).transpose(1, 0, 2, 3)


def _pads(pads, S):
    p = np.asarray(pads)
    if p.dtype.kind not in "iu" or p.ndim != 1:
        raise TypeError(f"pads must be a 1-D array of integers, one per sequence; got {p.dtype} {p.shape}")
    if ((p < 0) | (p >= max(S, 1))).any():
        raise ValueError(f"each sequence needs 0 <= pads < S={S} (at least its last column is real); got {p.tolist()}")
    return p
