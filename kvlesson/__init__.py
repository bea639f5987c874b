"""kvlesson: attention with a KV cache, from scratch, in numpy.

One vocabulary of shapes, used everywhere in the package and the notebooks:

    T    new tokens (queries) in this step
    S    keys visible to them, the new ones included (S >= T)
    H    query heads
    Hkv  KV heads (H % Hkv == 0)
    G    query heads that share one KV head, H // Hkv
    d    head dimension
    D    model width

    q [H, T, d]    k, v [Hkv, S, d]    query i sits at absolute position S - T + i
"""
from kvlesson.cache import KVCache, StaticKVCache, WindowKVCache
from kvlesson.layer import step
from kvlesson.rope import apply_rope
from kvlesson.sdpa import attention, causal_mask

__all__ = [
    "attention",
    "causal_mask",
    "apply_rope",
    "KVCache",
    "StaticKVCache",
    "WindowKVCache",
    "step",
]
