"""The paged pool's picture: every position of every sequence is drawn where the block table says it lives."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kvlesson.serving.paged import PagedKVCache  # noqa: E402
from kvlesson.teaching.widgets.paged import draw_pool, pool_layout  # noqa: E402


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
