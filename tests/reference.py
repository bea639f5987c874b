"""Deliberately simple references: one full pass, a loop over heads, queries and keys.

They share no code with kvlesson: their own RoPE, their own softmax, no mask arrays in the passes. A key is used or
skipped by comparing absolute positions, one pair at a time; a tree's mask is found by walking up its parents.
"""
import math

import numpy as np


def rope_one(vec, pos, base, interleaved):
    """Rotate one head vector [d] by absolute position pos, pair by pair."""
    d = len(vec)
    out = np.array(vec, dtype=np.float64)
    for m in range(d // 2):
        a, b = (2 * m, 2 * m + 1) if interleaved else (m, m + d // 2)
        theta = pos * base ** (-2 * m / d)
        c, s = math.cos(theta), math.sin(theta)
        out[a], out[b] = vec[a] * c - vec[b] * s, vec[a] * s + vec[b] * c
    return out


def full_pass(x, Wq, Wk, Wv, H, Hkv, window=None, rope_base=None, interleaved=False):
    """x [N, D] -> [N, H*d] in float64: every token attends over the keys it may see."""
    x, Wq, Wk, Wv = (np.asarray(a, np.float64) for a in (x, Wq, Wk, Wv))
    N = x.shape[0]
    d = Wq.shape[1] // H
    G = H // Hkv
    out = np.zeros((N, H * d))
    for h in range(H):
        g = h // G  # the KV head this query head reads
        q = x @ Wq[:, h * d:(h + 1) * d]  # [N, d]
        k = x @ Wk[:, g * d:(g + 1) * d]
        v = x @ Wv[:, g * d:(g + 1) * d]
        if rope_base is not None:
            q = np.array([rope_one(q[p], p, rope_base, interleaved) for p in range(N)]).reshape(N, d)
            k = np.array([rope_one(k[p], p, rope_base, interleaved) for p in range(N)]).reshape(N, d)
        for p in range(N):
            seen = [j for j in range(N) if j <= p and (window is None or j > p - window)]
            scores = [float(q[p] @ k[j]) / math.sqrt(d) for j in seen]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            out[p, h * d:(h + 1) * d] = sum(w / total * v[j] for w, j in zip(weights, seen, strict=True))
    return out


def projections(x, Wq, Wk, Wv, H, Hkv, rope_base, interleaved):
    """-> q [H, N, d], k, v [Hkv, N, d] in float64, rotated at positions 0 .. N - 1 (the reference's own RoPE)."""
    x, Wq, Wk, Wv = (np.asarray(a, np.float64) for a in (x, Wq, Wk, Wv))
    N, d = x.shape[0], Wq.shape[1] // H

    def heads(W, n, rotate):
        a = (x @ W).reshape(N, n, d).transpose(1, 0, 2)
        if rotate and rope_base is not None:
            a = np.array([[rope_one(a[h, p], p, rope_base, interleaved) for p in range(N)] for h in range(n)])
        return a.reshape(n, N, d)

    return heads(Wq, H, True), heads(Wk, Hkv, True), heads(Wv, Hkv, False)


def attend_one(q, k, v, seen, G):
    """q [H, d], k, v [Hkv, N, d], seen: positions -> (out [H, d], weights [H, len(seen)]), one head at a time."""
    H, d = q.shape
    out, weights = np.zeros((H, d)), np.zeros((H, len(seen)))
    for h in range(H):
        scores = [float(q[h] @ k[h // G, j]) / math.sqrt(d) for j in seen]
        e = [math.exp(s - max(scores)) for s in scores]
        weights[h] = [w / sum(e) for w in e]
        out[h] = sum(w * v[h // G, j] for w, j in zip(weights[h], seen, strict=True))
    return out, weights


def tree_mask(parents, S):
    """[T, S + T]: node i sees every cached key, and new node m when m is i or an ancestor of i (walk up from i)."""
    T = len(parents)
    mask = np.zeros((T, S + T), bool)
    mask[:, :S] = True
    for i in range(T):
        m = i
        while m >= 0:
            mask[i, S + m] = True
            m = parents[m]
    return mask
