"""kvlesson: attention with a KV cache, from scratch, in numpy.

One vocabulary of shapes, used everywhere in the package and the notebooks:

    T    new tokens (queries) in this step
    S    keys visible to them, the new ones included (S >= T)
    H    query heads
    Hkv  KV heads (H % Hkv == 0)
    G    query heads that share one KV head, H // Hkv
    d    head dimension
    D    model width

    q [H, T, d]    k, v [Hkv, S, d]    query i sits at position S - T + i of the keys it is given

For KVCache and StaticKVCache the keys start at the first token, so S - T + i is also the query's absolute
position in the text. A WindowKVCache hands back only the keys still in the window: there S is what it
handed back, and the absolute position is len(cache) - T + i (what RoPE rotates by).

Modules, one idea each:
  part one
    sdpa           causal_mask, attention: the offset mask, GQA by reshaping, a stable softmax
    cache          KVCache, StaticKVCache, WindowKVCache: one protocol (append, len, nbytes)
    rope           rotary embeddings at absolute positions, both pairings, scaled ladders
    layer          step: project only the new tokens, rotate, cache, attend
    model          the Llama-style forward pass (a tiny random model, or SmolLM2's weights); fused: the same,
                   with Q/K/V and gate/up in one product each
    configs        Config (the one configuration type), published models and accelerators
    memory, flops  the price of the cache in bytes, and what it saves in FLOPs
    llama          SmolLM2-135M from its GGUF file: fetch, gguf_file, tokenizer, layout, f32cache
    text, perplexity, tolerance   the shipped text, the ruler, and how far float32 runs may drift
  part two
    paged, padding, batch   many sequences: a paged KV pool, padded batches, continuous batching; roofline
    online, precision       attention block by block (FlashAttention, flash-decoding); bfloat16 and float16
    quant, sinks, mla       shrinking the cache: integer codes, attention sinks, a latent instead of K and V
    drill                   lesson 12's interview drill: configs to price, suspects to convict, a score sheet
  around them
    validate       argument checks shared by everything above
    checks         the exercises' checkers;  widgets  the lessons' interactive pictures
    student        student copies of the lessons (nbgrader's ClearSolutions)
"""
from kvlesson.cache import KVCache, StaticKVCache, WindowKVCache
from kvlesson.layer import step
from kvlesson.online import online_attention, split_kv_attention
from kvlesson.paged import PagedKVCache
from kvlesson.quant import QuantizedKVCache
from kvlesson.rope import apply_rope
from kvlesson.sdpa import attention, causal_mask
from kvlesson.sinks import SinkKVCache

__all__ = [
    "attention",
    "causal_mask",
    "apply_rope",
    "KVCache",
    "StaticKVCache",
    "WindowKVCache",
    "step",
    "online_attention",
    "split_kv_attention",
    "QuantizedKVCache",
    "SinkKVCache",
    "PagedKVCache",
]
