"""A paged KV pool: many sequences share one preallocated array of fixed-size blocks (vLLM's PagedAttention idea).

    pool = PagedKVCache(n_blocks=64, block_size=16, Hkv=3, d=64, dtype=np.float32)
    a = pool.new_sequence()                 # an id; no memory yet
    step(x, Wq, Wk, Wv, pool.sequence(a), H, Hkv)   # the view is a cache like any other
    b = pool.fork(a)                        # b shares every block of a; nothing is copied
    pool.block_table(a)                     # [7, 2, ...]: where a's positions live
    pool.free(a)                            # its blocks go back to the pool when nobody else uses them

Position p of a sequence lives in physical block table[p // block_size], at slot p % block_size. A sequence takes
a new block only when its last one is full, so at most block_size - 1 slots per sequence are ever idle.

Sharing is by reference count. A full shared block is never written again, so it stays shared. A partly filled
shared block is copied the moment either side writes into it (copy-on-write): the writer gets a private copy,
and the other sequences keep the original.

Every method checks its arguments and that the pool can do all of it before anything moves. A step of an engine, which
reserves blocks and then runs a forward pass that may be cut short (Ctrl-C), runs inside `with pool.atomic():` and
then happens whole or not at all.

Two more things a scheduler needs (kvlesson.serving.engine, lesson 13):
  - automatic prefix caching (vLLM's APC). A full block is known by a key hashed over every token from the start of
    its sequence to the block's end, chained block by block (block_hash). publish(seq, ids) registers a sequence's
    full blocks under their keys; new_cached_sequence(ids) starts a sequence on every cached block of the longest
    cached prefix of ids. A registered block whose last user leaves stays cached, unreferenced: it counts as free,
    and is evicted, least recently released first, only when a free block is wanted.
  - swapping: swap_out(seq) copies a sequence's blocks to host memory (a SwappedSequence) and frees them;
    swap_in(swapped) copies them back into free blocks, as a new sequence with the same keys and values.
"""
import contextlib
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kvlesson import atomic, validate
from kvlesson.cache import Cache, float_dtype


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks that hold `positions` positions: the last one may be partly filled."""
    return -(-positions // block_size)


def request_blocks(prompt: int, max_new_tokens: int, block_size: int) -> int:
    """Blocks a request holds at its longest: its prompt and every new token but the last, which comes out of the last
    forward pass and is never fed back."""
    return blocks_for(prompt + max(max_new_tokens - 1, 0), block_size)


def read_pages(k: np.ndarray, v: np.ndarray, tables: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Pool arrays k, v [Hkv, n_blocks, block_size, d] (or one layer's heads of them), block tables int [B, n] ->
    K, V [Hkv, B, S, d]: each sequence's first S positions in order. The one place pages are read: numpy cannot
    multiply through a block table, so whole blocks are copied out in table order (a GPU kernel reads them in place).
    Past a sequence's own length come whatever its table's padding points at; the caller masks them."""
    Hkv, _, bs, d = k.shape
    B, n = tables.shape
    n = blocks_for(S, bs)  # only the blocks that hold the first S positions
    shape = (Hkv, B, n * bs, d)
    return (np.take(k, tables[:, :n], axis=1).reshape(shape)[:, :, :S],
            np.take(v, tables[:, :n], axis=1).reshape(shape)[:, :, :S])


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """The key of one full block: sha256 over the key of the block before it (None for a sequence's first block) and
    the block's own token ids. Chained, a key names every token from the start of the sequence to the end of the block,
    so two blocks that hold the same tokens after different prefixes (whose keys and values differ) never share one."""
    h = hashlib.sha256(b"" if parent is None else parent)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())  # 8 bytes a token: ids of any vocabulary, no separators
    return h.digest()


def block_hashes(ids: Sequence[int], block_size: int) -> list[bytes]:
    """-> the keys of the full blocks of ids, in order: key i names ids[: (i + 1) * block_size]. A partly filled last
    block has no key: its tokens are not all known yet."""
    keys, parent = [], None
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = block_hash(parent, ids[start : start + block_size])
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class SwappedSequence:
    """A sequence's blocks copied out of the pool (to host memory, on a GPU server): K and V [Hkv, n, block_size, d]
    in its table's order, and how many positions they hold."""

    k: np.ndarray
    v: np.ndarray
    length: int

    @property
    def nbytes(self) -> int:
        """Bytes one copy moves, out or back in."""
        return self.k.nbytes + self.v.nbytes


class PagedKVCache:
    """One pool of n_blocks blocks of block_size positions: K and V [Hkv, n_blocks, block_size, d].

    The Hkv heads are one layer's KV heads, or every layer's at once (kvlesson.serving.forward.model_pool), so that one
    block table serves a whole model. Each sequence owns a block table, the physical blocks that hold its positions in
    order. Every method checks its arguments and that the pool can do all of it before anything moves, so a refused
    call (ValueError, TypeError) leaves every sequence as it was.
    """

    def __init__(self, n_blocks: int, block_size: int, Hkv: int, d: int, dtype: np.dtype = np.float64):
        self.n_blocks = validate.integer("n_blocks", n_blocks, minimum=1)
        self.block_size = validate.integer("block_size", block_size, minimum=1)
        self.Hkv, self.d = validate.integer("Hkv", Hkv, minimum=1), validate.integer("d", d, minimum=1)
        self.dtype = float_dtype(dtype)
        shape = (self.Hkv, self.n_blocks, self.block_size, self.d)  # [Hkv, n_blocks, block_size, d]
        try:
            self.k, self.v = np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)
        except MemoryError:
            need = 2 * math.prod(shape) * self.dtype.itemsize
            raise ValueError(f"a pool of n_blocks={n_blocks} blocks of {block_size} x {Hkv} KV heads x d={d} in "
                             f"{self.dtype} needs {need / 2**30:,.1f} GiB, more than this machine can allocate; "
                             "choose fewer blocks") from None
        self.refs = [0] * n_blocks  # how many block tables point at each block
        self._free = list(range(n_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._tables, self._lens = {}, {}  # sequence id -> block table, -> positions written
        self._next_id = 0  # ids are never reused, so a stale id cannot reach another sequence
        # prefix caching: registered blocks, both ways; cached blocks nobody points at, least recently released first;
        # each sequence's keys for its leading full blocks, as far as publish or new_cached_sequence has chained them
        self._block_of, self._key_of = {}, {}
        self._idle = OrderedDict()
        self._keys = {}
        self._saved = None  # inside atomic(): block -> its K and V as they were, for every held block overwritten
        self._held_at_start = None

    # ---- all or nothing

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Whatever is done to the pool inside the block happens whole, or not at all if anything escapes it (an
        error, KeyboardInterrupt): every table, length, count, cache key and every block a sequence or the prefix cache
        held is put back as it was. The bookkeeping is copied up front (lists of a few hundred ints); a block's keys and
        values are copied only when a held block is about to be overwritten. Nested blocks belong to the outermost."""
        if self._saved is not None:
            yield
            return
        books = self._books()
        self._held_at_start = set(range(self.n_blocks)).difference(self._free)  # contents someone can still read
        self._saved = {}
        try:
            with atomic.undo_on_error(lambda: self._put_back(books)):
                yield
        finally:
            self._saved, self._held_at_start = None, None

    def checkpoint(self) -> Callable[[], None]:
        """-> restore(): puts every table, length, count and cache key back as it is now, after a forward pass over
        sequence views or a truncate in between (blocks only taken, or only released, not both). A cached block that
        was taken meanwhile may hold other keys now, so it comes back free instead of cached: a lost cache entry, never
        a wrong one. An engine's step, which frees and retakes blocks, uses atomic() instead."""
        books = self._books()

        def restore():
            taken = [b for b in books["_idle"] if b not in self._idle]  # evicted meanwhile: contents unknown
            vars(self).update(books)
            for block in taken:
                self._forget(block)
                self._free.append(block)
        return restore

    def _books(self):
        """-> a copy of the bookkeeping: every list and dict of it, down to each sequence's table and keys."""
        return dict(refs=list(self.refs), _free=list(self._free), _tables={s: list(t) for s, t in self._tables.items()},
                    _lens=dict(self._lens), _keys={s: list(k) for s, k in self._keys.items()},
                    _block_of=dict(self._block_of), _key_of=dict(self._key_of), _idle=OrderedDict(self._idle),
                    _next_id=self._next_id)

    def _put_back(self, books):
        for block, (k, v) in self._saved.items():
            self.k[:, block], self.v[:, block] = k, v
        vars(self).update(books)

    def _overwriting(self, block):
        """Called before `block` is given new contents: inside atomic(), keep what it held, once."""
        if self._saved is not None and block in self._held_at_start and block not in self._saved:
            self._saved[block] = (self.k[:, block].copy(), self.v[:, block].copy())

    # ---- sequences

    def new_sequence(self) -> int:
        """-> the id of a new, empty sequence. It holds no block until its first append."""
        return self._add([], 0)

    def sequence(self, seq: int) -> "PagedSequence":
        """The view of one sequence that step() and model.forward take like any cache (append, len, nbytes)."""
        self._table(seq)
        return PagedSequence(self, seq)

    def fork(self, seq: int) -> int:
        """-> the id of a new sequence that shares every block of `seq`. Nothing is copied, nothing allocated."""
        table = self._table(seq)
        for block in table:
            self.refs[block] += 1
        return self._add(list(table), self._lens[seq], list(self._keys[seq]))

    def free(self, seq: int) -> None:
        """Drop a sequence. Each of its blocks returns to the pool once no other sequence points at it (a cached block
        stays cached, unreferenced, until a free block is wanted)."""
        self._release(self._table(seq))
        del self._tables[seq], self._lens[seq], self._keys[seq]

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first n positions of `seq`: blocks past them go back to the pool once no other sequence points at
        them, and a shared block the sequence keeps is copied on its next write, as after a fork."""
        table = self._table(seq)
        n = validate.integer("n", n)
        if n > self._lens[seq]:
            raise ValueError(f"truncate(n={n}): sequence {seq} holds only {self._lens[seq]} positions")
        keep = blocks_for(n, self.block_size)
        self._release(table[keep:])
        del table[keep:]
        del self._keys[seq][n // self.block_size :]  # a block cut short is no longer full
        self._lens[seq] = n

    def block_table(self, seq: int) -> list[int]:
        """-> list[int]: the physical block of each of the sequence's logical blocks, in order (a copy)."""
        return list(self._table(seq))

    def block_tables(self, seqs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """-> (tables int [B, n], lengths int [B]): the tables of many sequences as one array, each padded with block
        0 up to the longest (n blocks), and how many positions each holds. An attention kernel for a whole batch
        takes exactly this; the padding is never read, because lengths say where each sequence ends."""
        tables = [self._table(s) for s in seqs]
        index = np.zeros((len(tables), max(map(len, tables), default=0)), dtype=np.intp)  # [B, n]
        for row, table in zip(index, tables, strict=True):
            row[: len(table)] = table
        return index, np.array([self._lens[s] for s in seqs], dtype=np.intp)

    def length(self, seq: int) -> int:
        """Positions the sequence holds: the position of its next token."""
        self._table(seq)
        return self._lens[seq]

    @property
    def sequences(self) -> list[int]:
        """-> [ids] of the live sequences (made and not yet freed), oldest first."""
        return list(self._tables)

    @property
    def blocks_free(self) -> int:
        """Blocks a sequence can take: the free ones and the cached ones nobody points at (evicted when taken)."""
        return len(self._free) + len(self._idle)

    @property
    def blocks_cached(self) -> int:
        """Blocks registered under a prefix key, in use or not."""
        return len(self._key_of)

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds: every block, in use or not (it is allocated once, up front)."""
        return self.k.nbytes + self.v.nbytes

    # ---- the two halves of an append

    def needed(self, seq: int, T: int) -> int:
        """Blocks that T more positions of `seq` would take from the free list: the new blocks it crosses into, and
        one more when its last block is partly filled and shared (it is copied before it is written)."""
        fresh, shared_tail = self._growth(seq, validate.integer("T", T))
        return fresh + shared_tail

    def _growth(self, seq, T):
        """-> (blocks T more positions cross into, whether the last block is partly filled and shared: copied first)."""
        table, L = self._table(seq), self._lens[seq]
        fresh = blocks_for(L + T, self.block_size) - len(table)
        shared_tail = T > 0 and L % self.block_size != 0 and self.refs[table[-1]] > 1
        return fresh, shared_tail

    def reserve(self, seq: int, T: int) -> tuple[np.ndarray, np.ndarray]:
        """Make room for T more positions of `seq` -> (blocks [T], slots [T]), where they go.

        Takes new blocks as the sequence crosses block boundaries, and first copies its last block when that
        block is partly filled and shared (copy-on-write). Raises ValueError, changing nothing, when the pool
        has too few free blocks.
        """
        need = self.needed(seq, T)
        if need > self.blocks_free:
            raise ValueError(f"out of blocks: sequence {seq} needs {need} more to hold {self._lens[seq]} + T={T} "
                             f"positions, and {self.blocks_free} of {self.n_blocks} are free")
        table, L, bs = self._tables[seq], self._lens[seq], self.block_size
        fresh, shared_tail = self._growth(seq, T)
        if T > 0 and L % bs != 0 and not shared_tail and table[-1] in self._key_of:
            self._overwriting(table[-1])
            self._forget(table[-1])  # its only user is about to write into it: it no longer holds what its key names
        if shared_tail:  # copy-on-write: this sequence gets a private copy, the others keep the original
            old, new = table[-1], self._take()
            self.k[:, new], self.v[:, new] = self.k[:, old], self.v[:, old]
            self.refs[old] -= 1
            table[-1] = new
        table.extend(self._take() for _ in range(fresh))
        positions = np.arange(L, L + T)
        self._lens[seq] = L + T
        return np.asarray(table, dtype=np.intp)[positions // bs], positions % bs

    # ---- prefix caching

    def publish(self, seq: int, ids: Sequence[int]) -> None:
        """Register every full block of `seq` under its chained key; ids: the token ids at its positions (at least
        length(seq) of them). A key already registered to another block keeps that block. Nothing is copied."""
        table, L, bs = self._table(seq), self._lens[seq], self.block_size
        if len(ids) < L:
            raise ValueError(f"publish: ids has {len(ids)} token ids; sequence {seq} holds {L} positions")
        keys, known = self._keys[seq], len(self._keys[seq])
        if L // bs == known:
            return  # no block has filled up since the last call
        keys[:] = block_hashes(ids[: L // bs * bs], bs)
        for i in range(known, len(keys)):
            if keys[i] not in self._block_of and table[i] not in self._key_of:
                self._block_of[keys[i]], self._key_of[table[i]] = table[i], keys[i]

    def lookup(self, ids: Sequence[int]) -> list[int]:
        """-> [blocks]: the cached blocks of the longest prefix of ids in whole blocks, in order. Changes nothing."""
        return self._prefix(ids, None)[0]

    def cached_cost(self, ids: Sequence[int], limit: int | None = None) -> tuple[int, int]:
        """-> (positions, blocks): how many of ids' first positions a new_cached_sequence(ids, limit) would find
        cached, and how many blocks holding all of ids would then take from blocks_free (cached blocks nobody uses
        count, since taking them leaves fewer free; a shared block that the first write must copy counts once)."""
        hits, held, _ = self._prefix(ids, limit)
        bs = self.block_size
        idle = sum(self.refs[b] == 0 for b in hits)
        copy = held % bs != 0 and len(ids) > held and self.refs[hits[-1]] > 0  # shared once adopted
        return held, idle + blocks_for(len(ids), bs) - len(hits) + copy

    def new_cached_sequence(self, ids: Sequence[int], limit: int | None = None) -> tuple[int, int]:
        """-> (id, positions): a new sequence that starts on every cached block of the longest cached prefix of ids, at
        most `limit` positions of it (a caller that needs the last prompt token's logits passes len(ids) - 1), and
        how many positions it holds already. The blocks gain a user each; nothing is copied."""
        hits, held, keys = self._prefix(ids, limit)
        for block in hits:
            self._idle.pop(block, None)  # in use again: no longer evictable
            self.refs[block] += 1
        return self._add(list(hits), held, keys[: held // self.block_size]), held

    def _prefix(self, ids, limit):
        """-> (blocks, positions, keys): the cached blocks a new sequence for ids would start on, cut to `limit`
        positions, and their keys. The walk stops at the first block that is not cached: a sequence needs every earlier
        position, so a later block is of no use without it."""
        cap = math.inf if limit is None else validate.integer("limit", limit)
        hits, keys = [], []
        for key in block_hashes(ids, self.block_size):
            if key not in self._block_of or len(hits) * self.block_size >= cap:
                break
            hits.append(self._block_of[key])
            keys.append(key)
        held = min(len(hits) * self.block_size, cap)
        return hits, held, keys

    # ---- swapping

    def swap_out(self, seq: int) -> SwappedSequence:
        """Copy the blocks of `seq` out of the pool and free it -> a SwappedSequence that swap_in brings back."""
        table = self._table(seq)
        out = SwappedSequence(self.k[:, table], self.v[:, table], self._lens[seq])  # fancy indexing copies
        self.free(seq)
        return out

    def swap_in(self, swapped: SwappedSequence) -> int:
        """Copy a SwappedSequence back into free blocks -> the id of a new sequence with its keys and values. Raises
        ValueError, changing nothing, when too few blocks are free."""
        if not isinstance(swapped, SwappedSequence):
            raise TypeError(f"swapped must be what swap_out returned; got {type(swapped).__name__}")
        want = (self.Hkv, swapped.k.shape[1], self.block_size, self.d)
        if swapped.k.shape != want or swapped.v.shape != want or swapped.k.dtype != self.dtype:
            raise ValueError(f"swapped holds {swapped.k.shape} {swapped.k.dtype} blocks; this pool holds "
                             f"[Hkv={self.Hkv}, n, block_size={self.block_size}, d={self.d}] {self.dtype}")
        n = want[1]
        if n > self.blocks_free:
            raise ValueError(f"out of blocks: swapping in needs {n}, and {self.blocks_free} of {self.n_blocks} are "
                             "free")
        table = [self._take() for _ in range(n)]
        self.k[:, table], self.v[:, table] = swapped.k, swapped.v
        return self._add(table, swapped.length)

    def gather(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """-> (K, V) [Hkv, S, d]: the sequence's keys and values in position order, read through its table."""
        table, S = self._table(seq), self._lens[seq]
        K, V = read_pages(self.k, self.v, np.asarray([table], dtype=np.intp).reshape(1, -1), S)  # [Hkv, 1, S, d]
        return K[:, 0], V[:, 0]

    # ---- bookkeeping

    def _add(self, table, length, keys=None):
        seq, self._next_id = self._next_id, self._next_id + 1
        self._tables[seq], self._lens[seq], self._keys[seq] = table, length, keys or []
        return seq

    def _take(self):
        """A block for one user: a free one, else the cached block released longest ago (its key is dropped)."""
        if self._free:
            block = self._free.pop()
        else:
            block = next(iter(self._idle))
            self._forget(block)
        self._overwriting(block)
        self.refs[block] = 1
        return block

    def _release(self, blocks):
        """Each block loses a user. One that nobody points at any more goes back on the free stack, in order, or, when
        cached, to the end of the idle queue; the last block of a run first, so a prefix's tail is evicted before
        its head (a head without its tail still serves a shorter prefix, a tail without its head serves none)."""
        for block in blocks:
            self.refs[block] -= 1
        unused = [b for b in blocks if self.refs[b] == 0]
        self._free.extend(b for b in unused if b not in self._key_of)
        for block in reversed(unused):
            if block in self._key_of:
                self._idle[block] = None

    def _forget(self, block):
        """Drop a block's key: it is about to hold other keys and values."""
        del self._block_of[self._key_of.pop(block)]
        self._idle.pop(block, None)

    def _table(self, seq):
        seq = validate.integer("seq", seq)
        if seq not in self._tables:
            raise ValueError(f"sequence {seq} is not in this pool (never made, or freed); live: {sorted(self._tables)}")
        return self._tables[seq]

    def __repr__(self):
        return (f"PagedKVCache({self.n_blocks} blocks of {self.block_size}, Hkv={self.Hkv}, d={self.d}, "
                f"{self.dtype}; {len(self._tables)} sequences, {self.blocks_free} blocks free)")


class PagedSequence(Cache):
    """One sequence of a PagedKVCache, seen as a cache: append(k_new, v_new) -> (K, V), len, nbytes, Hkv, d, dtype.

    It keeps no state of its own: the position and the blocks live in the pool, so two views of one sequence
    always agree. The append checks (shapes, dtype) are those of every kvlesson cache.
    """

    def checkpoint(self) -> Callable[[], None]:
        return self.pool.checkpoint()  # the position and the blocks live in the pool

    def __init__(self, pool: PagedKVCache, seq: int):  # no Cache.__init__: the position lives in the pool, not here
        self.pool, self.id = pool, seq
        self.Hkv, self.d, self.dtype = pool.Hkv, pool.d, pool.dtype

    def __len__(self):
        return self.pool.length(self.id)

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[Hkv, T, d] each -> (K, V) [Hkv, S, d], after writing the T new positions into the sequence's blocks."""
        k_new, v_new, T = self._check(k_new, v_new)
        blocks, slots = self.pool.reserve(self.id, T)
        self.pool.k[:, blocks, slots] = k_new  # [Hkv, T, d] into T (block, slot) places
        self.pool.v[:, blocks, slots] = v_new
        return self.pool.gather(self.id)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this sequence points at (a block shared by n sequences counts for each of them)."""
        blocks = len(self.pool.block_table(self.id))
        return 2 * blocks * self.pool.block_size * self.Hkv * self.d * self.dtype.itemsize

    def truncate(self, n: int) -> None:
        self.pool.truncate(self.id, n)

    @property
    def block_table(self) -> list[int]:
        return self.pool.block_table(self.id)

    def __repr__(self):
        return f"PagedSequence(id={self.id}, len={len(self)}, blocks={self.block_table})"
