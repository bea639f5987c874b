"""Checkers for lesson 09: the pad-aware mask of a padded batch, reading a sequence's keys through its block table,
and copy-on-write in a paged pool.

Each runs the learner's code on seeded cases, rejects any answer that differs from kvlesson's, and then compares the
answer with the classic slips to say why: pads left visible, the diagonal anchored at the top left, a pad row left
empty; logical blocks read instead of physical ones, whole blocks handed back; a shared block written in place, a
full block copied for nothing, a copy whose reference count is never given back.
"""
import numpy as np

from kvlesson.sdpa import causal_mask
from kvlesson.serving.padding import pad_mask
from kvlesson.serving.paged import PagedKVCache
from kvlesson.teaching.verdict import Slip, as_array, attribute, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_pad_mask", "check_read_pages", "check_copy_on_write"]


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


# ------------------------------------------------------------------------------------------ copy-on-write

_COW_HINT = ("before writing into a sequence's last block, check whether it is partly filled (length % block_size "
             "!= 0) and shared (refs > 1); if so, take a free block, copy the old one into it, give the old block's "
             "reference back and put the copy in this sequence's table")


@checker
def check_copy_on_write(cls):
    """cls: a PagedKVCache subclass with its own reserve(seq, T) -> (blocks [T], slots [T]). The checker forks,
    appends and frees, and compares every sequence with what kvlesson's pool holds after the same calls."""
    for name, script in _COW_SCRIPTS:
        _cow_script(cls, name, script)
    return passed("a shared, partly filled block is copied by whoever writes first; full shared blocks stay shared; "
                  "every block comes back; running out changes nothing")


_COW_SCRIPTS = [  # (what, [(op, sequence, T)]): sequence 0 is made first; forks name their parent
    ("fork mid-block, parent then child append", [("append", 0, 6), ("fork", 0, 0), ("append", 0, 1),
                                                  ("append", 1, 1), ("append", 1, 3), ("free", 0, 0)]),
    ("fork at a block boundary", [("append", 0, 8), ("fork", 0, 0), ("append", 1, 2), ("append", 0, 1)]),
    ("child writes first, then the parent alone", [("append", 0, 3), ("fork", 0, 0), ("append", 1, 2),
                                                   ("append", 0, 2), ("free", 1, 0), ("append", 0, 3)]),
    ("three sharers", [("append", 0, 5), ("fork", 0, 0), ("fork", 0, 0), ("append", 2, 1), ("append", 1, 1),
                       ("append", 0, 1), ("free", 2, 0), ("free", 1, 0)]),
    ("an empty append to a shared block", [("append", 0, 2), ("fork", 0, 0), ("append", 1, 0), ("append", 0, 0)]),
    ("running out of blocks", [("append", 0, 11), ("fork", 0, 0), ("append", 1, 2), ("append", 1, 1)]),
]


def _cow_script(cls, name, script, n_blocks=4, block_size=4):
    yours = run(cls, n_blocks, block_size, 1, 1, case=f"{name}: making the pool")
    if not isinstance(yours, PagedKVCache):
        reject(f"{name}: your class made a {type(yours).__name__}, not a PagedKVCache",
               "write class MyPool(PagedKVCache) and override reserve only, so the rest of the pool is kvlesson's")
    ours, rng = PagedKVCache(n_blocks, block_size, 1, 1), np.random.default_rng(3)
    seqs = [(run(yours.new_sequence, case=name), ours.new_sequence())]
    for n, (op, i, T) in enumerate(script):
        case = f"{name}, step {n + 1} ({op} {'sequence ' + str(i)}{f', T={T}' if op == 'append' else ''})"
        y, o = seqs[i]
        if op == "fork":
            seqs.append((run(yours.fork, y, case=case), ours.fork(o)))
        elif op == "free":
            run(yours.free, y, case=case)
            ours.free(o)
        else:
            k = rng.standard_normal((1, T, 1))
            try:
                ours.sequence(o).append(k, k)
            except ValueError:
                _refused(yours, y, k, case)
                continue
            run(lambda: yours.sequence(y).append(k, k), case=case)  # noqa: B023  called right here
        _compare(yours, ours, seqs, case, op == "free")
    for y, o in seqs:  # the end: free everything that is left; every block must come back
        if o in ours._tables:
            run(yours.free, y, case=f"{name}, freeing what is left")
            ours.free(o)
    _compare(yours, ours, seqs, f"{name}, once every sequence is freed", True)


def _refused(yours, seq, k, case):
    before = [(yours.block_table(s), *(a.copy() for a in yours.gather(s))) for s in list(yours._tables)]
    free = attribute(yours, "blocks_free", case, "your pool")
    try:
        yours.sequence(seq).append(k, k)
    except ValueError:
        after = [(yours.block_table(s), *yours.gather(s)) for s in list(yours._tables)]
        same = len(before) == len(after) and all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in
                                                  zip(before, after, strict=True))
        if not same or attribute(yours, "blocks_free", case, "your pool") != free:
            reject(f"for {case} your pool raised ValueError but changed state first",
                   "count the blocks you need (new ones, plus one if you must copy) and raise before taking any")
        return
    except Exception as e:
        reject(f"for {case} your pool raised {type(e).__name__}, not ValueError", "raise ValueError when out of blocks")
    reject(f"for {case} the pool has too few free blocks, and your append went through",
           "raise ValueError, changing nothing, when new blocks plus a copy exceed blocks_free")


def _compare(yours, ours, seqs, case, after_free):
    for n, (y, o) in enumerate(seqs):
        if o not in ours._tables:
            continue
        K = as_array(run(lambda: yours.gather(y)[0], case=case), case, "your pool's gather")  # noqa: B023
        if K.shape != ours.gather(o)[0].shape or not np.array_equal(K, ours.gather(o)[0]):
            reject(f"after {case} sequence {n}'s keys are wrong: a write went into a block that another sequence "
                   "shares", _COW_HINT)
    pointers = {}
    for table in yours._tables.values():
        for b in table:
            pointers[b] = pointers.get(b, 0) + 1
    for b, count in enumerate(yours.refs):
        if count != pointers.get(b, 0):
            reject(f"after {case} block {b} has refs {count}, but {pointers.get(b, 0)} block tables point at it",
                   "when you copy, the old block loses a user and the copy gains one: refs[old] -= 1 and refs[new] "
                   "= 1; a count left too high keeps the block from ever coming back, and makes later writes copy "
                   "a block nobody else uses")
    free, want = attribute(yours, "blocks_free", case, "your pool"), ours.blocks_free
    if free == want:
        return
    if free < want:
        hint = ("a full shared block is never written again, so it can stay shared: copy only a partly filled one"
                if not after_free else "when you copy, the old block loses a user: refs[old] -= 1, or it never "
                                       "comes back to the pool")
        reject(f"after {case} your pool has {free} free blocks; it needs only {ours.n_blocks - want} in use, so "
               f"{want} should be free", hint)
    reject(f"after {case} your pool has {free} free blocks; {want} should be free",
           "more blocks are free than should be: a shared, partly filled block was written in place instead of "
           "copied, or a block went back to the free list while a table still points at it")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_pad_mask.reference = pad_mask
check_read_pages.reference = _read
check_copy_on_write.reference = PagedKVCache
