"""The weights as the forward pass multiplies them: every matrix [in, out], so each projection is x @ W.

The shape is fixed; the memory order is chosen for the matrix-vector product of a decode step, which
OpenBLAS streams faster in one order than the other (scripts/bench.py times both orders per shape):
  - narrow matrices (out < in: K, V, ffn_down) stay as the file's contiguous rows, seen transposed;
  - square and wide ones (Q, attn_output, ffn_gate, ffn_up) are copied once into contiguous [in, out];
  - the tied output layer is the token table transposed once into [D, vocab], and token_embd.weight
    becomes a [vocab, D] view of that same memory, so the table is stored once.
"""
import numpy as np


def matmul_weights(stored):
    """{name: [out, in] as in the file} -> {name: [in, out]} for x @ W, as kvlesson.model expects."""
    w = {}
    for name, a in stored.items():
        if a.ndim != 2 or name == "token_embd.weight":
            w[name] = a
        else:
            n_out, n_in = a.shape
            w[name] = np.ascontiguousarray(a.T) if n_out >= n_in else a.T
    if "output.weight" not in w:  # tied embeddings: the file stores one table for both ends
        w["output.weight"] = np.ascontiguousarray(w["token_embd.weight"].T)  # [D, vocab]
        w["token_embd.weight"] = w["output.weight"].T  # [vocab, D], no copy
    return w


def is_tied(w):
    """True when the output layer and the token table share memory (stored once)."""
    return np.shares_memory(w["token_embd.weight"], w["output.weight"])
