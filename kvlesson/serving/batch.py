"""Many sequences in one forward pass on one paged pool: paging is bookkeeping, the model's forward pass is the same.

    pool = model_pool(cfg, n_blocks)               # one PagedKVCache for the whole model
    logits = run(cfg, w, pool, seqs, new_ids)      # sequence seqs[b] brings the tokens new_ids[b] (any number, even 0)

`run` is kvlesson.model.forward with two things swapped in, as in vLLM, where the model runs one forward whatever
the batch and the attention backend reads metadata:
  - the caches: one view of the pool per layer (Step.layers), each naming that layer's KV heads;
  - attend: this module's, which rotates each new token at its own sequence's position, writes its key and value into
    its own sequence's block and slot, and attends each sequence's queries over its own pages only.
All sequences' new tokens sit side by side, unpadded, in one [N, D] matrix that meets each weight once: decodes (one
token each) and prefill chunks (many) alike. Step works out the bookkeeping once, before any layer runs.

One PagedKVCache holds the whole model's cache (model_pool): its KV heads are all layers' KV heads, so one block
holds block_size positions of every layer, and one block table and one reservation per step serve all layers: a
block table belongs to a sequence, not to a layer.

Batcher is lesson 09's continuous batching on top: it admits a request only when the pool holds every block the
request will ever need (worst-case reservation), prefills new requests in a pass of their own, then decodes every
running sequence in another. Lesson 13's scheduler (kvlesson.serving.Engine) admits on current need instead, and
mixes prefill chunks with decodes in one pass.
"""
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvlesson import model as _model
from kvlesson import validate
from kvlesson.layer import turn
from kvlesson.sdpa import attention
from kvlesson.serving.paged import PagedKVCache


def model_pool(cfg, n_blocks, block_size=16, dtype=np.float32):
    """One PagedKVCache for a whole model. Its KV heads are every layer's (layer i owns heads i*Hkv to i*Hkv + Hkv - 1),
    so a block holds block_size positions of K and V for all layers, and one block table serves them all."""
    return PagedKVCache(n_blocks, block_size, cfg.n_layers * cfg.Hkv, cfg.d, dtype)


class Step:
    """One forward pass over sequences of one model-wide pool, sequence seqs[b] bringing counts[b] >= 0 new tokens.

    Made before any layer runs: it checks the request, reserves every block the pass needs (or refuses with
    ValueError, changing nothing), and records what every layer's attention reads:
        positions [N]       each new token's position in its own sequence: what RoPE turns it by
        blocks, slots [N]   where its key and value go in the pool
        tables [B, n]       each sequence's block table, padded with block 0 (never read: lengths say where it ends)
        lengths [B]         positions each sequence holds once the step has written
        counts [B]          its new tokens; starts [B] where they begin among the N
    """

    def __init__(self, pool, seqs, counts):
        seqs = [validate.integer("seq", s) for s in seqs]
        counts = [validate.integer("count", T) for T in counts]
        if len(seqs) != len(counts) or len(set(seqs)) != len(seqs):
            raise ValueError(f"need one count per sequence and each sequence once; got seqs {seqs}, counts {counts}")
        need = sum(pool.needed(s, T) for s, T in zip(seqs, counts, strict=True))  # also checks every id is live
        if need > pool.blocks_free:
            raise ValueError(f"out of blocks: this step needs {need} more for {sum(counts)} new tokens of "
                             f"{len(seqs)} sequences, and {pool.blocks_free} of {pool.n_blocks} are free")
        before = [pool.length(s) for s in seqs]
        where = [pool.reserve(s, T) for s, T in zip(seqs, counts, strict=True)]  # room is checked: none can fail
        self.pool, self.seqs = pool, seqs
        self.counts = np.array(counts, dtype=np.intp)  # [B]
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.intp)  # [B]
        self.positions = np.concatenate([np.arange(L, L + T) for L, T in zip(before, counts, strict=True)] or
                                        [np.zeros(0, np.intp)])  # [N]
        self.blocks = np.concatenate([b for b, _ in where] or [np.zeros(0, np.intp)])  # [N]
        self.slots = np.concatenate([s for _, s in where] or [np.zeros(0, np.intp)])  # [N]
        self.tables, self.lengths = pool.block_tables(seqs)  # [B, n], [B]

    @property
    def last(self):
        """[B'] the row, among the N, of the last new token of each sequence that brought any: whose logits count."""
        return (self.starts + self.counts - 1)[self.counts > 0]

    def layers(self, n_layers):
        """One view of the pool per layer: the `caches` a forward pass over this step takes."""
        Hkv = self.pool.Hkv // n_layers
        return [LayerView(self, slice(i * Hkv, (i + 1) * Hkv)) for i in range(n_layers)]


@dataclass(frozen=True)
class LayerView:
    """What one layer's attention needs of a Step: the step, and which of the pool's KV heads are this layer's."""

    step: Step
    heads: slice


def run(cfg, w, pool, seqs, new_ids):
    """Sequence seqs[b] brings the token ids new_ids[b] (a list, maybe empty) -> [B', vocab] logits of the last new
    token of each sequence that brought any, in order. One forward pass: one matrix product per weight for all."""
    new_ids = [list(ids) for ids in new_ids]
    ids = [i for chunk in new_ids for i in chunk]
    validate.token_ids("new_ids", ids, cfg.vocab)  # before anything is reserved
    step = Step(pool, seqs, [len(chunk) for chunk in new_ids])
    return _model.forward(cfg, w, ids, step.layers(cfg.n_layers), attend=attend, rows=step.last)


def attend(q, k, v, view, *, rope_base=None, interleaved=False):
    """[H, N, d] queries, [Hkv, N, d] keys and values: every sequence's new tokens side by side -> [N, H*d].

    kvlesson.layer.attend for a batch: each token is rotated at its own position, its key and value are written
    into its own sequence's block and slot, and each sequence's queries attend over that sequence's pages only.
    """
    step, heads = view.step, view.heads
    H, N, d = q.shape
    if rope_base is not None:
        q, k = turn(q, k, step.positions, rope_base, interleaved)
    K, V = step.pool.k[heads], step.pool.v[heads]  # [Hkv, n_blocks, block_size, d] views of this layer
    K[:, step.blocks, step.slots] = k  # [Hkv, N, d] into N (block, slot) places
    V[:, step.blocks, step.slots] = v
    out = np.empty_like(q)  # [H, N, d]
    one = step.counts == 1  # decodes: one query each, all read together
    if one.any():
        rows = step.starts[one]
        out[:, rows] = decode_attention(q[:, rows], K, V, step.tables[one], step.lengths[one])
    for b in np.flatnonzero(step.counts > 1):  # prefill chunks: many queries over one sequence's pages
        rows = slice(step.starts[b], step.starts[b] + step.counts[b])
        Kb, Vb = pages(K, V, step.tables[b], step.lengths[b])  # [Hkv, L, d]
        out[:, rows] = attention(q[:, rows], Kb, Vb)  # query i at L - T + i: lesson 04's offset mask
    return out.transpose(1, 0, 2).reshape(N, H * d)


def decode_attention(q, K, V, tables, lengths):
    """[H, B, d] one query per sequence, one layer's pool K, V [Hkv, n_blocks, bs, d], tables [B, n], lengths [B]
    -> [H, B, d]: each query over its own sequence's first lengths[b] positions.

    numpy cannot multiply through a block table, so the pages are gathered into [Hkv, B, n * bs, d] first (a GPU
    kernel reads them where they lie); the padding after each sequence's length is masked. Query head h reads KV
    head h // G, as in kvlesson.attention.
    """
    H, B, d = q.shape
    Hkv, _, bs, _ = K.shape
    G = H // Hkv
    S = tables.shape[1] * bs
    Kp = np.take(K, tables, axis=1).reshape(Hkv, B, S, d)  # [Hkv, B, S, d], C order: np.take writes it so
    Vp = np.take(V, tables, axis=1).reshape(Hkv, B, S, d)
    qg = q.reshape(Hkv, G, B, d).transpose(0, 2, 1, 3)  # [Hkv, B, G, d]: the G query heads of each KV head
    s = np.matvec(Kp[:, :, None], qg)  # [Hkv, B, G, S]
    s *= 1 / math.sqrt(d)  # a Python float: float32 stays float32
    s = np.where(np.arange(S) < lengths[:, None, None], s, -np.inf)  # a [B, 1, S] mask: each its own keys only
    s -= s.max(axis=-1, keepdims=True)  # each sequence holds its new key, so every row keeps one
    p = np.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.vecmat(p, Vp[:, :, None])  # [Hkv, B, G, d]
    return out.transpose(0, 2, 1, 3).reshape(H, B, d)


def pages(K, V, table, length):
    """One sequence's keys and values in position order: [Hkv, n_blocks, bs, d] pool views, its table -> [Hkv, L, d]."""
    Hkv, _, bs, d = K.shape
    n = -(-length // bs)  # blocks that hold its positions
    return (np.take(K, table[:n], axis=1).reshape(Hkv, n * bs, d)[:, :length],
            np.take(V, table[:n], axis=1).reshape(Hkv, n * bs, d)[:, :length])


def decode_step(cfg, w, pool, seqs, tokens):
    """[B] newest token of each sequence -> [B, vocab] logits, one position appended to each sequence."""
    return run(cfg, w, pool, seqs, [[t] for t in tokens])


def prefill_step(cfg, w, pool, seqs, prompts):
    """One prompt (or chunk) per sequence -> [B, vocab]: each one's last logits, all in one forward pass. A sequence
    may already hold positions: the chunk then goes on after them, under lesson 04's offset mask."""
    return run(cfg, w, pool, seqs, prompts)


@dataclass
class Request:
    id: int
    prompt: list
    max_new_tokens: int
    tokens: list = field(default_factory=list)  # generated so far
    seq: int | None = None  # its sequence id in the pool, once admitted


class Batcher:
    """Lesson 09's continuous batching over one paged pool for the whole model (greedy, float32 by default)."""

    def __init__(self, cfg, w, *, n_blocks, block_size=16, max_batch=64, dtype=np.float32):
        self.cfg, self.w = cfg, w
        self.max_batch = validate.integer("max_batch", max_batch, minimum=1)
        self.pool = model_pool(cfg, n_blocks, block_size, dtype)
        self.waiting, self.running, self.results = deque(), [], {}
        self._next_id = 0

    def blocks_needed(self, prompt_len, max_new_tokens):
        """Blocks a request holds at its longest: the prompt and every new token but the last, which is returned
        without ever being fed back."""
        return math.ceil((prompt_len + max(max_new_tokens - 1, 0)) / self.pool.block_size)

    def submit(self, ids, max_new_tokens):
        """Queue a prompt (a list of token ids) -> its request id. Its tokens appear in results once it is done."""
        ids = validate.token_ids("ids", ids, self.cfg.vocab).tolist()  # before anything is queued
        n = validate.integer("max_new_tokens", max_new_tokens)
        if not ids:
            raise ValueError("need at least one prompt token to predict the next one")
        if len(ids) + n > self.cfg.max_len:
            raise ValueError(f"{len(ids)} prompt + {n} new tokens exceed the context of {self.cfg.max_len} positions")
        need = self.blocks_needed(len(ids), n)
        if need > self.pool.n_blocks:
            raise ValueError(f"a prompt of {len(ids)} tokens with {n} new ones needs {need} blocks; the pool has "
                             f"{self.pool.n_blocks}")
        r = Request(self._next_id, ids, n)
        self._next_id += 1
        if n == 0:
            self.results[r.id] = []
        else:
            self.waiting.append(r)
        return r.id

    @property
    def done(self):
        return not self.waiting and not self.running

    def step(self):
        """Admit and prefill what fits, decode every running sequence once -> [(request id, new token), ...]."""
        admitted = self._admit()
        if admitted:  # all new prompts in one prefill: one product per weight for all their tokens
            logits = prefill_step(self.cfg, self.w, self.pool, [r.seq for r in admitted], [r.prompt for r in admitted])
            for r, row in zip(admitted, logits, strict=True):
                r.tokens.append(int(np.argmax(row)))
        new = [(r.id, r.tokens[-1]) for r in admitted]
        self._retire()
        if self.running:
            logits = decode_step(self.cfg, self.w, self.pool, [r.seq for r in self.running],
                                 [r.tokens[-1] for r in self.running])
            for r, row in zip(self.running, logits, strict=True):
                r.tokens.append(int(np.argmax(row)))
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


def generate_batch(cfg, w, prompts, max_new_tokens, *, max_batch=64, block_size=16, n_blocks=None):
    """Greedy decoding of many prompts -> one list of new token ids per prompt, as model.generate gives each alone.

    max_new_tokens: one count for all, or one per prompt. n_blocks defaults to enough for every prompt at once;
    give fewer and requests wait for blocks that finished ones return.
    """
    counts = [max_new_tokens] * len(prompts) if np.ndim(max_new_tokens) == 0 else list(max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(counts)} counts for {len(prompts)} prompts")
    per_block = validate.integer("block_size", block_size, minimum=1)
    if n_blocks is None:
        n_blocks = max(1, sum(math.ceil((len(p) + max(validate.integer("max_new_tokens", n), 1) - 1) / per_block)
                              for p, n in zip(prompts, counts, strict=True)))
    engine = Batcher(cfg, w, n_blocks=n_blocks, block_size=per_block, max_batch=max_batch)
    ids = [engine.submit(p, n) for p, n in zip(prompts, counts, strict=True)]
    while not engine.done:
        engine.step()
    return [engine.results[i] for i in ids]
