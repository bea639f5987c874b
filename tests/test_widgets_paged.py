"""The paged pool's picture: every position of every sequence is drawn where the block table says it lives."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kvlesson.serving.paged import PagedKVCache  # noqa: E402
from kvlesson.teaching.widgets.paged import CONFLICT, conflicts, draw_pool, pool_layout  # noqa: E402
from tests.helpers import reserve_without_copy  # noqa: E402


def small_pool():
    pool = PagedKVCache(6, 4, 1, 1)
    a = pool.new_sequence()
    pool.sequence(a).append(np.zeros((1, 6, 1)), np.zeros((1, 6, 1)))
    b = pool.fork(a)
    pool.sequence(b).append(np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))  # copies block 1 into block 2
    return pool, a, b


def test_layout_follows_the_block_tables():
    pool, a, b = small_pool()
    cells = pool_layout(pool)
    assert cells[(0, 0)] == [(a, 0), (b, 0)]  # the full block is shared
    assert cells[(1, 1)] == [(a, 5)] and cells[(2, 2)] == [(b, 6)]  # the copy holds b's positions 4 to 6
    assert len(cells) == 4 + 2 + 3


def test_draw_pool_labels_every_slot_in_use():
    pool, _, _ = small_pool()
    ax = draw_pool(pool)
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted(["ab0", "ab1", "ab2", "ab3", "a4", "a5", "b4", "b5", "b6"])
    assert "3 free" in ax.get_title()
    plt.close(ax.figure)


def forked_then_both_write(copy):
    """A parent of 6 positions is forked; the parent writes key 100 at position 6, then the child key 200. Without
    copy-on-write both land in block 1, slot 2. -> (pool, {sequence: the keys it would hold alone})."""
    pool = (PagedKVCache if copy else NoCopy)(6, 4, 2, 3)
    a = pool.new_sequence()
    prefix = np.arange(2 * 6 * 3, dtype=float).reshape(2, 6, 3)  # [Hkv, 6, d]
    pool.sequence(a).append(prefix, prefix)
    b = pool.fork(a)
    alone = {}
    for seq, key in ((a, 100.0), (b, 200.0)):
        new = np.full((2, 1, 3), key)
        pool.sequence(seq).append(new, new)
        alone[seq] = np.concatenate([prefix, new], axis=1)
    return pool, alone


class NoCopy(PagedKVCache):
    reserve = reserve_without_copy


def test_conflicts_are_the_slots_a_sequence_reads_but_never_wrote():
    pool, alone = forked_then_both_write(copy=False)
    assert conflicts(pool, alone) == {(1, 2)}  # both read it as position 6; it holds the child's 200
    shared = {cell for cell, readers in pool_layout(pool).items() if len(readers) > 1}
    assert len(shared) == 7 and (1, 2) in shared  # the six prefix slots are shared too, and right
    pool, alone = forked_then_both_write(copy=True)
    assert conflicts(pool, alone) == set()


def test_draw_pool_marks_the_conflict_and_only_it():
    pool, alone = forked_then_both_write(copy=False)
    ax = draw_pool(pool, expected=alone)
    marked = [t.get_text() for t in ax.texts if t.get_text().endswith("!")]
    assert marked == ["ab6!"]
    red = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(CONFLICT)]
    assert len(red) == 1 and red[0].get_xy() == (0.5, 1.5)
    plt.close(ax.figure)
    ax = draw_pool(pool)  # without expected keys nothing is judged
    assert not any(t.get_text().endswith("!") for t in ax.texts)
    plt.close(ax.figure)
