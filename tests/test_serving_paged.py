"""PagedKVCache against one KVCache per sequence, over random interleavings of every operation it has.

Each live sequence of the pool must hand back exactly the keys and values that a plain KVCache given the same
appends holds (a fork starts as a copy of its parent's KVCache). Storage is a copy, not arithmetic, so "exactly"
means bit for bit. The block accounting must balance after every operation, every block must come back when the
last sequence is freed, and an append the pool cannot hold must raise ValueError and change nothing.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import KVCache, step
from kvlesson.serving.paged import PagedKVCache
from tests.helpers import layers, play, reference, run_chunks, same, snapshot

OPS = st.lists(st.tuples(
    st.sampled_from(["new", "append", "append", "append", "fork", "free"]),  # appends are the common case
    st.integers(0, 99),  # which live sequence (modulo how many there are)
    st.integers(0, 6),  # T for an append, 0 included
), min_size=4, max_size=40)

POOLS = st.fixed_dictionaries(dict(n_blocks=st.integers(1, 40), block_size=st.integers(1, 5),
                                   Hkv=st.integers(1, 2), d=st.integers(1, 3)))


@given(POOLS, OPS, st.integers(0, 2**32 - 1))
def test_every_sequence_equals_its_own_kvcache(params, ops, seed):
    pool = PagedKVCache(**params)
    ref = play(pool, ops, seed)
    for seq in list(ref):
        pool.free(seq)
    assert pool.blocks_free == pool.n_blocks and pool.refs == [0] * pool.n_blocks


@given(layers(windowed=False))
def test_step_over_a_pool_view_equals_full_pass(c):
    """Prefill, chunked prefill and decode through a view, float64, against the loop reference."""
    pool = PagedKVCache(n_blocks=c["N"] + 1, block_size=3, Hkv=c["Hkv"], d=c["d"])
    other = pool.new_sequence()  # a neighbour that takes blocks in between, so the table is not 0, 1, 2, ...
    view = pool.sequence(pool.new_sequence())
    pool.sequence(other).append(np.zeros((c["Hkv"], 1, c["d"])), np.zeros((c["Hkv"], 1, c["d"])))
    np.testing.assert_allclose(run_chunks(c, view), reference(c), rtol=0, atol=1e-12)


@given(layers(windowed=False))
def test_step_over_a_pool_view_equals_step_over_a_kvcache_in_float32(c):
    """GQA and RoPE in float32: the view hands step the same numbers a KVCache does, so the outputs agree to
    float32 rounding (1e-6 on outputs of size ~1; a wrong key moves them by ~0.1) and stay float32."""
    pool = PagedKVCache(n_blocks=c["N"] + 1, block_size=2, Hkv=c["Hkv"], d=c["d"], dtype=np.float32)
    paged = run_chunks(c, pool.sequence(pool.new_sequence()), np.float32)
    plain = run_chunks(c, KVCache(c["Hkv"], c["d"], np.float32), np.float32)
    assert paged.dtype == np.float32
    np.testing.assert_allclose(paged, plain, rtol=0, atol=1e-6)


def test_step_takes_the_view_with_rope_and_gqa():
    rng = np.random.default_rng(0)
    H, Hkv, d, D = 4, 2, 8, 16
    Wq, Wk, Wv = (rng.standard_normal((D, n * d)).astype(np.float32) / 4 for n in (H, Hkv, Hkv))
    x = rng.standard_normal((9, D)).astype(np.float32)
    pool = PagedKVCache(4, 4, Hkv, d, np.float32)
    view, plain = pool.sequence(pool.new_sequence()), KVCache(Hkv, d, np.float32)
    for a, b in ((0, 5), (5, 6), (6, 6), (6, 9)):
        got = step(x[a:b], Wq, Wk, Wv, view, H, Hkv, rope_base=1e4)
        want = step(x[a:b], Wq, Wk, Wv, plain, H, Hkv, rope_base=1e4)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert len(view) == 9 and pool.block_table(view.id) == [0, 1, 2]


# ---- copy-on-write, by hand


def filled(pool, T, seed=0):
    seq = pool.new_sequence()
    k = np.random.default_rng(seed).standard_normal((pool.Hkv, T, pool.d))
    pool.sequence(seq).append(k, k)
    return seq


def one(value, pool):
    return np.full((pool.Hkv, 1, pool.d), float(value))


def test_full_shared_blocks_stay_shared():
    pool = PagedKVCache(8, 4, 1, 2)
    parent = filled(pool, 8)  # exactly two full blocks
    child = pool.fork(parent)
    pool.sequence(child).append(one(1, pool), one(1, pool))
    pool.sequence(parent).append(one(2, pool), one(2, pool))
    assert pool.block_table(child)[:2] == pool.block_table(parent)[:2] == [0, 1]
    assert pool.refs[:2] == [2, 2] and pool.blocks_free == 4  # one new block each, no copies


def test_a_partly_filled_shared_block_is_copied_once_by_the_first_writer():
    pool = PagedKVCache(8, 4, 1, 2)
    parent = filled(pool, 6)  # block 0 full, block 1 half full
    child = pool.fork(parent)
    pool.sequence(child).append(one(1, pool), one(1, pool))
    assert pool.block_table(parent) == [0, 1] and pool.block_table(child) == [0, 2]
    pool.sequence(parent).append(one(2, pool), one(2, pool))  # now the only user of block 1: writes in place
    assert pool.block_table(parent) == [0, 1] and pool.blocks_free == 5
    assert pool.gather(parent)[0][0, 6, 0] == 2 and pool.gather(child)[0][0, 6, 0] == 1
    np.testing.assert_array_equal(pool.gather(parent)[0][:, :6], pool.gather(child)[0][:, :6])


def test_an_empty_append_copies_nothing():
    pool = PagedKVCache(8, 4, 1, 2)
    parent = filled(pool, 2)
    child = pool.fork(parent)
    pool.sequence(child).append(np.zeros((1, 0, 2)), np.zeros((1, 0, 2)))
    assert pool.block_table(child) == pool.block_table(parent) == [0] and pool.refs[0] == 2


def test_freeing_the_parent_leaves_the_child_whole():
    pool = PagedKVCache(8, 4, 1, 2)
    parent = filled(pool, 6)
    K = pool.gather(parent)[0].copy()
    child = pool.fork(parent)
    pool.free(parent)
    assert pool.blocks_free == 6
    np.testing.assert_array_equal(pool.gather(child)[0], K)
    pool.sequence(child).append(one(3, pool), one(3, pool))  # sole owner now: no copy
    assert pool.block_table(child) == [0, 1] and pool.blocks_free == 6


# ---- running out, and bad arguments


def test_running_out_of_blocks_raises_and_changes_nothing():
    pool = PagedKVCache(3, 2, 1, 1)
    a = filled(pool, 3)  # 2 blocks
    b = pool.fork(a)  # shares both; a's last block is half full
    before = snapshot(pool)
    with pytest.raises(ValueError, match="out of blocks: sequence 1 needs 2 more"):
        pool.sequence(b).append(np.ones((1, 2, 1)), np.ones((1, 2, 1)))  # a copy of block 1, plus one new block
    assert same(before, snapshot(pool))
    pool.sequence(b).append(np.ones((1, 1, 1)), np.ones((1, 1, 1)))  # the copy alone fits
    assert pool.blocks_free == 0 and pool.block_table(b) == [0, 2]


def test_a_view_of_a_freed_sequence_refuses_everything():
    pool = PagedKVCache(4, 2, 1, 1)
    seq = filled(pool, 3)
    view = pool.sequence(seq)
    pool.free(seq)
    for call in (lambda: len(view), lambda: view.append(np.ones((1, 1, 1)), np.ones((1, 1, 1))),
                 lambda: pool.free(seq), lambda: pool.fork(seq), lambda: pool.sequence(seq),
                 lambda: pool.block_table(seq), lambda: view.nbytes):
        with pytest.raises(ValueError, match="sequence 0 is not in this pool"):
            call()
    assert pool.new_sequence() == 1  # ids are never reused


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(n_blocks=0), ValueError, "n_blocks must be at least 1"),
    (dict(block_size=0), ValueError, "block_size must be at least 1"),
    (dict(block_size=2.0), TypeError, "block_size must be an integer"),
    (dict(Hkv=True), TypeError, "Hkv must be an integer, not a bool"),
    (dict(d=0), ValueError, "d must be at least 1"),
    (dict(dtype=np.int32), TypeError, "floating dtype"),
])
def test_bad_pools_are_refused(kwargs, error, words):
    args = {**dict(n_blocks=4, block_size=2, Hkv=1, d=2), **kwargs}
    with pytest.raises(error, match=words):
        PagedKVCache(**args)


@pytest.mark.parametrize("k, v, words", [
    (np.ones((2, 1, 2)), np.ones((2, 1, 2)), r"\[Hkv=1, T, d=2\]"),
    (np.ones((1, 1, 2)), np.ones((1, 2, 2)), "same shape"),
    (np.ones((1, 1, 2), np.float32), np.ones((1, 1, 2), np.float32), "holds float64"),
])
def test_bad_appends_are_refused_and_change_nothing(k, v, words):
    pool = PagedKVCache(4, 2, 1, 2)
    seq = filled(pool, 3)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=words):
        pool.sequence(seq).append(k, v)
    assert same(before, snapshot(pool))


def test_ids_must_be_integers():
    pool = PagedKVCache(4, 2, 1, 2)
    with pytest.raises(TypeError, match="seq must be an integer"):
        pool.sequence("0")
    with pytest.raises(TypeError, match="T must be an integer"):
        pool.reserve(pool.new_sequence(), 1.0)


def test_dtype_and_bytes():
    pool = PagedKVCache(5, 4, 3, 8, np.float32)
    assert pool.nbytes == 2 * 3 * 5 * 4 * 8 * 4
    seq = pool.sequence(pool.new_sequence())
    assert seq.nbytes == 0 and seq.dtype == np.float32 and (seq.Hkv, seq.d) == (3, 8)
    K, V = seq.append(*np.ones((2, 3, 5, 8), np.float32))
    assert K.dtype == V.dtype == np.float32 and K.shape == (3, 5, 8)
    assert seq.nbytes == 2 * 2 * 4 * 3 * 8 * 4  # two blocks of K and V


def test_block_tables_of_a_batch_pad_with_block_zero_and_give_lengths():
    pool = PagedKVCache(8, 2, 1, 1)
    a, b, c = filled(pool, 5), filled(pool, 1), pool.new_sequence()
    tables, lengths = pool.block_tables([b, a, c])
    assert tables.tolist() == [[3, 0, 0], [0, 1, 2], [0, 0, 0]] and lengths.tolist() == [1, 5, 0]
    assert pool.block_tables([])[0].shape == (0, 0)


def test_sequences_lists_the_live_ones_oldest_first():
    pool = PagedKVCache(n_blocks=4, block_size=2, Hkv=1, d=1)
    a, b, c = (pool.new_sequence() for _ in range(3))
    pool.free(b)
    assert pool.sequences == [a, c]
    pool.sequences.append(99)  # a copy: the pool's own bookkeeping cannot be edited through it
    assert pool.sequences == [a, c]
