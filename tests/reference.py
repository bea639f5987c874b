"""A deliberately simple reference: one full pass, a loop over heads, queries and keys.

It shares no code with kvlesson: its own RoPE, its own softmax, no masks at all. A key is
used or skipped by comparing absolute positions, one pair at a time.
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
