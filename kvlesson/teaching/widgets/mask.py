"""Explore the offset causal mask: the np.tril bug beside the right mask, for any T, S and window.

The pure functions (`top_left_mask`, `visible_keys`, `keys_table`, `draw_masks`) are what the
tests cover; `mask_explorer` only wires them to sliders.
"""
import io

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from kvlesson.sdpa import causal_mask
from kvlesson.teaching.widgets.explorer import explorer

_HIDDEN, _WRONG, _RIGHT = "#eeeeee", "#d9534f", "#3572b0"


def top_left_mask(T, S, window=None):
    """(T, S) -> bool [T, S]: the bug. Like np.tril(np.ones((T, S))), it puts query i at position i, not S - T + i."""
    _check(T, S, window)
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    mask = j <= i  # [T, S]
    if window is not None:
        mask &= j > i - window
    return mask


def visible_keys(mask):
    """bool [T, S] -> T lists: the key positions each query may see."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"need a [T, S] mask; got shape {mask.shape}")
    return [np.flatnonzero(row).tolist() for row in mask]


def keys_table(T, S, window=None):
    """A text table: each new query's absolute position and the keys it sees under each mask."""
    wrong, right = visible_keys(top_left_mask(T, S, window)), visible_keys(causal_mask(T, S, window))
    lines = [f"{'query':>5}  {'position':>8}  {'top-left sees':<16}  offset mask sees"]
    for i in range(T):
        lines.append(f"{i:>5}  {S - T + i:>8}  {_span(wrong[i]):<16}  {_span(right[i])}")
    if T == 0:
        lines.append(f"(T = 0: no new queries, so both masks are empty [0, {S}] arrays)")
    return "\n".join(lines)


def draw_masks(T, S, window=None):
    """Side-by-side heatmaps of the top-left (wrong) and offset (right) masks; returns a matplotlib Figure.

    Rows are the new queries, labelled with their absolute positions; a ring marks the cell where
    each query meets its own key, and the right margin counts the keys each row sees.
    """
    _check(T, S, window)
    fig = Figure(figsize=(2 * (0.36 * max(S, 6) + 2.0), 0.36 * max(T, 1) + 1.5), layout="constrained")
    axes = fig.subplots(1, 2)
    bug = "np.tril(np.ones((T, S)))" if window is None else "anchored at the top left"
    masks = [(top_left_mask(T, S, window), _WRONG, f"{bug}: wrong"),
             (causal_mask(T, S, window), _RIGHT, f"offset by S - T = {S - T}: right")]
    for ax, (mask, color, title) in zip(axes, masks, strict=True):
        _panel(ax, mask, color, title, T, S)
    queries = f"{T} new query" if T == 1 else f"{T} new queries"
    win = "" if window is None else f", window W = {window}"
    fig.suptitle(f"T = {queries} over S = {S} keys{win}   (ring: the query's own position)")
    return fig


def mask_explorer(T=3, S=7, window=None, max_S=16):
    """Sliders for T, S and the window; shows draw_masks and keys_table for the chosen values."""
    import ipywidgets as w

    S_slider = w.IntSlider(value=S, min=1, max=max_S, description="S keys")
    T_slider = w.IntSlider(value=T, min=0, max=S, description="T queries")
    windows = [("off", None)] + [(str(k), k) for k in range(1, max_S + 1)]
    # select by index: ipywidgets reads value=None as "nothing selected" and would show a blank, not "off"
    W_picker = w.Dropdown(options=windows, index=[v for _, v in windows].index(window), description="window")

    def keep_T_at_most_S(change):
        T_slider.max = change["new"]  # ipywidgets clamps T's value along with its max

    S_slider.observe(keep_T_at_most_S, names="value")
    return explorer(show_masks, {"T": T_slider, "S": S_slider, "window": W_picker})


def show_masks(T, S, window=None):
    """What the explorer shows for one setting: the figure as a PNG, then the keys table."""
    from IPython.display import Image, display

    T = min(T, S)  # the S slider may move before T has been clamped
    png = io.BytesIO()
    draw_masks(T, S, window).savefig(png, format="png")  # an image, whatever backend the kernel runs
    display(Image(png.getvalue()))
    print(keys_table(T, S, window))


def _panel(ax, mask, color, title, T, S):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key position j")
    if T == 0:
        ax.set_xlim(-0.5, S - 0.5)
        ax.set_yticks([])
        ax.text(0.5, 0.5, "T = 0: no queries,\nan empty mask", ha="center", va="center", transform=ax.transAxes)
        return
    ax.imshow(mask, cmap=ListedColormap([_HIDDEN, color]), vmin=0, vmax=1, aspect="equal")
    ax.set_xticks(range(S))
    ax.set_yticks(range(T), [f"q{i} @ {S - T + i}" for i in range(T)])
    ax.set_xticks(np.arange(S + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(T + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.scatter(np.arange(S - T, S), np.arange(T), s=60, facecolors="none", edgecolors="black", linewidths=1.2)
    for i, n in enumerate(mask.sum(axis=1)):
        ax.text(S - 0.4, i, f" sees {n}", va="center", fontsize=9)


def _span(keys):
    """[0, 1, 2, 3, 4] -> '0..4 (5 keys)'."""
    if not keys:
        return "none"
    n = f"({len(keys)} key{'s' if len(keys) != 1 else ''})"
    if len(keys) == 1:
        return f"{keys[0]} {n}"
    return f"{keys[0]}..{keys[-1]} {n}"


def _check(T, S, window):
    if T < 0 or S < 0 or T > S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got window={window}")
