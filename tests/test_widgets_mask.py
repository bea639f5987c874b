"""The mask explorer's pure functions: the right masks, the right counts, a figure for every edge case."""
import numpy as np
import pytest
from matplotlib.figure import Figure

from kvlesson import causal_mask
from kvlesson.teaching.widgets.mask import (
    draw_masks,
    keys_table,
    mask_explorer,
    show_masks,
    top_left_mask,
    visible_keys,
)


def test_top_left_mask_is_the_tril_bug():
    for S in range(8):
        for T in range(S + 1):
            assert np.array_equal(top_left_mask(T, S), np.tril(np.ones((T, S), bool)))


def test_top_left_mask_agrees_with_the_offset_mask_only_when_T_equals_S():
    assert np.array_equal(top_left_mask(5, 5, window=2), causal_mask(5, 5, window=2))
    assert not np.array_equal(top_left_mask(3, 7), causal_mask(3, 7))


def test_visible_keys_lists_each_querys_keys():
    assert visible_keys(causal_mask(3, 7)) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], list(range(7))]
    assert visible_keys(top_left_mask(3, 7)) == [[0], [0, 1], [0, 1, 2]]
    assert visible_keys(causal_mask(2, 6, window=2)) == [[3, 4], [4, 5]]
    assert visible_keys(causal_mask(0, 4)) == []


def test_visible_keys_rejects_a_non_matrix():
    with pytest.raises(ValueError, match="shape"):
        visible_keys(np.ones(3, bool))


def test_keys_table_rows():
    lines = keys_table(3, 7).splitlines()
    assert len(lines) == 4
    assert lines[1].split() == ["0", "4", "0", "(1", "key)", "0..4", "(5", "keys)"]
    assert lines[3].split()[:2] == ["2", "6"] and lines[3].endswith("0..6 (7 keys)")
    assert keys_table(2, 6, window=2).splitlines()[1].endswith("3..4 (2 keys)")
    assert "T = 0" in keys_table(0, 5)


@pytest.mark.parametrize("T, S, window", [(3, 7, None), (4, 10, 3), (1, 16, 4), (0, 5, None), (1, 1, None),
                                          (6, 6, 2)])
def test_draw_masks_draws_both_panels(T, S, window):
    fig = draw_masks(T, S, window)
    assert isinstance(fig, Figure)
    wrong, right = fig.axes
    assert "wrong" in wrong.get_title() and "right" in right.get_title()
    assert f"S - T = {S - T}" in right.get_title()
    if T:
        # the heatmaps hold exactly the two masks
        assert np.array_equal(wrong.images[0].get_array(), top_left_mask(T, S, window))
        assert np.array_equal(right.images[0].get_array(), causal_mask(T, S, window))
        # the margin counts are computed from the masks
        counts = [t.get_text().split()[-1] for t in right.texts]
        assert counts == [str(n) for n in causal_mask(T, S, window).sum(axis=1)]
    else:
        assert not wrong.images and "T = 0" in wrong.texts[0].get_text()
    fig.canvas.draw()  # renders without error


def test_draw_masks_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="T=5, S=3"):
        draw_masks(5, 3)
    with pytest.raises(ValueError, match="window=0"):
        draw_masks(3, 7, window=0)


def test_mask_explorer_keeps_T_at_most_S():
    pytest.importorskip("ipywidgets")
    box = mask_explorer(T=3, S=7)
    T_slider, S_slider, W_picker = box.children[0].children
    assert (T_slider.value, S_slider.value, W_picker.value) == (3, 7, None)
    S_slider.value = 2
    assert T_slider.max == 2 and T_slider.value == 2


def test_show_masks_displays_an_image_then_the_table(capsys):
    pytest.importorskip("IPython")
    show_masks(5, 3, window=2)  # T above S, as when the S slider moves first: clamped to T = S
    out = capsys.readouterr().out
    assert "Image" in out and out.strip().endswith(keys_table(3, 3, window=2).splitlines()[-1].strip())


def test_the_window_picker_shows_off_when_there_is_no_window():
    """ipywidgets reads value=None as "nothing selected"; the dropdown must show its "off" entry instead."""
    pytest.importorskip("ipywidgets")
    from kvlesson.teaching.widgets.mask import mask_explorer

    box = mask_explorer()
    picker = next(c for c in box.children[0].children if getattr(c, "description", "") == "window")
    assert picker.index == 0 and picker.label == "off" and picker.value is None


def test_an_explorer_not_yet_run_reads_as_a_sentence():
    """Saved before a kernel ran it, a widget shows its text form: a sentence, not `VBox(children=(HBox(...`."""
    pytest.importorskip("ipywidgets")
    from kvlesson.teaching.widgets.explorer import UNRUN

    bundle = mask_explorer()._repr_mimebundle_()
    assert bundle["text/plain"] == UNRUN and "application/vnd.jupyter.widget-view+json" in bundle
