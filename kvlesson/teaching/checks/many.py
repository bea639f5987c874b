"""Checkers for lesson 09: the pad-aware mask of a padded batch, the positions RoPE turns a padded column by, reading
a sequence's keys through its block table, what a block size costs, and copy-on-write in a paged pool.

Each runs the learner's code on seeded cases, rejects any answer that differs from kvlesson's, and then compares the
answer with the classic slips to say why: pads left visible, the diagonal anchored at the top left, a pad row left
empty; positions that count the pads or restart at every step; logical blocks read instead of physical ones, whole
blocks handed back; blocks counted by floor, waste averaged per sequence; a shared block written in place, a copy
that leaves out the values or a KV head, a block copied that nobody shares, a reference never given back.
"""
import math

import numpy as np

from kvlesson.sdpa import causal_mask
from kvlesson.serving.padding import pad_mask, pad_positions
from kvlesson.serving.paged import PagedKVCache
from kvlesson.teaching.verdict import (
    Slip,
    as_array,
    as_number,
    attribute,
    checker,
    distinct_digits,
    first_slip,
    passed,
    reject,
    reject_slip,
    run,
)

__all__ = ["check_pad_mask", "check_pad_positions", "check_read_pages", "check_paging_cost", "check_copy_on_write"]


# ------------------------------------------------------------------------------------------------- pad mask

_PAD_CASES = [  # (what, pads, T, S)
    ("a prefill of three prompts (pads [0, 2, 1], T=S=4)", [0, 2, 1], 4, 4),
    ("a decode step (pads [0, 3, 1], T=1, S=6)", [0, 3, 1], 1, 6),
    ("a chunk of 2 after 3 columns (pads [1, 0], T=2, S=5)", [1, 0], 2, 5),
    ("one sequence without pads (pads [0], T=3, S=7)", [0], 3, 7),
    ("a prefill that is mostly pads (pads [3, 0], T=S=4)", [3, 0], 4, 4),
    ("no new columns (pads [0, 1], T=0, S=3)", [0, 1], 0, 3),
]


def _cols(pads, T, S):
    """[1, T, 1] query columns, [1, 1, S] key columns, [B, 1, 1] first real column of each sequence."""
    return np.arange(S - T, S)[None, :, None], np.arange(S)[None, None, :], np.asarray(pads)[:, None, None]


_PAD_SLIPS = [
    Slip("pads visible", lambda pads, T, S: np.broadcast_to(causal_mask(T, S), (len(pads), T, S)),
         "for {case} real queries can see pad keys",
         "combine the offset causal mask with a pad mask: key j is real for sequence b when j >= pads[b]. A pad key "
         "left visible gets a weight like any other and dilutes every real query's softmax"),
    Slip("top-left diagonal", lambda pads, T, S: np.tril(np.ones((T, S), bool))[None] & (_cols(pads, T, S)[1]
                                                                                          >= _cols(pads, T, S)[2]),
         "for {case} the diagonal is anchored at the top left",
         "the new queries sit in columns S - T .. S - 1: query i sees key j when j <= S - T + i (lesson 04), "
         "whatever the pads"),
    Slip("pads off by one", lambda pads, T, S: causal_mask(T, S)[None] & (_cols(pads, T, S)[1]
                                                                          > _cols(pads, T, S)[2]),
         "for {case} each sequence's first real key is hidden",
         "sequence b's first real token sits in column pads[b] (pads[b] columns of padding come before it): keep "
         "j >= pads[b], not j > pads[b]"),
    Slip("pads on the right", lambda pads, T, S: causal_mask(T, S)[None] & (_cols(pads, T, S)[1]
                                                                            < S - _cols(pads, T, S)[2]),
         "for {case} the mask hides the last keys, not the first",
         "the batch is padded on the left: the pads of sequence b are columns 0 .. pads[b] - 1"),
]


@checker
def check_pad_mask(fn):
    """fn(pads, T, S) -> bool [B, T, S]: query i of sequence b (column S - T + i) sees key j when
    pads[b] <= j <= S - T + i; a query that is itself a pad must see at least one key (kvlesson lets it see itself)."""
    answers = []
    for case, pads, T, S in _PAD_CASES:  # the real queries first: what every output depends on
        pads = np.array(pads)
        got = as_array(run(fn, pads.copy(), T, S, case=case), case)
        _real_rows(got, pad_mask(pads, T, S), pads, T, S, case)
        answers.append((case, got))
    for case, got in answers:  # then the pad rows: any finite choice will do
        if got.shape[1] and not got.any(axis=-1).all():
            b, i = (int(x) for x in np.argwhere(~got.any(axis=-1))[0])
            reject(f"for {case} query {i} of sequence {b} is a pad and sees no key at all",
                   "a row with no key is a softmax over nothing, 0/0 = NaN; and NaN does not stay in the pad's row: "
                   "the next layer weights the pad's value by 0, and 0 * NaN is NaN. Let a pad query see itself")
    return passed("real queries see their own sequence's real keys up to their column, pads never; pad rows are finite")


def _real_rows(got, want, pads, T, S, case):
    if got.shape != want.shape:
        reject(f"for {case} the mask has shape {got.shape}; expected {want.shape}",
               "one [T, S] mask per sequence: [B, T, S], with B = len(pads)")
    if got.dtype != bool:
        reject(f"for {case} the mask is {got.dtype}; expected bool", "build it from comparisons (<=, >=, &)")
    real = _cols(pads, T, S)[0] >= _cols(pads, T, S)[2]  # [B, T, 1]: rows of real queries
    if not (got != want)[np.broadcast_to(real, want.shape)].any():
        return
    slip = first_slip(got & real, _PAD_SLIPS, (pads, T, S), same=lambda g, w: np.array_equal(g, w & real))
    if slip is not None:
        reject_slip(slip, case)
    b, i = (int(x) for x in np.argwhere((got != want).any(axis=-1) & real[..., 0])[0])
    reject(f"for {case} query {i} of sequence {b} (column {S - T + i}, pads {pads[b]}) sees keys "
           f"{np.flatnonzero(got[b, i]).tolist()}; it should see {np.flatnonzero(want[b, i]).tolist()}",
           "query i of sequence b sees key j when pads[b] <= j <= S - T + i")


# ------------------------------------------------------------------------------------------ pad positions

_POSITION_CASES = [  # (what, pads, T, S): a prefill, then steps onto columns already in the batch
    ("a prefill of three prompts (pads [0, 3, 2], T=S=5)", [0, 3, 2], 5, 5),
    ("a decode step (pads [0, 3, 2], T=1, S=8)", [0, 3, 2], 1, 8),
    ("a chunk of 2 after 3 columns (pads [1, 0], T=2, S=5)", [1, 0], 2, 5),
    ("one sequence without pads (pads [0], T=3, S=7)", [0], 3, 7),
    ("a prefill that is mostly pads (pads [4, 0, 2], T=S=5)", [4, 0, 2], 5, 5),
    ("no new columns (pads [0, 1], T=0, S=3)", [0, 1], 0, 3),
]


def _columns(pads, T, S):
    """[1, T] the new columns, [B, 1] the pads."""
    return np.arange(S - T, S)[None, :], np.asarray(pads)[:, None]


_POSITION_SLIPS = [  # each computes [1, T] or [B, T]; it is compared on the real columns only
    Slip("columns", lambda pads, T, S: _columns(pads, T, S)[0],
         "for {case} the positions are the columns, pads counted",
         "a column counts the pads before it: sequence b's first real token sits in column pads[b], and it is its "
         "token 0. Keys rotated by the column fit the queries of the same batch, but not a query rotated by "
         "len(cache) once the sequence leaves it"),
    Slip("step index less pads", lambda pads, T, S: np.arange(T)[None, :] - _columns(pads, T, S)[1],
         "for {case} the positions leave out the columns already in the batch",
         "new column i sits at column S - T + i, not i: count from there, less the pads"),
    Slip("restart each step", lambda pads, T, S: np.arange(T)[None, :],
         "for {case} the positions start again at 0 in every step",
         "the new columns are S - T .. S - 1, after the S - T columns already in the batch: a decode step is not "
         "position 0 (lesson 06 rotates decode by its absolute position)"),
    Slip("off by one", lambda pads, T, S: _columns(pads, T, S)[0] - _columns(pads, T, S)[1] + 1,
         "for {case} every real position is one too high",
         "the first real column, pads[b], is position 0"),
    Slip("off by one, low", lambda pads, T, S: _columns(pads, T, S)[0] - _columns(pads, T, S)[1] - 1,
         "for {case} every real position is one too low",
         "the first real column, pads[b], is position 0, not -1"),
    Slip("counted from the end", lambda pads, T, S: S - 1 - _columns(pads, T, S)[0],
         "for {case} the positions count down from the newest column",
         "positions grow with the column: the oldest real token is 0, the newest S - 1 - pads[b]"),
]


def _same_on(real):
    """Equal on the real columns, after broadcasting the slip's [1, T] or [B, T] to the answer's shape."""
    def same(got, wrong):
        try:
            wrong = np.broadcast_to(wrong, got.shape)
        except ValueError:
            return False
        return np.array_equal(got[real], wrong[real])
    return same


@checker
def check_pad_positions(fn):
    """fn(pads, T, S) -> int [B, T]: the position RoPE must rotate column S - T + i of sequence b by, so that every
    sequence's keys and queries are rotated as they would be alone. Pad columns may get any whole number: nothing
    real ever reads them."""
    for case, pads, T, S in _POSITION_CASES:
        pads = np.array(pads)
        got = as_array(run(fn, pads.copy(), T, S, case=case), case)
        want = pad_positions(pads, T, S)
        if got.shape != want.shape:
            hint = ("one row per sequence, one position per new column: [B, T]" if got.shape != want.shape[::-1]
                    else "rows are sequences, columns the new columns: [B, T], not [T, B]")
            reject(f"for {case} the positions have shape {got.shape}; expected {want.shape}", hint)
        if got.dtype.kind not in "iu":
            reject(f"for {case} the positions are {got.dtype}; expected integers",
                   "positions count tokens: build them from np.arange and the integer pads")
        real = _columns(pads, T, S)[0] >= _columns(pads, T, S)[1]  # [B, T]: columns that hold a real token
        if np.array_equal(got[real], want[real]):
            continue
        slip = first_slip(got, _POSITION_SLIPS, (pads, T, S), same=_same_on(real))
        if slip is not None:
            reject_slip(slip, case)
        b, i = (int(x) for x in np.argwhere((got != want) & real)[0])
        reject(f"for {case} column {S - T + i} of sequence {b} (pads {pads[b]}) gets position {got[b, i]}",
               "which token of its own sequence is in that column? Alone, that token would sit at that position")
    return passed("every real column is turned by its position in its own sequence, in prefills, chunks and decode "
                  "steps alike")


# ------------------------------------------------------------------------------------------ reading pages

_PAGE_CASES = [  # (what, Hkv, n_blocks, block_size, d, table, S, dtype)
    ("a table [3, 0, 5] of 4-slot blocks, S=10", 2, 6, 4, 3, [3, 0, 5], 10, np.float64),
    ("the same in float32", 2, 6, 4, 3, [3, 0, 5], 10, np.float32),
    ("two full blocks [4, 1], S=8", 1, 5, 4, 2, [4, 1], 8, np.float64),
    ("blocks of one slot, table [2, 0, 1], S=3", 2, 3, 1, 2, [2, 0, 1], 3, np.float64),
    ("a block table in order [0, 1], S=5", 1, 4, 3, 2, [0, 1], 5, np.float64),
    ("an empty sequence (table [], S=0)", 2, 3, 4, 3, [], 0, np.float64),
]


def _read(pool, table, S):
    Hkv, _, bs, d = pool.shape
    return pool[:, table].reshape(Hkv, len(table) * bs, d)[:, :S]


_PAGE_SLIPS = [
    Slip("logical blocks", lambda pool, table, S: _read(pool, list(range(len(table))), S),
         "for {case} you read blocks 0, 1, 2, ... in order, not the blocks the table names",
         "position p lives in physical block table[p // block_size]: index the pool with the table"),
    Slip("whole blocks", lambda pool, table, S: _read(pool, table, len(table) * pool.shape[2]),
         "for {case} you handed back every slot of every block",
         "the last block is only partly filled: keep the first S positions, [:, :S]"),
    Slip("slot-major", lambda pool, table, S: pool[:, table].transpose(0, 2, 1, 3).reshape(pool.shape[0], -1,
                                                                                           pool.shape[3])[:, :S],
         "for {case} the positions come out in the wrong order",
         "pool[:, table] is [Hkv, blocks, block_size, d]; reshape it to [Hkv, blocks * block_size, d] as it is, so "
         "block by block and slot by slot is position order (a transpose first interleaves the blocks)"),
    Slip("table reversed", lambda pool, table, S: _read(pool, table[::-1], S),
         "for {case} the blocks come out in reverse order",
         "the table lists a sequence's blocks oldest first: table[0] holds positions 0 .. block_size - 1"),
    Slip("one short", lambda pool, table, S: _read(pool, table, S - 1) if S else None,
         "for {case} the last position is missing", "S positions: 0 .. S - 1, so [:, :S]"),
]


@checker
def check_read_pages(fn):
    """fn(pool, table, S) -> [Hkv, S, d]: a sequence's keys in position order, read from a pool
    [Hkv, n_blocks, block_size, d] through its block table (position p in block table[p // block_size], slot
    p % block_size)."""
    rng = np.random.default_rng(9)
    for case, Hkv, n, bs, d, table, S, dtype in _PAGE_CASES:
        pool = rng.standard_normal((Hkv, n, bs, d)).astype(dtype)
        given = pool.copy()
        got = as_array(run(fn, given, list(table), S, case=case), case)
        if not np.array_equal(given, pool):
            reject(f"for {case} your function changed the pool", "read it; every sequence's keys live there")
        want = _read(pool, table, S)
        if got.dtype != want.dtype:
            reject(f"for {case} the keys are {got.dtype}; expected {want.dtype}",
                   "indexing and reshaping keep the pool's dtype: something cast it")
        if got.shape == want.shape and np.array_equal(got, want):
            continue
        slip = first_slip(got, _PAGE_SLIPS, (pool, table, S), same=lambda g, w: g.shape == w.shape
                          and np.array_equal(g, w))
        if slip is not None:
            reject_slip(slip, case)
        if got.shape != want.shape:
            reject(f"for {case} the keys have shape {got.shape}; expected {want.shape}", "[Hkv, S, d]")
        p = int(np.flatnonzero((got != want).any(axis=(0, 2)))[0])
        reject(f"for {case} position {p} holds the wrong key",
               f"position {p} is in block table[{p} // {bs}] = {table[p // bs]}, slot {p} % {bs} = {p % bs}")
    return passed("positions come out in order from the blocks the table names, S of them, in the pool's dtype")


# ------------------------------------------------------------------------------------- what a block size costs

def _paging_cases():
    """(what, lengths, block_size): exact multiples, an empty sequence, blocks of one slot, one block for all."""
    mix = np.random.default_rng(21).lognormal(np.log(120), 1.0, 64).round().astype(int)  # a long tail of lengths
    return [
        ("lengths [5, 16, 17, 1, 0] in blocks of 4", [5, 16, 17, 1, 0], 4),
        ("the same lengths in blocks of 16", [5, 16, 17, 1, 0], 16),
        ("lengths that fill their blocks, [64, 32, 96] in blocks of 32", [64, 32, 96], 32),
        ("blocks of one slot, lengths [100, 3]", [100, 3], 1),
        ("one short sequence in a block of 256, lengths [7]", [7], 256),
        ("64 lengths with a long tail in blocks of 16", mix.tolist(), 16),
        ("the same 64 in blocks of 128", mix.tolist(), 128),
    ]


def _ceil_blocks(lengths, block_size):
    """[n] lengths -> [n] blocks: a sequence takes ceil(L / block_size) blocks; an empty one takes none."""
    return -(-np.asarray(lengths) // block_size)


def _paging_cost(lengths, block_size):
    """-> (share of the handed-out slots that hold no token, mean blocks per block table)."""
    blocks = _ceil_blocks(lengths, block_size)
    return 1 - np.sum(lengths) / (block_size * blocks.sum()), blocks.mean()


def _blocks_cost(blocks):
    """A wrong block count -> the (waste, table length) it leads to."""
    def cost(lengths, block_size):
        L, n = np.asarray(lengths), blocks(np.asarray(lengths), block_size)
        return 1 - L.sum() / (block_size * n.sum()), n.mean()
    return cost


_WASTE_SLIPS = [
    Slip("floor", _blocks_cost(lambda L, bs: L // bs), "for {case} the last, partly filled block of each sequence "
         "is missing", "a sequence of L positions needs ceil(L / block_size) blocks: -(-L // block_size) in integers; "
         "L // block_size leaves out the last block whenever L is not a multiple"),
    Slip("one more", _blocks_cost(lambda L, bs: L // bs + 1), "for {case} a sequence that fills its blocks exactly "
         "gets one block too many", "L // block_size + 1 is ceil(L / block_size) only when L is not a multiple of "
         "the block size: use -(-L // block_size)"),
    Slip("fractions", _blocks_cost(lambda L, bs: L / bs), "for {case} the blocks are fractions, so nothing is wasted",
         "a block is taken whole: round L / block_size up"),
    Slip("empty takes a block", _blocks_cost(lambda L, bs: np.maximum(_ceil_blocks(L, bs), 1)),
         "for {case} an empty sequence holds a block", "a sequence takes its first block with its first position "
                                                       "(lesson 09's pool: no memory until the first append)"),
    Slip("mean of ratios", lambda L, bs: (np.mean([1 - n / (bs * -(-n // bs)) for n in L if n]),
                                          _ceil_blocks(L, bs).mean()),
         "for {case} the waste is each sequence's share averaged, so a short sequence counts as much as a long one",
         "the memory wasted is a share of all the slots handed out: 1 - total positions / total slots"),
    Slip("per token", lambda L, bs: (_paging_cost(L, bs)[0] / (1 - _paging_cost(L, bs)[0]), _paging_cost(L, bs)[1]),
         "for {case} the empty slots are counted against the tokens, not against the slots",
         "waste is the share of the reserved memory that holds no token: empty slots / slots handed out"),
    Slip("percent", lambda L, bs: (100 * _paging_cost(L, bs)[0], _paging_cost(L, bs)[1]),
         "for {case} the waste is a percentage", "return the share itself, between 0 and 1: 0.25, not 25"),
]

_TABLE_SLIPS = [
    Slip("total", lambda L, bs: (None, _ceil_blocks(L, bs).sum()),
         "for {case} the table length is the blocks of all sequences together",
         "each sequence has its own block table: the mean over sequences of ceil(L / block_size)"),
    Slip("longest", lambda L, bs: (None, _ceil_blocks(L, bs).max()),
         "for {case} the table length is the longest table's", "the mean over sequences, not the maximum"),
    Slip("positions", lambda L, bs: (None, np.mean(L) / bs),
         "for {case} the table length is the mean length over the block size, not rounded per sequence",
         "each table holds whole blocks: average ceil(L / block_size), one per sequence"),
]


def _pair(got, case):
    pair = isinstance(got, (tuple, list)) or (isinstance(got, np.ndarray) and got.ndim == 1)
    if not pair or len(got) != 2:
        reject(f"for {case} your function returned {type(got).__name__ if got is not None else 'None'}; expected "
               "two numbers, (waste, table_length)", "return a tuple: return waste, table_length")
    return (as_number(got[0], case, "your waste"), as_number(got[1], case, "your table length"))


@checker
def check_paging_cost(fn):
    """fn(lengths, block_size) -> (waste, table_length) for sequences of those lengths in a paged pool: waste, the
    share of the slots the pool hands out that hold no token; table_length, the mean number of blocks per block
    table."""
    for case, lengths, bs in _paging_cases():
        got = _pair(run(fn, np.array(lengths), bs, case=case), case)
        want = _paging_cost(lengths, bs)
        for part, slips, what in ((0, _WASTE_SLIPS, "the waste"), (1, _TABLE_SLIPS + _WASTE_SLIPS, "the table length")):
            if math.isclose(got[part], want[part], rel_tol=1e-9, abs_tol=1e-12):
                continue
            slip = first_slip(got, slips, (lengths, bs), same=lambda g, w, part=part: w[part] is not None
                              and math.isclose(g[part], float(w[part]), rel_tol=1e-9, abs_tol=1e-12))
            if slip is not None:
                reject_slip(slip, case)
            yours, expected = distinct_digits(got[part], float(want[part]))
            reject(f"for {case} {what} is {yours}; expected {expected}",
                   "count each sequence's blocks, ceil(L / block_size); the slots handed out are blocks x "
                   "block_size, the tokens are the sum of the lengths" if part == 0 else
                   "the mean over sequences of the blocks each one's table holds")
    return passed("blocks are counted whole, per sequence; waste is a share of all the slots handed out; a table "
                  "holds one entry per block")


# ------------------------------------------------------------------------------------------ copy-on-write

_COW_HINT = ("a write must never land in a block another sequence reads: when the last block is partly filled and "
             "shared (refs > 1), take a free block, copy the old one into it, give the old block's reference back "
             "and put the copy in this sequence's table before anything is written")

# The checker's pool: 2 KV heads, d = 3, and values that are not the keys, so a copy that leaves out the values or a
# KV head leaves the sequence reading something it never wrote.
_COW_HKV, _COW_D = 2, 3


@checker
def check_copy_on_write(cls):
    """cls: a PagedKVCache subclass with its own reserve(seq, T) -> (blocks [T], slots [T]). The checker forks,
    appends and frees, and compares every sequence's keys and values, the reference counts and the free blocks
    with what kvlesson's pool holds after the same calls."""
    for name, script in _COW_SCRIPTS:
        _cow_script(cls, name, script)
    return passed("a shared, partly filled block is copied, keys and values of every KV head, by whoever writes "
                  "first; full shared blocks stay shared; every block comes back; running out changes nothing")


_COW_SCRIPTS = [  # (what, [(op, sequence, T)]): sequence 0 is made first; forks name their parent
    ("fork mid-block, parent then child append", [("append", 0, 6), ("fork", 0, 0), ("append", 0, 1),
                                                  ("append", 1, 1), ("append", 1, 3), ("free", 0, 0)]),
    ("fork at a block boundary", [("append", 0, 8), ("fork", 0, 0), ("append", 1, 2), ("append", 0, 1)]),
    ("child writes first, then the parent alone", [("append", 0, 3), ("fork", 0, 0), ("append", 1, 2),
                                                   ("append", 0, 2), ("free", 1, 0), ("append", 0, 3)]),
    ("three sharers", [("append", 0, 5), ("fork", 0, 0), ("fork", 0, 0), ("append", 2, 1), ("append", 1, 1),
                       ("append", 0, 1), ("free", 2, 0), ("free", 1, 0)]),
    ("an empty append to a shared block", [("append", 0, 2), ("fork", 0, 0), ("append", 1, 0), ("append", 0, 0)]),
    ("a sequence of its own, partly filled", [("append", 0, 2), ("append", 0, 1), ("fork", 0, 0), ("free", 1, 0),
                                              ("append", 0, 2)]),
    ("running out of blocks", [("append", 0, 11), ("fork", 0, 0), ("append", 1, 2), ("append", 1, 1)]),
]


def _blocks(n):
    return f"{n} free block{'' if n == 1 else 's'}"


def _cow_script(cls, name, script, n_blocks=4, block_size=4):
    yours = run(cls, n_blocks, block_size, _COW_HKV, _COW_D, case=f"{name}: making the pool")
    if not isinstance(yours, PagedKVCache):
        reject(f"{name}: your class made a {type(yours).__name__}, not a PagedKVCache",
               "write class MyPool(PagedKVCache) and override reserve only, so the rest of the pool is kvlesson's")
    ours, rng = PagedKVCache(n_blocks, block_size, _COW_HKV, _COW_D), np.random.default_rng(3)
    seqs = [(run(yours.new_sequence, case=name), ours.new_sequence())]
    for n, (op, i, T) in enumerate(script):
        case = f"{name}, step {n + 1} ({op} {'sequence ' + str(i)}{f', T={T}' if op == 'append' else ''})"
        y, o = seqs[i]
        write = None
        if op == "fork":
            seqs.append((run(yours.fork, y, case=case), ours.fork(o)))
        elif op == "free":
            run(yours.free, y, case=case)
            ours.free(o)
        else:
            k, v = rng.standard_normal((2, _COW_HKV, T, _COW_D))  # [Hkv, T, d] each, values unlike the keys
            L, table = ours.length(o), ours.block_table(o)
            write = dict(T=T, partial=L % block_size != 0, shared=bool(table) and ours.refs[table[-1]] > 1,
                         extra=lambda: len(yours.block_table(y)) - len(ours.block_table(o)))  # noqa: B023
            try:
                ours.sequence(o).append(k, v)
            except ValueError:
                _refused(yours, y, k, v, case)
                continue
            run(lambda: yours.sequence(y).append(k, v), case=case)  # noqa: B023  called right here
        _compare(yours, ours, seqs, case, op == "free", write)
    for y, o in seqs:  # the end: free everything that is left; every block must come back
        if o in ours._tables:
            run(yours.free, y, case=f"{name}, freeing what is left")
            ours.free(o)
    _compare(yours, ours, seqs, f"{name}, once every sequence is freed", True)


def _refused(yours, seq, k, v, case):
    before = [(yours.block_table(s), *(a.copy() for a in yours.gather(s))) for s in list(yours._tables)]
    free = attribute(yours, "blocks_free", case, "your pool")
    try:
        yours.sequence(seq).append(k, v)
    except ValueError:
        after = [(yours.block_table(s), *yours.gather(s)) for s in list(yours._tables)]
        same = len(before) == len(after) and all(
            a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
            for a, b in zip(before, after, strict=True))
        if not same or attribute(yours, "blocks_free", case, "your pool") != free:
            reject(f"for {case} your pool raised ValueError but changed state first",
                   "count the blocks you need (new ones, plus one if you must copy) and raise before taking any")
        return
    except Exception as e:
        reject(f"for {case} your pool raised {type(e).__name__}, not ValueError", "raise ValueError when out of blocks")
    reject(f"for {case} the pool has too few free blocks, and your append went through",
           "raise ValueError, changing nothing, when new blocks plus a copy exceed blocks_free")


def _compare(yours, ours, seqs, case, after_free, write=None):
    for n, (y, o) in enumerate(seqs):
        if o in ours._tables:
            _same_cache(yours, ours, y, o, n, case)
    pointers = {}
    for table in yours._tables.values():
        for b in table:
            pointers[b] = pointers.get(b, 0) + 1
    for b, count in enumerate(yours.refs):
        tables = pointers.get(b, 0)
        if count > tables:
            reject(f"after {case} block {b} has refs {count}, but {tables} block tables point at it",
                   "when you copy, the old block loses a user and the copy gains one: refs[old] -= 1 and refs[new] "
                   "= 1; a count left too high keeps the block from ever coming back, and makes later writes copy "
                   "a block nobody else uses")
        if count < tables:
            reject(f"after {case} block {b} has refs {count}, but {tables} block tables point at it",
                   "the copy must take the old block's place in this sequence's table (table[-1] = new): a table "
                   "that still points at the old block writes into it, and its count no longer covers the tables")
    free, want = attribute(yours, "blocks_free", case, "your pool"), ours.blocks_free
    if free == want:
        return
    if free > want:
        reject(f"after {case} your pool has {_blocks(free)}; {want} should be free",
               "more blocks are free than should be: a shared, partly filled block was written in place instead of "
               "copied, or a block went back to the free list while a table still points at it")
    reject(f"after {case} your pool has {_blocks(free)}; it needs only {ours.n_blocks - want} in use, so "
           f"{want} should be free", _overdraw_hint(after_free, write))


def _overdraw_hint(after_free, write):
    """Why a pool holds more blocks than kvlesson's, from what the last step was."""
    if after_free or write is None:
        return "when you copy, the old block loses a user: refs[old] -= 1, or it never comes back to the pool"
    if write["T"] == 0:
        return "an append of T = 0 positions writes nothing: it needs no copy and no new block"
    if write["extra"]() > 0:
        return ("the table grew by more blocks than the new positions need: a sequence of L + T positions holds "
                "ceil((L + T) / block_size) blocks")
    if write["shared"] and not write["partial"]:
        return ("the sequence's last block was full: nobody will write into it again, so it can stay shared; only a "
                "partly filled shared block must be copied")
    if not write["shared"]:
        return ("no other sequence reads this sequence's last block (refs == 1): write into it in place; a copy is "
                "only for a block another sequence shares")
    return ("a write takes at most one copy (the shared, partly filled last block) and ceil((L + T) / block_size) - "
            "len(table) new blocks past the end: count both before taking any")


def _same_cache(yours, ours, y, o, n, case):
    """Sequence n's keys and values in your pool against kvlesson's; the hint says which part went wrong."""
    got = run(lambda: yours.gather(y), case=case)  # noqa: B023  called right here
    if not isinstance(got, tuple) or len(got) != 2:
        reject(f"after {case} your pool's gather returned {type(got).__name__}", "override reserve only")
    K, V = (as_array(a, case, "your pool's gather") for a in got)
    K0, V0 = ours.gather(o)
    if K.shape != K0.shape or V.shape != V0.shape:
        reject(f"after {case} sequence {n} holds {K.shape[1] if K.ndim == 3 else '?'} positions; expected "
               f"{K0.shape[1]}", "reserve grows the sequence by exactly T positions")
    bad_k = ~np.all(K == K0, axis=(1, 2))  # [Hkv]: a KV head whose keys are wrong
    bad_v = ~np.all(V == V0, axis=(1, 2))
    if not (bad_k.any() or bad_v.any()):
        return
    if bad_v.any() and not bad_k.any():
        reject(f"after {case} sequence {n}'s keys are right but its values are not",
               "the copy must carry the values too: self.v[:, new] = self.v[:, old], beside the keys")
    if (bad_k | bad_v)[0] == 0 and (bad_k | bad_v).any():
        reject(f"after {case} sequence {n}'s KV head 0 is right, but KV head {int(np.flatnonzero(bad_k | bad_v)[0])} "
               "is not", "a block holds every KV head: the pool is [Hkv, n_blocks, block_size, d], so copy "
                         "self.k[:, new] = self.k[:, old] (all heads, block axis 1), and the same for self.v")
    reject(f"after {case} sequence {n}'s keys are wrong: a write went into a block that another sequence "
           "shares, or the copy is not what the old block held", _COW_HINT)


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_pad_mask.reference = pad_mask
check_read_pages.reference = _read
check_pad_positions.reference = pad_positions
check_paging_cost.reference = _paging_cost
check_copy_on_write.reference = PagedKVCache
