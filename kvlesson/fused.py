"""A named optimization of the forward pass: fuse the projections that read the same input.

Q, K and V all multiply the same normed activations, and so do the SwiGLU gate and up matrices. Laid side by
side once at load time, they make two matrix products per layer where kvlesson.model.forward makes five:

    Wqkv     [D, (H + 2 Hkv) d]   = [Wq | Wk | Wv]
    Wgateup  [D, 2 hidden]        = [Wgate | Wup]

At batch 1 a decode step is a stream of matrix-vector products, bound by memory bandwidth; fewer, larger
products stream closer to the bandwidth (measured in scripts/bench.py) and cost fewer Python-level calls.
Queries and keys sit at the same positions, so they are rotated in one call too. The arithmetic is the same:
each output column is the same dot product, so results agree with the plain forward pass up to float32
summation order. Everything after that is kvlesson.layer.attend, the second half of the step the lessons teach.
"""
import numpy as np

from kvlesson.cache import rules
from kvlesson.layer import attend
from kvlesson.model import rms_norm, silu
from kvlesson.rope import apply_rope


def fuse(cfg, w):
    """The plain weights -> a dict with blk.{i}.attn_qkv.weight and blk.{i}.ffn_gate_up.weight in place of the five.

    The fused matrices are C-contiguous [in, out] (rows of the input dimension), the order a matrix-vector product
    streams fastest for wide matrices on OpenBLAS (scripts/bench.py times both orders).
    """
    fw = {name: a for name, a in w.items() if not _fused_away(name)}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        fw[b + "attn_qkv.weight"] = np.ascontiguousarray(
            np.concatenate([w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"]], axis=1))
        fw[b + "ffn_gate_up.weight"] = np.ascontiguousarray(
            np.concatenate([w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"]], axis=1))
    return fw


def forward(cfg, fw, ids, caches):
    """[T] token ids -> [T, vocab] logits, like kvlesson.model.forward, with fused weights from fuse()."""
    H, Hkv, d, hidden = cfg.H, cfg.Hkv, cfg.d, cfg.hidden
    x = fw["token_embd.weight"][np.asarray(ids, dtype=np.int64)]  # [T, D]
    T = x.shape[0]
    positions = np.arange(len(caches[0]), len(caches[0]) + T)  # absolute, the same in every layer
    for i, cache in enumerate(caches):
        b = f"blk.{i}."
        h = rms_norm(x, fw[b + "attn_norm.weight"], cfg.norm_eps)
        qkv = h @ fw[b + "attn_qkv.weight"]  # [T, (H + 2 Hkv) d]: one product instead of three
        qk = qkv[:, : (H + Hkv) * d].reshape(T, H + Hkv, d).transpose(1, 0, 2)  # [H + Hkv, T, d]
        qk = apply_rope(qk, positions, cfg.rope_base, interleaved=cfg.rope_interleaved)  # one rotation for both
        v = qkv[:, (H + Hkv) * d :].reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
        a = attend(qk[:H], qk[H:], v, cache, window=rules(cache)[0])  # [T, H*d], rotated already
        x = x + a @ fw[b + "attn_output.weight"]
        h = rms_norm(x, fw[b + "ffn_norm.weight"], cfg.norm_eps)
        gu = h @ fw[b + "ffn_gate_up.weight"]  # [T, 2 hidden]: one product instead of two
        x = x + (silu(gu[:, :hidden]) * gu[:, hidden:]) @ fw[b + "ffn_down.weight"]
    x = rms_norm(x, fw["output_norm.weight"], cfg.norm_eps)
    return x @ fw["output.weight"]  # [T, vocab]


def _fused_away(name):
    return name.rsplit(".", 2)[-2] in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
