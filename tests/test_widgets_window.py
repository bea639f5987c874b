"""The sliding-window explorer's pure parts: the layout of held, new and dropped keys, and its picture."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kvlesson import WindowKVCache, causal_mask  # noqa: E402
from kvlesson.teaching.widgets.window import DROPPED, HELD, NEW, draw_window, window_layout  # noqa: E402


@pytest.mark.parametrize("T, S, W", [(3, 7, 3), (1, 10, 4), (5, 5, 2), (2, 9, 1), (4, 6, 20), (0, 3, 2)])
def test_every_visible_key_is_held_or_new(T, S, W):
    """The ring buffer's promise: nothing it dropped is ever visible to a new query."""
    mask, role = window_layout(T, S, W)
    np.testing.assert_array_equal(mask, causal_mask(T, S, W))
    assert not mask[:, role == DROPPED].any()
    assert (role == NEW).sum() == T
    assert (role == HELD).sum() == min(S - T, W - 1)


def test_held_keys_are_what_window_kv_cache_hands_back():
    T, S, W = 3, 9, 4
    cache = WindowKVCache(1, 1, W)
    cache.append(np.arange(S - T, dtype=float).reshape(1, -1, 1), np.zeros((1, S - T, 1)))
    K, _ = cache.append(np.arange(S - T, S, dtype=float).reshape(1, -1, 1), np.zeros((1, T, 1)))
    _, role = window_layout(T, S, W)
    np.testing.assert_array_equal(K[0, :, 0], np.flatnonzero(role != DROPPED))


def test_window_layout_rejects_bad_sliders():
    with pytest.raises(ValueError):
        window_layout(4, 3, 2)
    with pytest.raises(ValueError):
        window_layout(1, 3, 0)


def test_draw_window_paints_the_mask_by_role():
    T, S, W = 3, 8, 3
    ax = draw_window(T, S, W)
    picture = np.asarray(ax.images[0].get_array())
    mask, role = window_layout(T, S, W)
    np.testing.assert_array_equal(picture[0], 1 + role)  # the role row
    np.testing.assert_array_equal(picture[1:] > 0, mask)
    np.testing.assert_array_equal(picture[1:][mask], (1 + role[None, :].repeat(T, 0))[mask])
    assert "held 2 old keys" in ax.get_title() and "2 + 3 = 5" in ax.get_title()
    plt.close(ax.figure)
