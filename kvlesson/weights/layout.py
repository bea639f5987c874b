"""The weights as the forward pass multiplies them: every matrix [in, out], so each projection is x @ W; and fused.

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


def fuse(cfg, w):
    """The plain weights -> a dict with blk.{i}.attn_qkv.weight and blk.{i}.ffn_gate_up.weight in place of the five.

    Q, K and V all multiply the same normed activations, and so do the SwiGLU gate and up matrices. Laid side by side
    once, they make two matrix products per layer where the plain weights make five:

        Wqkv     [D, (H + 2 Hkv) d]   = [Wq | Wk | Wv]
        Wgateup  [D, 2 hidden]        = [Wgate | Wup]

    At batch 1 a decode step is a stream of matrix-vector products, bound by memory bandwidth; fewer, larger products
    stream closer to it (scripts/bench.py measures both) and cost fewer calls. Each output column is the same dot
    product, so the logits agree with the plain weights' up to float32 summation order. kvlesson.model.qkv and
    swiglu read whichever form a layer has. The fused matrices are C-contiguous [in, out], the order a wide
    matrix-vector product streams fastest on OpenBLAS; they cost a copy (about 280 MB for SmolLM2).
    """
    fw = {name: a for name, a in w.items() if name.rsplit(".", 2)[-2] not in _FUSED_AWAY}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        fw[b + "attn_qkv.weight"] = np.ascontiguousarray(
            np.concatenate([w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"]], axis=1))
        fw[b + "ffn_gate_up.weight"] = np.ascontiguousarray(
            np.concatenate([w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"]], axis=1))
    return fw


def is_fused(w):
    """True when the layers' projections are fused (by fuse)."""
    return "blk.0.attn_qkv.weight" in w


_FUSED_AWAY = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
