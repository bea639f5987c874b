"""The lesson 09 checkers pass kvlesson's own answers and name each typical mistake."""
import numpy as np
import pytest

from kvlesson.sdpa import causal_mask
from kvlesson.serving.padding import pad_mask
from kvlesson.serving.paged import PagedKVCache
from kvlesson.teaching.checks import check_copy_on_write, check_pad_mask, check_read_pages
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


def test_copy_on_write_checker_passes_the_package():
    assert check_copy_on_write(PagedKVCache)


@pytest.mark.parametrize("wrong, words", [
    (NoCopy, "more blocks are free than should be"),
    (CopiesFullBlocks, "a full shared block is never written again"),
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
