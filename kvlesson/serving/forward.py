"""One forward pass for any mix of sequences on one paged pool: paging is bookkeeping, the model is the same.

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
holds block_size positions of K and V for all layers, and one block table and one reservation per step serve all
layers: a block table belongs to a sequence, not to a layer.

Both engines call `run`: lesson 09's Batcher (kvlesson.serving.batch) and lesson 13's scheduler
(kvlesson.serving.engine). A run happens whole or not at all: if the forward pass is cut short (Ctrl-C, an error),
the blocks it reserved go back and every sequence holds what it held before.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvlesson import model as _model
from kvlesson import validate
from kvlesson.configs import Config
from kvlesson.layer import turn
from kvlesson.sdpa import attention, softmax
from kvlesson.serving.paged import PagedKVCache, read_pages

__all__ = ["model_pool", "Step", "LayerView", "run", "attend", "decode_attention", "decode_step", "prefill_step"]


def model_pool(cfg: Config, n_blocks: int, block_size: int = 16, dtype: np.dtype = np.float32) -> PagedKVCache:
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

    def __init__(self, pool: PagedKVCache, seqs: list[int], counts: list[int]):
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
    def last(self) -> np.ndarray:
        """[B'] the row, among the N, of the last new token of each sequence that brought any: whose logits count."""
        return (self.starts + self.counts - 1)[self.counts > 0]

    def layers(self, n_layers: int) -> list["LayerView"]:
        """One view of the pool per layer: the `caches` a forward pass over this step takes."""
        Hkv = self.pool.Hkv // n_layers
        return [LayerView(self, slice(i * Hkv, (i + 1) * Hkv)) for i in range(n_layers)]


@dataclass(frozen=True)
class LayerView:
    """What one layer's attention needs of a Step: the step, and which of the pool's KV heads are this layer's."""

    step: Step
    heads: slice

    def checkpoint(self) -> Callable[[], None]:
        """The forward pass asks each layer's cache for a way back; the pool's own atomic() (in `run`) is this one's."""
        return lambda: None


def run(cfg: Config, w: dict, pool: PagedKVCache, seqs: list[int], new_ids: list[list[int]]) -> np.ndarray:
    """Sequence seqs[b] brings the token ids new_ids[b] (a list, maybe empty) -> [B', vocab] logits of the last new
    token of each sequence that brought any, in order. One forward pass: one matrix product per weight for all."""
    new_ids = [list(ids) for ids in new_ids]
    ids = [i for chunk in new_ids for i in chunk]
    validate.token_ids("new_ids", ids, cfg.vocab)  # before anything is reserved
    with pool.atomic():
        step = Step(pool, seqs, [len(chunk) for chunk in new_ids])
        return _model.forward(cfg, w, ids, step.layers(cfg.n_layers), attend=attend, rows=step.last)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, view: LayerView, *, rope_base: float | None = None,
           interleaved: bool = False) -> np.ndarray:
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
        Kb, Vb = read_pages(K, V, step.tables[b : b + 1], step.lengths[b])  # [Hkv, 1, L, d]
        out[:, rows] = attention(q[:, rows], Kb[:, 0], Vb[:, 0])  # query i at L - T + i: lesson 04's offset mask
    return out.transpose(1, 0, 2).reshape(N, H * d)


def decode_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray, lengths: np.ndarray
                     ) -> np.ndarray:
    """[H, B, d] one query per sequence, one layer's pool K, V [Hkv, n_blocks, bs, d], tables [B, n], lengths [B]
    -> [H, B, d]: each query over its own sequence's first lengths[b] positions, as kvlesson.attention gives it.

    The pages of all B sequences are gathered into one padded [Hkv, B, S, d] array and every query is scored in one
    call; the padding after each sequence's length is masked, and the softmax is kvlesson.sdpa's, summed in float32
    at least (a float16 pool's scores too). Query head h reads KV head h // G, as in kvlesson.attention.
    """
    H, B, d = q.shape
    Hkv = K.shape[0]
    G, S = H // Hkv, int(lengths.max())
    acc = np.result_type(q.dtype, np.float32)
    Kp, Vp = read_pages(K, V, tables, S)  # [Hkv, B, S, d] each
    qg = q.reshape(Hkv, G, B, d).transpose(0, 2, 1, 3)  # [Hkv, B, G, d]: the G query heads of each KV head
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.matvec(Kp[:, :, None].astype(acc, copy=False), qg.astype(acc, copy=False))  # [Hkv, B, G, S]
        s *= 1 / math.sqrt(d)  # a Python float: float32 stays float32
        p = softmax(s, np.arange(S) < lengths[:, None, None], qg, Kp)  # a [B, 1, S] mask: each its own keys only
        out = np.vecmat(p, Vp[:, :, None].astype(acc, copy=False))  # [Hkv, B, G, d]
    out = out.transpose(0, 2, 1, 3).reshape(H, B, d).astype(q.dtype, copy=False)
    # A padded slot holds whatever its block held before, and 0 * inf is NaN: if a NaN or inf reached a sequence, it
    # is recomputed on its own positions alone, where only a value it sees can reach it (kvlesson.attention's rule).
    for b in np.flatnonzero(~np.isfinite(out).all(axis=(0, 2))):
        L = lengths[b]
        out[:, b : b + 1] = attention(q[:, b : b + 1], Kp[:, b, :L], Vp[:, b, :L])
    return out


def decode_step(cfg: Config, w: dict, pool: PagedKVCache, seqs: list[int], tokens: list[int]) -> np.ndarray:
    """[B] newest token of each sequence -> [B, vocab] logits, one position appended to each sequence."""
    return run(cfg, w, pool, seqs, [[t] for t in tokens])


def prefill_step(cfg: Config, w: dict, pool: PagedKVCache, seqs: list[int], prompts: list[list[int]]) -> np.ndarray:
    """One prompt (or chunk) per sequence -> [B, vocab]: each one's last logits, all in one forward pass. A sequence
    may already hold positions: the chunk then goes on after them, under lesson 04's offset mask."""
    return run(cfg, w, pool, seqs, prompts)
