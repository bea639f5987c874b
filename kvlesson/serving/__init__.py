"""Many sequences at once, one job a module, the arrows running one way (trace -> engine -> forward -> paged,
and batch -> forward):
    paged     PagedKVCache: one pool of fixed-size blocks shared by many sequences, its block tables, prefix caching
    forward   one forward pass for any mix of sequences on one pool (run), and its paged attention
    padding   lesson 09's padded batches: pad masks and per-sequence positions
    batch     lesson 09's continuous batching (Batcher, generate_batch)
    engine    lesson 13's scheduler (Engine): admission on current need, chunked prefill, preemption, prefix caching
    trace     measuring an engine on a trace of requests (poisson_arrivals, chat_trace, replay)
"""
from kvlesson.serving.engine import Engine

__all__ = ["Engine"]
