"""The drill's suspects: each a classic bug from lessons 03-10, with a correct twin behind the same interface.

Each pair is one implementation with a switch (`top_left=True`, `evict_first=True`, ...), so broken and correct
differ by the bug and nothing else. A Case also names kvlesson's own implementation of the interface where there
is one: a good test passes on it too, which shows the test relies on the interface and not on one implementation.

    Case      what the candidate is told (interface), the three implementations, and what the bug was
    CASES     every case, in the order of the lessons that show the bug
"""
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache, KVCache, WindowKVCache
from kvlesson.layer import step
from kvlesson.online import online_attention
from kvlesson.rope import apply_rope
from kvlesson.sdpa import _checked, attention, causal_mask
from kvlesson.serving.paged import PagedKVCache

__all__ = ["Case", "CASES"]


@dataclass(frozen=True)
class Case:
    key: str  # a short name for the bug, never shown before the test passes
    interface: str  # what the candidate is told: the signature and what it promises, the same for every version
    broken: Callable  # a function, or a callable that makes objects
    correct: Callable  # its twin: the same code with the bug switched off
    also_correct: Callable | None  # kvlesson's own implementation of the interface, if it has one
    bug: str  # what was wrong, told once the test passes
    lesson: str  # the notebook of the lesson that shows the bug
    clue: str  # what kind of input shows it, told when a test passes on the broken version
    public: frozenset | None = None  # None for a function; for objects, the only attributes they show
    views: dict = field(default_factory=dict)  # method -> public names of the objects it returns
    handles: frozenset = frozenset()  # methods that return ids the test hands back (the shifted copy leaves those)


# ------------------------------------------------------------------------------------------ attention


def _attend(q, k, v, *, top_left=False, tiled=False):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], one query head at a time, by the book."""
    q, k, v, _ = _checked(q, k, v, None)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    out = np.zeros_like(q)
    if T == 0:
        return out
    mask = np.tril(np.ones((T, S), bool)) if top_left else causal_mask(T, S)  # top_left: the np.tril bug
    for h in range(H):
        g = h % Hkv if tiled else h // (H // Hkv)  # tiled: np.tile's pairing, head h with KV head h % Hkv
        s = np.where(mask, q[h] @ k[g].T * (1 / math.sqrt(d)), -np.inf)  # [T, S]
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[h] = p / p.sum(axis=-1, keepdims=True) @ v[g]
    return out


def attend(q, k, v):
    return _attend(q, k, v)


def attend_top_left(q, k, v):
    return _attend(q, k, v, top_left=True)


def attend_tiled(q, k, v):
    return _attend(q, k, v, tiled=True)


_ATTEND = ("attend(q, k, v) -> out [H, T, d]\n"
           "    T new queries over the S keys of a cache: q [H, T, d], k and v [Hkv, S, d], H a multiple of Hkv.\n"
           "    Causal: query i sits at position S - T + i and sees keys 0 .. S - T + i. Grouped-query attention:\n"
           "    query head h reads KV head h // (H // Hkv), as kvlesson.attention does. Scores scaled by 1 / sqrt(d).")

# ------------------------------------------------------------------------------------------ a layer with RoPE


def _layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0, *, local=False):
    """[T, D] -> [T, H*d]: project, rotate q and k, append k and v to the cache, attend."""
    x = validate.floats("x", x)
    T, d = x.shape[0], Wq.shape[1] // H
    q, k, v = ((x @ W).reshape(T, n, d).transpose(1, 0, 2) for W, n in ((Wq, H), (Wk, Hkv), (Wv, Hkv)))
    first = 0 if local else len(cache)  # local: positions counted inside the chunk, the lesson 06 bug
    positions = np.arange(first, first + T)
    K, V = cache.append(apply_rope(k, positions, rope_base), v)  # [Hkv, S, d], keys cached already rotated
    return attention(apply_rope(q, positions, rope_base), K, V).transpose(1, 0, 2).reshape(T, H * d)


def layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0):
    return _layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base)


def layer_local(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0):
    return _layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base, local=True)


def package_layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0):
    return step(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=rope_base)


_LAYER = ("layer(x, Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0) -> out [T, H*d]\n"
          "    One attention layer with RoPE over a KV cache, for prefill, chunks and decode alike: x [T, D] holds\n"
          "    only the new tokens, Wq [D, H*d], Wk and Wv [D, Hkv*d]. It rotates q and k (half-split pairs),\n"
          "    appends k and v to `cache` (any kvlesson cache: KVCache, StaticKVCache, ...) and attends the new\n"
          "    queries over everything the cache hands back. Without a cache history it is one full pass.")

# ------------------------------------------------------------------------------------------ caches


class _GrowingCache(Cache):
    """Grows by concatenation; newest_first puts each new block in front of the old ones (the lesson 03 bug)."""

    def __init__(self, Hkv, d, dtype=np.float64, *, newest_first=False):
        super().__init__(Hkv, d, dtype)
        self.newest_first = newest_first
        self.k = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, S, d]
        self.v = np.zeros((Hkv, 0, d), self.dtype)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        pair = ((k_new, self.k), (v_new, self.v)) if self.newest_first else ((self.k, k_new), (self.v, v_new))
        self.k, self.v = (np.concatenate(p, axis=1) for p in pair)
        self._seen += T
        return self.k, self.v

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


def growing_cache(Hkv, d, dtype=np.float64):
    return _GrowingCache(Hkv, d, dtype)


def newest_first_cache(Hkv, d, dtype=np.float64):
    return _GrowingCache(Hkv, d, dtype, newest_first=True)


_CACHE = ("cache = Cache(Hkv, d, dtype=np.float64)\n"
          "    A KV cache. cache.append(k_new, v_new), each [Hkv, T, d], returns (K, V) [Hkv, S, d]: every key and\n"
          "    value seen so far, oldest first, the new ones included. len(cache) is the number of tokens seen.\n"
          "    Attributes: Hkv, d, dtype, nbytes (bytes held).")


class _WindowCache(Cache):
    """A sliding-window cache kept by concatenation. Read first: hand back the W - 1 held positions and the T new
    ones, then keep the last W - 1. evict_first: keep the last W, then hand back what is kept (the lesson 07 bug,
    which only a chunk of T > 1 shows: with W positions kept, one decode query still gets its whole window)."""

    def __init__(self, Hkv, d, window, dtype=np.float64, *, evict_first=False):
        super().__init__(Hkv, d, dtype)
        self.window = validate.integer("window", window, minimum=1)
        self.evict_first = evict_first
        self.keep = self.window if evict_first else self.window - 1
        self.k = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, <= keep, d], oldest first
        self.v = np.zeros((Hkv, 0, d), self.dtype)

    def append(self, k_new, v_new):
        k_new, v_new, T = self._check(k_new, v_new)
        K, V = np.concatenate([self.k, k_new], axis=1), np.concatenate([self.v, v_new], axis=1)  # held, then new
        held = min(K.shape[1], self.keep)
        self.k, self.v = K[:, K.shape[1] - held:], V[:, V.shape[1] - held:]
        self._seen += T
        return (self.k, self.v) if self.evict_first else (K, V)

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


def window_cache(Hkv, d, window, dtype=np.float64):
    return _WindowCache(Hkv, d, window, dtype)


def evict_first_cache(Hkv, d, window, dtype=np.float64):
    return _WindowCache(Hkv, d, window, dtype, evict_first=True)


_WINDOW = ("cache = WindowCache(Hkv, d, window, dtype=np.float64)\n"
           "    A sliding-window KV cache: a query sees its own key and the window - 1 before it, so the cache keeps\n"
           "    only what a later query can still see. cache.append(k_new, v_new), each [Hkv, T, d], returns (K, V):\n"
           "    the keys and values the T new queries attend over, oldest first, ready for the offset mask with the\n"
           "    window (kvlesson.step reads cache.window). len(cache) is the number of tokens seen.\n"
           "    Attributes: Hkv, d, dtype, window, nbytes (bytes held).")

# ------------------------------------------------------------------------------------------ a padded batch


def _padded(q, k, v, pads, *, mask_pads=True):
    """[B, H, T, d], [B, Hkv, S, d], [B, Hkv, S, d], [B] -> [B, H, T, d]: B attentions, each under its own mask."""
    q, k, v, pads = _padded_inputs(q, k, v, pads)
    B, T, S = q.shape[0], q.shape[2], k.shape[2]
    out = np.zeros_like(q)
    col_q, col_k = np.arange(S - T, S)[:, None], np.arange(S)[None, :]  # [T, 1], [1, S]
    for b in range(B):
        mask = causal_mask(T, S)
        if mask_pads:  # mask_pads=False: the pads stay visible, the lesson 09 bug
            # a real query sees the real keys up to itself; a pad query sees only itself (a row needs one key)
            mask = (mask & (col_k >= pads[b])) | ((col_q < pads[b]) & (col_k == col_q))
        out[b] = attention(q[b], k[b], v[b], mask=mask)
    return out


def padded_attend(q, k, v, pads):
    return _padded(q, k, v, pads)


def padded_attend_pads_visible(q, k, v, pads):
    return _padded(q, k, v, pads, mask_pads=False)


def padded_attend_alone(q, k, v, pads):
    """The same interface computed another way: each sequence alone on its real columns; pad rows are zero."""
    q, k, v, pads = _padded_inputs(q, k, v, pads)
    T, S = q.shape[2], k.shape[2]
    out = np.zeros_like(q)
    for b, p in enumerate(pads):
        first = max(0, p - (S - T))  # the first new query that is a real token
        out[b, :, first:] = attention(q[b, :, first:], k[b, :, p:], v[b, :, p:])
    return out


def _padded_inputs(q, k, v, pads):
    q, k, v = validate.floats("q", q), validate.floats("k", k), validate.floats("v", v)
    pads = np.asarray(pads)
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or pads.shape != q.shape[:1]:
        raise ValueError(f"need q [B, H, T, d], k and v [B, Hkv, S, d], pads [B]; got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}, pads {pads.shape}")
    if pads.dtype.kind not in "iu" or (pads < 0).any() or (pads >= max(k.shape[2], 1)).any():
        raise ValueError(f"pads must be integers in 0 .. S - 1 = {k.shape[2] - 1}; got {pads.tolist()}")
    return q, k, v, pads


_PADDED = ("padded_attend(q, k, v, pads) -> out [B, H, T, d]\n"
           "    Attention for a batch of B sequences of different lengths, padded on the left into one rectangle:\n"
           "    q [B, H, T, d], k and v [B, Hkv, S, d], pads [B] (ints). Sequence b starts at column pads[b]; columns\n"
           "    before it are padding. New query i sits in column S - T + i. Each real query's output is what its\n"
           "    sequence would give alone, without padding; the outputs of pad queries are not specified.")

# ------------------------------------------------------------------------------------------ a paged pool


class _ForgetsSharing(PagedKVCache):
    """Copy-on-write forgotten: while it reserves room, the pool believes the sequence's last block is its own, so a
    write into a shared, partly filled block goes straight into the block every sharer reads (the lesson 09 bug)."""

    def reserve(self, seq, T):
        table = self.block_table(seq)
        if not table:
            return super().reserve(seq, T)
        last, users = table[-1], self.refs[table[-1]]
        self.refs[last] = 1  # "nobody else uses it": no copy is made
        try:
            return super().reserve(seq, T)
        finally:
            self.refs[last] = users  # the count itself stays right; only the copy was skipped


_POOL = ("pool = Pool(n_blocks, block_size, Hkv, d, dtype=np.float64)\n"
         "    A paged KV pool shared by many sequences. pool.new_sequence() -> id; pool.sequence(id) is a cache\n"
         "    (append(k_new, v_new) -> (K, V) [Hkv, S, d], oldest first; len; Hkv, d, dtype, nbytes), so\n"
         "    kvlesson.step takes it like any other. pool.fork(id) -> a new id that shares every position of id:\n"
         "    from then on each of the two grows on its own, as if it had been prefilled alone. Also pool.free(id),\n"
         "    pool.block_table(id), pool.blocks_free, pool.n_blocks, pool.block_size, pool.nbytes. Running out of\n"
         "    blocks raises ValueError.")

# ------------------------------------------------------------------------------------------ the online softmax


def _stream(q, k, v, block, *, rescale=True):
    """[H, T, d], [Hkv, S, d], [Hkv, S, d] -> [H, T, d], the keys `block` at a time with a running max m, sum l and
    unnormalised output o per query row. When a block raises the max, l and o are rescaled by exp(m - m_new);
    rescale=False forgets that (the lesson 10 bug), which goes unseen while the first block holds each row's max."""
    q, k, v, _ = _checked(q, k, v, None)
    block = validate.integer("block", block, minimum=1)
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    if T == 0:
        return np.zeros_like(q)
    G = H // Hkv
    qg = q.reshape(Hkv, G * T, d) * (1 / math.sqrt(d))  # rows (g, i): query head g*G + ..., query i
    pos = np.tile(np.arange(S - T, S), G)[:, None]  # [G*T, 1] each row's position
    m = np.full((Hkv, G * T, 1), -np.inf, q.dtype)
    l, o = np.zeros((Hkv, G * T, 1), q.dtype), np.zeros((Hkv, G * T, d), q.dtype)
    for start in range(0, S, block):
        s = qg @ k[:, start:start + block].transpose(0, 2, 1)  # [Hkv, G*T, b]
        s = np.where(np.arange(start, start + s.shape[-1]) <= pos, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isneginf(m_new), 0, m_new)  # a row that has seen no key yet: nothing to shift
        p = np.exp(s - shift)
        alpha = np.exp(m - shift) if rescale else 1
        l, o, m = alpha * l + p.sum(axis=-1, keepdims=True), alpha * o + p @ v[:, start:start + block], m_new
    return (o / l).reshape(H, T, d)


def stream(q, k, v, block):
    return _stream(q, k, v, block)


def stream_no_rescale(q, k, v, block):
    return _stream(q, k, v, block, rescale=False)


def package_stream(q, k, v, block):
    return online_attention(q, k, v, block=block)


_STREAM = ("stream(q, k, v, block) -> out [H, T, d]\n"
           "    Attention that walks the keys `block` at a time and never holds more than one block of scores (the\n"
           "    online softmax, FlashAttention's forward pass). The same inputs and the same answer as causal\n"
           "    attention: q [H, T, d], k and v [Hkv, S, d], query i at position S - T + i, query head h reading KV\n"
           "    head h // (H // Hkv), scores scaled by 1 / sqrt(d).")

# ------------------------------------------------------------------------------------------ the cases

_CACHE_NAMES = frozenset({"append", "Hkv", "d", "dtype", "nbytes", "__len__"})

CASES = (
    Case("the top-left mask", _ATTEND, attend_top_left, attend, attention,
         "the mask was np.tril of a [T, S] array, anchored at the top left: the first query of a chunk saw key 0 "
         "only, where it should see S - T + 1 keys",
         "04_offset_mask.ipynb",
         "a prefill (T = S) and one-query decode can both hide a mask bug; try T new queries with 1 < T < S"),
    Case("np.tile's head pairing", _ATTEND, attend_tiled, attend, attention,
         "query head h read KV head h % Hkv (np.tile's order) instead of h // G (np.repeat's), so most heads "
         "attended with another group's keys",
         "05_gqa.ipynb",
         "check every query head against its own KV head, with 1 < Hkv < H: MHA and MQA hide some bugs"),
    Case("RoPE at local positions", _LAYER, layer_local, layer, package_layer,
         "it rotated the new tokens at 0 .. T - 1, their index inside the chunk, instead of their absolute "
         "positions len(cache) + i: a first prefill is right, every later step is wrong",
         "06_rope.ipynb",
         "compare one full pass with the same tokens fed in pieces, decode steps included"),
    Case("the newest-first cache", _CACHE, newest_first_cache, growing_cache, KVCache,
         "each append put the new block in front of the old ones: a single decode query does not care about the "
         "order, a chunk of queries under the causal mask does",
         "03_kv_cache.ipynb",
         "one decode query sees every key, so it cannot notice their order; look at the order itself, or run "
         "chunks of T > 1 against a full pass",
         public=_CACHE_NAMES),
    Case("evict before attend", _WINDOW, evict_first_cache, window_cache, WindowKVCache,
         "it wrote the new block into its window before handing the keys back, so the first queries of a chunk "
         "lost keys they still see; with W slots, decode (T = 1) hides it",
         "07_sliding_window.ipynb",
         "decode steps of T = 1 can hide a window bug; feed chunks of T > 1, and chunks longer than the window",
         public=_CACHE_NAMES | {"window"}),
    Case("pads left visible", _PADDED, padded_attend_pads_visible, padded_attend, padded_attend_alone,
         "real queries could see the pad keys: a pad gets a share of every real query's softmax",
         "09_many_sequences.ipynb",
         "give the sequences different numbers of pads, and compare each with itself alone"),
    Case("copy-on-write forgotten", _POOL, _ForgetsSharing, PagedKVCache, None,
         "after a fork, the first write into the shared, partly filled last block went into the block both "
         "sequences read, instead of into a private copy: the other sequence's key was overwritten",
         "09_many_sequences.ipynb",
         "fork a sequence whose last block is partly filled, then let both sides append different tokens",
         public=frozenset({"new_sequence", "sequence", "fork", "free", "block_table", "blocks_free", "n_blocks",
                           "block_size", "nbytes", "Hkv", "d", "dtype"}),
         views={"sequence": _CACHE_NAMES}, handles=frozenset({"new_sequence", "fork"})),
    Case("the online softmax without rescaling", _STREAM, stream_no_rescale, stream, package_stream,
         "when a block raised a row's running max, the sums of the earlier blocks were not rescaled by "
         "exp(m_old - m_new): right while the first block holds each row's largest score, wrong otherwise",
         "10_precision.ipynb",
         "use several blocks, and scores whose maximum does not sit in the first block"),
)
