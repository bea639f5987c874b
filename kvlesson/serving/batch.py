"""Continuous batching on a paged KV pool: running sequences decode together, one matrix product per weight per step.

    engine = Engine(cfg, w, n_blocks=256, block_size=16, max_batch=8)
    r = engine.submit(prompt_ids, max_new_tokens=20)
    while not engine.done:
        engine.step()                  # -> [(request, new token), ...]
    engine.results[r]                  # what kvlesson.model.generate(cfg, w, prompt_ids, 20) gives

One PagedKVCache holds the whole model's cache (model_pool): its KV heads are all layers' KV heads, so one block
holds block_size positions of every layer, and one block table and one reservation per step serve all layers, as in
vLLM, where a block table belongs to a sequence, not to a layer.

One step:
  1. admit waiting requests, first come first served, while the batch has room and the pool has every block the
     request will ever need (so nothing has to be evicted later), and prefill them together (prefill_step): their
     prompts side by side, unpadded, one matrix product per weight; each takes its first token from its last logits;
  2. decode all running sequences at once (decode_step): their newest tokens form one [B, D] matrix that meets
     each weight once; each sequence's query and key are rotated at its own position, its key and value go into
     its own blocks, and its query attends over its own pages only;
  3. retire the sequences that have all their tokens: their blocks go back to the pool for the next request.
"""
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvlesson import validate
from kvlesson.model import rms_norm, silu
from kvlesson.rope import apply_rope
from kvlesson.sdpa import attention
from kvlesson.serving.padding import batched_attention
from kvlesson.serving.paged import PagedKVCache


def model_pool(cfg, n_blocks, block_size=16, dtype=np.float32):
    """One PagedKVCache for a whole model. Its KV heads are every layer's (layer i owns heads i*Hkv to i*Hkv + Hkv - 1),
    so a block holds block_size positions of K and V for all layers, and one block table serves them all."""
    return PagedKVCache(n_blocks, block_size, cfg.n_layers * cfg.Hkv, cfg.d, dtype)


@dataclass(frozen=True)
class Placement:
    """Where one step's new tokens go and what each sequence reads: worked out once per step, used by every layer."""

    blocks: np.ndarray  # [N] the block of each new token, all sequences' new tokens side by side
    slots: np.ndarray  # [N] and its slot there
    tables: np.ndarray  # [B, n] the sequences' block tables, padded with block 0
    lengths: np.ndarray  # [B] positions each sequence holds, its new ones included


def place(pool, seqs, counts):
    """Reserve counts[b] more positions for sequence seqs[b], for all layers at once -> Placement."""
    where = [pool.reserve(s, T) for s, T in zip(seqs, counts, strict=True)]
    tables, lengths = pool.block_tables(seqs)
    return Placement(np.concatenate([b for b, _ in where]), np.concatenate([s for _, s in where]), tables, lengths)


def decode_step(cfg, w, pool, seqs, tokens):
    """[B] newest token of each sequence -> float32 [B, vocab] logits, one position appended to each sequence.

    kvlesson.model.forward with B rows that belong to B different sequences: only the attention differs.
    """
    at = place(pool, seqs, [1] * len(seqs))  # one more position for every sequence, in every layer
    x = w["token_embd.weight"][np.asarray(tokens, dtype=np.int64)]  # [B, D]
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        h = rms_norm(x, w[b + "attn_norm.weight"], cfg.norm_eps)
        a = paged_step(h, w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"], pool, i, at,
                       cfg.H, cfg.Hkv, rope_base=cfg.rope_base, interleaved=cfg.rope_interleaved)  # [B, H*d]
        x = x + a @ w[b + "attn_output.weight"]
        h = rms_norm(x, w[b + "ffn_norm.weight"], cfg.norm_eps)
        x = x + (silu(h @ w[b + "ffn_gate.weight"]) * (h @ w[b + "ffn_up.weight"])) @ w[b + "ffn_down.weight"]
    x = rms_norm(x, w["output_norm.weight"], cfg.norm_eps)
    return x @ w["output.weight"]  # [B, vocab]


def paged_step(h, Wq, Wk, Wv, pool, layer, at, H, Hkv, *, rope_base=None, interleaved=False):
    """[B, D], one new token for each sequence -> [B, H*d]. Lesson 03's step, for B sequences at once.

    The weights see one [B, D] matrix. Everything after the projections is per sequence: the position (its own
    length), the slot its key goes into (its own table), the keys it attends over (its own pages).
    """
    B, d = h.shape[0], pool.d
    heads = slice(layer * Hkv, (layer + 1) * Hkv)  # this layer's KV heads in the pool
    q = (h @ Wq).reshape(B, H, d).transpose(1, 0, 2)  # [H, B, d]: sequence b's one query sits in the T slot
    k = (h @ Wk).reshape(B, Hkv, d).transpose(1, 0, 2)  # [Hkv, B, d]
    v = (h @ Wv).reshape(B, Hkv, d).transpose(1, 0, 2)
    if rope_base is not None:
        positions = at.lengths - 1  # [B]: each sequence's own position for its new token
        q = apply_rope(q, positions, rope_base, interleaved=interleaved)
        k = apply_rope(k, positions, rope_base, interleaved=interleaved)
    pool.k[heads, at.blocks, at.slots] = k  # [Hkv, B, d] into B (block, slot) places
    pool.v[heads, at.blocks, at.slots] = v
    K, V = gather_pages(pool, heads, at.tables)  # [B, Hkv, S, d]
    mask = (np.arange(K.shape[2]) < at.lengths[:, None])[:, None, :]  # [B, 1, S]: each sequence's own keys only
    out = batched_attention(q.transpose(1, 0, 2)[:, :, None], K, V, mask)  # [B, H, 1, d]
    return out.reshape(B, H * d)


def gather_pages(pool, heads, tables):
    """[B, n] block tables -> K, V [B, Hkv, n * block_size, d]: each sequence's pages, for these KV heads.

    A right-padded batch: shorter sequences are followed by whole blocks of padding (block 0, whatever it holds),
    which the caller masks by length. A kernel such as vLLM's reads the blocks where they lie; numpy has to copy
    them into one array first. np.take writes [Hkv, B, n, block_size, d] in C order (pool.k[:, tables] would not).
    """
    k, v = pool.k[heads], pool.v[heads]  # [Hkv, n_blocks, block_size, d] views
    shape = (k.shape[0], tables.shape[0], tables.shape[1] * pool.block_size, pool.d)
    K = np.take(k, tables, axis=1).reshape(shape).swapaxes(0, 1)  # a view, [B, Hkv, S, d]
    V = np.take(v, tables, axis=1).reshape(shape).swapaxes(0, 1)
    return K, V


def prefill_step(cfg, w, pool, seqs, prompts):
    """Prompts of different lengths, one per sequence -> float32 [len(seqs), vocab], each prompt's last logits.

    No padding: the N tokens of all prompts sit side by side in one [N, D] matrix that meets each weight once; each
    token is rotated at its own sequence's position, and each prompt attends over its own pages only, with lesson
    04's offset mask (a sequence may already hold positions: then the prompt is a chunk after them). Only the last
    token of each prompt needs logits, so the [N, vocab] product is never made.
    """
    counts = [len(p) for p in prompts]
    before = [pool.length(s) for s in seqs]  # positions each sequence already holds
    at = place(pool, seqs, counts)
    positions = np.concatenate([np.arange(L, L + T) for L, T in zip(before, counts, strict=True)])  # [N]
    ends = np.cumsum(counts)  # where each prompt ends in the side-by-side row
    x = w["token_embd.weight"][np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])]  # [N, D]
    N, H, Hkv, d = x.shape[0], cfg.H, cfg.Hkv, cfg.d
    for i in range(cfg.n_layers):
        b, heads = f"blk.{i}.", slice(i * Hkv, (i + 1) * Hkv)
        h = rms_norm(x, w[b + "attn_norm.weight"], cfg.norm_eps)
        q = (h @ w[b + "attn_q.weight"]).reshape(N, H, d).transpose(1, 0, 2)  # [H, N, d]
        k = (h @ w[b + "attn_k.weight"]).reshape(N, Hkv, d).transpose(1, 0, 2)  # [Hkv, N, d]
        v = (h @ w[b + "attn_v.weight"]).reshape(N, Hkv, d).transpose(1, 0, 2)
        if cfg.rope_base is not None:
            q = apply_rope(q, positions, cfg.rope_base, interleaved=cfg.rope_interleaved)
            k = apply_rope(k, positions, cfg.rope_base, interleaved=cfg.rope_interleaved)
        pool.k[heads, at.blocks, at.slots] = k
        pool.v[heads, at.blocks, at.slots] = v
        K, V = gather_pages(pool, heads, at.tables)  # [B, Hkv, S, d]
        a = np.concatenate([attention(q[:, e - T:e], K[j, :, :L], V[j, :, :L]).transpose(1, 0, 2).reshape(T, H * d)
                            for j, (T, e, L) in enumerate(zip(counts, ends, at.lengths, strict=True))])  # [N, H*d]
        x = x + a @ w[b + "attn_output.weight"]
        h = rms_norm(x, w[b + "ffn_norm.weight"], cfg.norm_eps)
        x = x + (silu(h @ w[b + "ffn_gate.weight"]) * (h @ w[b + "ffn_up.weight"])) @ w[b + "ffn_down.weight"]
    x = rms_norm(x[ends - 1], w["output_norm.weight"], cfg.norm_eps)  # [B, D]: each prompt's last token
    return x @ w["output.weight"]  # [B, vocab]


@dataclass
class Request:
    id: int
    prompt: list
    max_new_tokens: int
    tokens: list = field(default_factory=list)  # generated so far
    seq: int | None = None  # its sequence id in the pool, once admitted


class Engine:
    """A continuous-batching scheduler over one paged pool for the whole model (greedy decoding, float32 default)."""

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
        ids = [validate.integer("token id", i) for i in ids]
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
    engine = Engine(cfg, w, n_blocks=n_blocks, block_size=per_block, max_batch=max_batch)
    ids = [engine.submit(p, n) for p, n in zip(prompts, counts, strict=True)]
    while not engine.done:
        engine.step()
    return [engine.results[i] for i in ids]
