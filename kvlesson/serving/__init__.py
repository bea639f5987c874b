"""Many sequences at once, one job a module, the arrows running one way (server -> loop -> engine -> forward ->
paged, trace -> engine, batch -> forward):
    paged     PagedKVCache: one pool of fixed-size blocks shared by many sequences, its block tables, prefix caching
    forward   one forward pass for any mix of sequences on one pool (run), and its paged attention
    padding   lesson 09's padded batches: pad masks and per-sequence positions
    batch     lesson 09's continuous batching (Batcher, generate_batch)
    engine    lesson 13's scheduler (Engine): admission on current need, chunked prefill, preemption, prefix caching
    trace     measuring an engine on a trace of requests (poisson_arrivals, chat_trace, replay)
  lesson 16, the edge where the engine meets its users (these need the `serve` extra: starlette, uvicorn, jinja2,
  llguidance, each imported where it is used):
    grammar     constrained output: a grammar's mask of allowed tokens, and the tokens it forces (llguidance)
    stream      text out of tokens for a client: whole characters only, stop strings cut
    loop        the engine stepped by one thread; requests join and leave between steps (EngineLoop)
    openai_api  OpenAI's request fields, checked by name, its error object, its response and event bodies
    server      the OpenAI-compatible HTTP server (Server; python -m kvlesson.serving.server)
"""
from kvlesson.serving.engine import Engine

__all__ = ["Engine"]
