"""The lesson 09 checkers pass kvlesson's own answers and name each typical mistake."""
import math

import numpy as np
import pytest

from kvlesson.sdpa import causal_mask
from kvlesson.serving.padding import pad_mask, pad_positions
from kvlesson.serving.paged import PagedKVCache
from kvlesson.teaching.checks import (
    check_copy_on_write,
    check_pad_mask,
    check_pad_positions,
    check_paging_cost,
    check_read_pages,
)
from tests.helpers import reserve_without_copy


def todo(*args, **kwargs):
    raise NotImplementedError("your turn")


# ---- the pad mask


def cols(pads, T, S):
    return np.arange(S - T, S)[None, :, None], np.arange(S)[None, None, :], np.asarray(pads)[:, None, None]


def real_only(pads, T, S):
    """Right for real queries, but pad queries see nothing: the NaN trap."""
    q, k, first = cols(pads, T, S)
    return causal_mask(T, S)[None] & (k >= first)


def pads_see_everything(pads, T, S):
    """Pad rows that see every key before them: finite, and as good as kvlesson's for the real rows."""
    q, k, first = cols(pads, T, S)
    return pad_mask(pads, T, S) | ((q < first) & (k <= q))


def test_pad_mask_checker_passes_the_package_and_any_finite_pad_rows():
    assert check_pad_mask(pad_mask)
    assert check_pad_mask(pads_see_everything)


@pytest.mark.parametrize("wrong, words", [
    (lambda p, T, S: np.broadcast_to(causal_mask(T, S), (len(p), T, S)), "real queries can see pad keys"),
    (lambda p, T, S: np.tril(np.ones((T, S), bool))[None] & (cols(p, T, S)[1] >= cols(p, T, S)[2]),
     "anchored at the top left"),
    (lambda p, T, S: causal_mask(T, S)[None] & (cols(p, T, S)[1] > cols(p, T, S)[2]), "first real key is hidden"),
    (lambda p, T, S: causal_mask(T, S)[None] & (cols(p, T, S)[1] < S - cols(p, T, S)[2]), "hides the last keys"),
    (real_only, "is a pad and sees no key at all"),
    (lambda p, T, S: pad_mask(p, T, S).astype(int), "expected bool"),
    (lambda p, T, S: causal_mask(T, S), "expected (3, 4, 4)"),
    (lambda p, T, S: pad_mask(p, T, S).transpose(0, 2, 1), "sees keys [0, 1, 2, 3]; it should see [0]"),
    (lambda p, T, S: None, "returned None"),
    (lambda p, T, S: pad_mask(p, T, S) & (cols(p, T, S)[1] > 0), "query 0 of sequence 0"),
])
def test_pad_mask_checker_names_the_mistake(wrong, words):
    verdict = check_pad_mask(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ---- the positions of a padded batch


def pos_cols(pads, T, S):
    return np.arange(S - T, S)[None, :], np.asarray(pads)[:, None]


def pads_at_minus_one(pads, T, S):
    """Right for real columns; pad columns get -1 (any whole number will do: nothing real reads them)."""
    col, first = pos_cols(pads, T, S)
    return np.where(col >= first, col - first, -1)


def test_pad_positions_checker_passes_the_package_and_any_whole_pad_positions():
    assert check_pad_positions(pad_positions)
    assert check_pad_positions(pads_at_minus_one)
    assert check_pad_positions(lambda p, T, S: pos_cols(p, T, S)[0] - pos_cols(p, T, S)[1])  # negative pads


@pytest.mark.parametrize("wrong, words", [
    (lambda p, T, S: np.broadcast_to(pos_cols(p, T, S)[0], (len(p), T)), "the positions are the columns"),
    (lambda p, T, S: np.broadcast_to(np.arange(T), (len(p), T)) - pos_cols(p, T, S)[1],
     "leave out the columns already in the batch"),
    (lambda p, T, S: np.where(T == S, np.arange(T) - pos_cols(p, T, S)[1], np.arange(T)[None, :] + 0 * p[:, None]),
     "start again at 0 in every step"),
    (lambda p, T, S: pos_cols(p, T, S)[0] - pos_cols(p, T, S)[1] + 1, "one too high"),
    (lambda p, T, S: pos_cols(p, T, S)[0] - pos_cols(p, T, S)[1] - 1, "one too low"),
    (lambda p, T, S: np.broadcast_to(S - 1 - pos_cols(p, T, S)[0], (len(p), T)) - 0, "count down"),
    (lambda p, T, S: np.maximum(pos_cols(p, T, S)[0] - pos_cols(p, T, S)[1], 0).T, "not [T, B]"),
    (lambda p, T, S: pad_positions(p, T, S)[:, :1], "expected (3, 5)"),
    (lambda p, T, S: pad_positions(p, T, S).astype(float), "expected integers"),
    (lambda p, T, S: pad_positions(p, T, S) * (pos_cols(p, T, S)[0] < S - 1), "gets position 0"),
    (lambda p, T, S: pad_positions(p, T, S) + (T == 1), "a decode step"),  # right for prefills only
    (lambda p, T, S: None, "returned None"),
])
def test_pad_positions_checker_names_the_mistake(wrong, words):
    verdict = check_pad_positions(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_the_pad_positions_checker_does_not_let_its_pads_be_changed_to_pass():
    def zero_the_pads(p, T, S):
        p[:] = 0
        return np.broadcast_to(np.arange(S - T, S), (len(p), T))
    assert not check_pad_positions(zero_the_pads)


# ---- what a block size costs


def paging_cost(lengths, block_size):
    blocks = -(-np.asarray(lengths) // block_size)
    return 1 - np.sum(lengths) / (block_size * blocks.sum()), blocks.mean()


def test_paging_cost_checker_passes_the_reference_in_any_form():
    assert check_paging_cost(paging_cost)
    assert check_paging_cost(lambda L, bs: list(paging_cost(L, bs)))  # a list of two numbers is a pair too
    assert check_paging_cost(lambda L, bs: (float(sum(b * bs - n for n, b in ((n, math.ceil(n / bs)) for n in L)))
                                            / (bs * sum(math.ceil(n / bs) for n in L)),
                                            sum(math.ceil(n / bs) for n in L) / len(L)))  # Python, no numpy


def with_blocks(blocks):
    def cost(L, bs):
        L = np.asarray(L)
        n = blocks(L, bs)
        return 1 - L.sum() / (bs * n.sum()), n.mean()
    return cost


@pytest.mark.parametrize("wrong, words", [
    (with_blocks(lambda L, bs: L // bs), "partly filled block of each sequence is missing"),
    (with_blocks(lambda L, bs: L // bs + 1), "one block too many"),
    (with_blocks(lambda L, bs: L / bs), "the blocks are fractions"),
    (with_blocks(lambda L, bs: np.maximum(-(-L // bs), 1)), "an empty sequence holds a block"),
    (lambda L, bs: (np.mean([1 - n / (bs * math.ceil(n / bs)) for n in L if n]), paging_cost(L, bs)[1]),
     "each sequence's share averaged"),
    (lambda L, bs: ((bs * (-(-L // bs)).sum() - L.sum()) / L.sum(), paging_cost(L, bs)[1]),
     "counted against the tokens"),
    (lambda L, bs: (paging_cost(L, bs)[0], (-(-L // bs)).sum()), "blocks of all sequences together"),
    (lambda L, bs: (paging_cost(L, bs)[0], (-(-L // bs)).max()), "the longest table's"),
    (lambda L, bs: (paging_cost(L, bs)[0], L.mean() / bs), "not rounded per sequence"),
    (lambda L, bs: (100 * paging_cost(L, bs)[0], paging_cost(L, bs)[1]), "the waste is a percentage"),
    (lambda L, bs: (paging_cost(L, bs)[0] + 1e-3, paging_cost(L, bs)[1]), "the waste is 0.1885; expected 0.1875"),
    (lambda L, bs: paging_cost(L, bs)[0], "expected two numbers"),
    (lambda L, bs: f"{paging_cost(L, bs)}", "expected two numbers"),
    (lambda L, bs: (float("nan"), 1.0), "returned nan"),
    (lambda L, bs: (paging_cost(L, bs)[0], paging_cost(L, bs)[1], 0), "expected two numbers"),
    (lambda L, bs: np.array(paging_cost(L, bs)[0]), "expected two numbers"),  # a 0-d array has no length
    (lambda L, bs: np.array([paging_cost(L, bs)]), "expected two numbers"),  # [1, 2]: one row of two
])
def test_paging_cost_checker_names_the_mistake(wrong, words):
    verdict = check_paging_cost(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ---- reading pages


def read_pages(pool, table, S):
    Hkv, _, bs, d = pool.shape
    return pool[:, table].reshape(Hkv, len(table) * bs, d)[:, :S]


def test_read_pages_checker_passes_the_reference():
    assert check_read_pages(read_pages)


def mutating(pool, table, S):
    out = read_pages(pool, table, S).copy()
    pool[...] = 0
    return out


@pytest.mark.parametrize("wrong, words", [
    (lambda pool, table, S: read_pages(pool, list(range(len(table))), S), "not the blocks the table names"),
    (lambda pool, table, S: read_pages(pool, table, len(table) * pool.shape[2]), "every slot of every block"),
    (lambda pool, table, S: pool[:, table].transpose(0, 2, 1, 3).reshape(pool.shape[0], -1, pool.shape[3])[:, :S],
     "wrong order"),
    (lambda pool, table, S: read_pages(pool, table[::-1], S), "reverse order"),
    (lambda pool, table, S: read_pages(pool, table, S - 1), "last position is missing"),
    (lambda pool, table, S: read_pages(pool, table, S).astype(np.float64), "expected float32"),
    (mutating, "changed the pool"),
    (lambda pool, table, S: read_pages(pool, table, S) + (np.arange(S)[None, :, None] == S - 1),
     "holds the wrong key"),
    (lambda pool, table, S: pool[:, table[0]], "the keys have shape (2, 4, 3); expected (2, 10, 3)"),
])
def test_read_pages_checker_names_the_mistake(wrong, words):
    verdict = check_read_pages(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_the_first_table_that_is_not_in_order_catches_logical_blocks():
    verdict = check_read_pages(lambda pool, table, S: read_pages(pool, list(range(len(table))), S))
    assert "a table [3, 0, 5]" in repr(verdict)


# ---- copy-on-write


class NoCopy(PagedKVCache):
    """The bug of the lesson: writes into a shared, partly filled block in place (the mutant test_many_mutants
    swaps into PagedKVCache)."""

    reserve = reserve_without_copy


class CopiesFullBlocks(PagedKVCache):
    """Copies the last block whenever it is shared, full or not: right keys, wasted blocks."""

    def reserve(self, seq, T):
        table = self._table(seq)
        if T and table and self.refs[table[-1]] > 1 and self._lens[seq] % self.block_size == 0:
            if not self._free:
                raise ValueError("out of blocks")
            old, new = table[-1], self._take()
            self.k[:, new], self.v[:, new] = self.k[:, old], self.v[:, old]
            self.refs[old] -= 1
            table[-1] = new
        return super().reserve(seq, T)


class KeepsTheOldReference(PagedKVCache):
    """Copies on write but never gives the old block's reference back: it never returns to the pool."""

    def reserve(self, seq, T):
        table, L = self._table(seq), self._lens[seq]
        shared = T and L % self.block_size and self.refs[table[-1]] > 1
        old = table[-1] if shared else None
        out = super().reserve(seq, T)
        if shared:
            self.refs[old] += 1
        return out


class ChecksTooLate(PagedKVCache):
    """Takes the copy's block before it knows the new blocks will not fit."""

    def reserve(self, seq, T):
        table, L, bs = self._table(seq), self._lens[seq], self.block_size
        if T and L % bs and self.refs[table[-1]] > 1 and self._free:
            old, new = table[-1], self._take()
            self.k[:, new], self.v[:, new] = self.k[:, old], self.v[:, old]
            self.refs[old] -= 1
            table[-1] = new
        return super().reserve(seq, T)


class NeverRefuses(PagedKVCache):
    def reserve(self, seq, T):
        try:
            return super().reserve(seq, T)
        except ValueError:
            return np.zeros(T, np.intp), np.zeros(T, np.intp)


class Stub(PagedKVCache):
    def reserve(self, seq, T):
        raise NotImplementedError("your turn")


def cow(when=lambda T, partial, shared: T > 0 and partial and shared, copy=None, fresh=None, swap=True):
    """A reserve in the lesson's shape with one part swapped: when it copies, what it copies, how many new blocks it
    counts, whether the copy goes into the table."""
    def copy_all(pool, old, new):
        pool.k[:, new], pool.v[:, new] = pool.k[:, old], pool.v[:, old]

    def reserve(self, seq, T):
        table, L, bs = self._table(seq), self._lens[seq], self.block_size
        copy = bool(table) and when(T, L % bs != 0, self.refs[table[-1]] > 1)
        new_blocks = (fresh or (lambda L, T, bs: -(-(L + T) // bs)))(L, T, bs) - len(table)
        if new_blocks + copy > self.blocks_free:
            raise ValueError("out of blocks")
        if copy:
            old, new = table[-1], self._take()
            (copy_fn or copy_all)(self, old, new)
            self.refs[old] -= 1
            if swap:
                table[-1] = new
        table.extend(self._take() for _ in range(max(new_blocks, 0)))
        self._lens[seq] = L + T
        p = np.arange(L, L + T)
        return np.asarray(table, dtype=np.intp)[p // bs], p % bs

    copy_fn = copy
    return type("Cow", (PagedKVCache,), {"reserve": reserve})


def keys_only(pool, old, new):
    pool.k[:, new] = pool.k[:, old]


def head_zero_only(pool, old, new):
    pool.k[0, new], pool.v[0, new] = pool.k[0, old], pool.v[0, old]


def block_axis_first(pool, old, new):
    pool.k[new], pool.v[new] = pool.k[old], pool.v[old]  # the pool is [Hkv, n_blocks, ...]: this copies heads


def test_the_lesson_shaped_reserve_passes():
    assert check_copy_on_write(cow())


@pytest.mark.parametrize("wrong, words", [
    (cow(copy=keys_only), "keys are right but its values are not"),
    (cow(copy=head_zero_only), "KV head 0 is right, but KV head 1 is not"),
    (cow(copy=block_axis_first), "raised IndexError"),
    (cow(when=lambda T, partial, shared: T > 0 and partial), "no other sequence reads this sequence's last block"),
    (cow(when=lambda T, partial, shared: partial and shared), "an append of T = 0 positions writes nothing"),
    (cow(when=lambda T, partial, shared: T > 0 and shared), "nobody will write into it again"),
    (cow(swap=False), "the copy must take the old block's place"),
    (cow(fresh=lambda L, T, bs: (L + T) // bs + 1), "the table grew by more blocks than the new positions need"),
    (cow(fresh=lambda L, T, bs: (L + T) // bs), "raised IndexError"),
])
def test_copy_on_write_checker_catches_a_partial_copy_and_names_it(wrong, words):
    verdict = check_copy_on_write(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_copy_on_write_hints_count_blocks_in_good_english():
    verdict = check_copy_on_write(cow(when=lambda T, partial, shared: T > 0 and partial))
    assert "1 free blocks" not in repr(verdict) and "free block" in repr(verdict), repr(verdict)


def test_copy_on_write_checker_passes_the_package():
    assert check_copy_on_write(PagedKVCache)


@pytest.mark.parametrize("wrong, words", [
    (NoCopy, "more blocks are free than should be"),
    (CopiesFullBlocks, "nobody will write into it again"),
    (KeepsTheOldReference, "refs[old] -= 1"),
    (ChecksTooLate, "raised ValueError but changed state first"),
    (NeverRefuses, "your append went through"),
    (type("Plain", (), {"__init__": lambda self, *args: None}), "not a PagedKVCache"),
])
def test_copy_on_write_checker_names_the_mistake(wrong, words):
    verdict = check_copy_on_write(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_no_copy_corrupts_the_parent_when_the_child_writes_second():
    """With no copy, the parent's write at position 6 and the child's land in one slot: the parent reads the child's
    key. The first script's step 4 (the child's append) is where the keys go wrong."""
    pool = NoCopy(4, 4, 1, 1)
    parent = pool.new_sequence()
    pool.sequence(parent).append(np.zeros((1, 6, 1)), np.zeros((1, 6, 1)))
    child = pool.fork(parent)
    pool.sequence(parent).append(np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    pool.sequence(child).append(np.full((1, 1, 1), 2.0), np.full((1, 1, 1), 2.0))
    assert pool.gather(parent)[0][0, 6, 0] == 2.0  # the parent's own key was 1


def test_a_stub_gets_the_stub_verdict():
    for checker, answer in ((check_pad_mask, todo), (check_read_pages, todo), (check_copy_on_write, Stub)):
        verdict = checker(answer)
        assert not verdict and verdict.stub, repr(verdict)
