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

Where things live. The core is what the lessons build, at the top; sub-packages do one job each, and import only
the core and the leaves (validate, configs, text), never each other upwards; nothing outside teaching/ imports it.
  the core
    sdpa           causal_mask, attention: the offset mask, GQA by reshaping, a stable softmax
    cache          KVCache, StaticKVCache, WindowKVCache: one protocol (append, len, nbytes)
    rope           rotary embeddings at absolute positions, both pairings, scaled ladders
    online         attention block by block: the online softmax (FlashAttention), split-KV (flash-decoding)
    layer          step: project only the new tokens, rotate, cache, attend
    model          the Llama-style forward pass (a tiny random model, or SmolLM2's weights)
    sample         one sampler for every path: greedy, temperature, top-k, top-p, min-p, a seed per request
    llama          SmolLM2-135M: Model (forward, generate, generate_batch) and load()
  the leaves
    validate       argument checks shared by everything
    atomic         all or nothing: a call cut short (Ctrl-C) leaves every cache and pool as it was
    configs        Config (the one configuration type), published models and accelerators
    text           the long text that ships with the package
  weights/         fetch (the file, once, verified), gguf_file, tokenizer, layout (x @ W, fused), f32cache
  serving/         paged (PagedKVCache), forward (one pass for any mix of sequences), padding (padded batches),
                   batch (continuous batching), engine (the scheduler), trace (replaying requests), and lesson 16's
                   edge: loop (the engine in a thread), stream (text and stop strings), grammar (constrained
                   output), openai_api (the request and response bodies), server (the OpenAI-compatible server)
  shrink/          quant (integer codes), sinks (attention sinks), mla (a latent cache), precision (16-bit floats)
  costs/           memory (bytes), flops, roofline, perplexity (the ruler), tolerance (float32 drift)
  parallel/        many processes through MPI: launch, tensor (parallelism by heads), ring (ring attention), disagg
  teaching/        verdict, checks (the exercises' checkers), widgets (explorers), drill (lesson 12), syllabus,
                   student (student copies), workbook (a learner's own copies), course (an nbgrader course)
"""
from kvlesson import speculative
from kvlesson.cache import KVCache, StaticKVCache, WindowKVCache
from kvlesson.layer import step
from kvlesson.online import online_attention, split_kv_attention
from kvlesson.rope import apply_rope
from kvlesson.sdpa import attention, causal_mask, tree_mask
from kvlesson.serving.engine import Engine
from kvlesson.serving.paged import PagedKVCache
from kvlesson.shrink.quant import QuantizedKVCache
from kvlesson.shrink.sinks import SinkKVCache

__all__ = [
    "attention",
    "causal_mask",
    "tree_mask",
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
    "Engine",
    "speculative",
]
