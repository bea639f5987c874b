"""The RoPE explorer's pure parts: the path of one pair and the figure drawn from it."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kvlesson import apply_rope  # noqa: E402
from kvlesson.teaching.widgets.rope import draw_rope_pair, pair_path  # noqa: E402


def test_pair_path_is_apply_rope_on_a_unit_vector():
    d, m, position = 16, 3, 40
    x = np.zeros((position + 1, d))
    x[:, m] = 1.0  # half-split: pair m is (x[m], x[m + d/2])
    rotated = apply_rope(x, np.arange(position + 1), 500.0)
    np.testing.assert_allclose(pair_path(position, m, d, 500.0), rotated[:, [m, m + d // 2]], atol=1e-12)


def test_pair_path_starts_at_the_identity_and_stays_on_the_circle():
    path = pair_path(100, 0, 8)
    np.testing.assert_array_equal(path[0], [1.0, 0.0])
    np.testing.assert_allclose(np.linalg.norm(path, axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("position, m", [(-1, 0), (3, 4), (3, -1)])
def test_pair_path_rejects_bad_sliders(position, m):
    with pytest.raises(ValueError):
        pair_path(position, m, d=8)


def test_draw_rope_pair_draws_the_arrow_and_every_pair():
    d, m, position = 32, 2, 17
    fig = draw_rope_pair(position, m, d)
    left, right = fig.axes
    arrow_tip = left.texts[-1].xy  # the red arrow is the last annotation
    np.testing.assert_allclose(arrow_tip, pair_path(position, m, d)[-1], atol=1e-12)
    heights = [bar.get_height() for bar in right.patches]
    assert len(heights) == d // 2
    np.testing.assert_allclose(heights[m], np.mod(position * 10000.0 ** (-2 * m / d), 2 * np.pi), atol=1e-12)
    assert f"pair m={m}" in left.get_title()
    plt.close(fig)


def test_draw_rope_pair_reuses_a_figure():
    fig = plt.figure()
    assert draw_rope_pair(0, 0, 8, fig=fig) is fig
    assert len(fig.axes) == 2
    draw_rope_pair(5, 1, 8, fig=fig)
    assert len(fig.axes) == 2  # cleared, not stacked
    plt.close(fig)
