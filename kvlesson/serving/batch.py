"""Lesson 09's continuous batching: requests join and leave a running batch, on one paged pool for the whole model.

    engine = Batcher(cfg, w, n_blocks=64)        # float32 by default
    rid = engine.submit(ids, 32)                 # greedy unless sampling= says otherwise (kvlesson.sample)
    while not engine.done:
        engine.step()                            # admit and prefill what fits, then decode every running sequence
    engine.results[rid]                          # its 32 new token ids

It admits a request only when the pool holds every block the request will ever need (worst-case reservation),
prefills new requests in a forward pass of their own, then decodes every running sequence in another: each pass is
one call of kvlesson.serving.forward.run. Lesson 13's scheduler (kvlesson.serving.Engine) admits on current need
instead, and mixes prefill chunks with decodes in one pass.
"""
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlesson import atomic, validate
from kvlesson.configs import Config
from kvlesson.sample import GREEDY, Sampling, sample, seeded
from kvlesson.serving.forward import decode_step, model_pool, prefill_step
from kvlesson.serving.paged import request_blocks

__all__ = ["Batcher", "generate_batch"]


@dataclass
class Request:
    id: int
    prompt: list
    max_new_tokens: int
    sampling: Sampling = GREEDY
    tokens: list = field(default_factory=list)  # generated so far
    seq: int | None = None  # its sequence id in the pool, once admitted

    def next_token(self, logits: np.ndarray) -> int:
        """Append the token `logits` [V] give, by the request's own sampling (kvlesson.sample)."""
        self.tokens.append(sample(logits, self.sampling, position=len(self.tokens), history=self.prompt + self.tokens))


class Batcher:
    """Lesson 09's continuous batching over one paged pool for the whole model (float32 by default)."""

    def __init__(self, cfg: Config, w: dict, *, n_blocks: int, block_size: int = 16, max_batch: int = 64,
                 dtype: np.dtype = np.float32):
        self.cfg, self.w = cfg, w
        self.max_batch = validate.integer("max_batch", max_batch, minimum=1)
        self.pool = model_pool(cfg, n_blocks, block_size, dtype)
        self.waiting, self.running, self.results = deque(), [], {}
        self._next_id = 0

    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Blocks a request holds at its longest (kvlesson.serving.paged.request_blocks)."""
        return request_blocks(prompt_len, max_new_tokens, self.pool.block_size)

    def submit(self, ids: list[int], max_new_tokens: int, sampling: Sampling = GREEDY) -> int:
        """Queue a prompt (a list of token ids) -> its request id. Its tokens appear in results once it is done."""
        ids, n = self.check(ids, max_new_tokens)  # before anything is queued
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a kvlesson.sample.Sampling; got {type(sampling).__name__}")
        r = Request(self._next_id, ids, n, seeded(sampling))
        self._next_id += 1
        if n == 0:
            self.results[r.id] = []
        else:
            self.waiting.append(r)
        return r.id

    def check(self, ids: list[int], max_new_tokens: int, name: str = "ids") -> tuple[list[int], int]:
        """-> (ids, n) as submit would queue them; ValueError or TypeError, naming the argument, for a request that
        could never run (too long for the context, or for the whole pool)."""
        ids, n = validate.request(ids, max_new_tokens, self.cfg.vocab, self.cfg.max_len, name=name)
        need = self.blocks_needed(len(ids), n)
        if need > self.pool.n_blocks:
            raise ValueError(f"{name}: a prompt of {len(ids)} tokens with {n} new ones needs {need} blocks; the pool "
                             f"has {self.pool.n_blocks}")
        return ids, n

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def step(self) -> list[tuple[int, int]]:
        """Admit and prefill what fits, decode every running sequence once -> [(request id, new token), ...].
        All or nothing: cut short (Ctrl-C, an error), it leaves the queues, the requests and the pool as they were."""
        undo = atomic.snapshot(self, *self.waiting, *self.running)
        with self.pool.atomic(), atomic.undo_on_error(undo):
            return self._step()

    def _step(self):
        admitted = self._admit()
        if admitted:  # all new prompts in one prefill: one product per weight for all their tokens
            logits = prefill_step(self.cfg, self.w, self.pool, [r.seq for r in admitted], [r.prompt for r in admitted])
            for r, row in zip(admitted, logits, strict=True):
                r.next_token(row)
        new = [(r.id, r.tokens[-1]) for r in admitted]
        self._retire()
        if self.running:
            logits = decode_step(self.cfg, self.w, self.pool, [r.seq for r in self.running],
                                 [r.tokens[-1] for r in self.running])
            for r, row in zip(self.running, logits, strict=True):
                r.next_token(row)
                new.append((r.id, r.tokens[-1]))
            self._retire()
        return new

    def _admit(self):
        pool, admitted = self.pool, []
        promised = sum(self.blocks_needed(len(r.prompt), r.max_new_tokens) - len(pool.block_table(r.seq))
                       for r in self.running)  # blocks the running sequences will still take
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            need = self.blocks_needed(len(r.prompt), r.max_new_tokens)
            if pool.blocks_free - promised < need:
                break  # first come, first served: the head of the queue waits for blocks, nobody jumps it
            self.waiting.popleft()
            r.seq, promised = pool.new_sequence(), promised + need
            self.running.append(r)
            admitted.append(r)
        return admitted

    def _retire(self):
        for r in [r for r in self.running if len(r.tokens) == r.max_new_tokens]:
            self.pool.free(r.seq)
            self.running.remove(r)
            self.results[r.id] = r.tokens


def generate_batch(cfg: Config, w: dict, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                   max_batch: int = 64, block_size: int = 16, n_blocks: int | None = None) -> list[list[int]]:
    """Greedy decoding of many prompts -> one list of new token ids per prompt, as model.generate gives each alone.

    max_new_tokens: one count for all, or one per prompt. n_blocks defaults to enough for every prompt at once;
    give fewer and requests wait for blocks that finished ones return.
    """
    counts = [max_new_tokens] * len(prompts) if np.ndim(max_new_tokens) == 0 else list(max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(counts)} counts for {len(prompts)} prompts")
    per_block = validate.integer("block_size", block_size, minimum=1)
    if n_blocks is None:
        n_blocks = max(1, sum(request_blocks(len(p), validate.integer("max_new_tokens", n), per_block)
                              for p, n in zip(prompts, counts, strict=True)))
    engine = Batcher(cfg, w, n_blocks=n_blocks, block_size=per_block, max_batch=max_batch)
    ids = [engine.submit(p, n) for p, n in zip(prompts, counts, strict=True)]
    while not engine.done:
        engine.step()
    return [engine.results[i] for i in ids]
