"""Sliding-window explorer: which keys T new queries see, and which of them the ring buffer still holds.

`window_layout` and `draw_window` are pure (tested); `window_explorer` only wires sliders to them.
"""
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from kvlesson import causal_mask
from kvlesson.teaching.widgets.explorer import explorer

DROPPED, HELD, NEW = 0, 1, 2  # what happened to key j by the time this step runs


def window_layout(T, S, window):
    """-> (mask bool [T, S], role int [S]).

    role[j] is NEW for the T keys of this step, HELD for the last W - 1 keys cached before it,
    DROPPED for older ones: a WindowKVCache no longer has them.
    """
    mask = causal_mask(T, S, window)  # validates T, S and window
    role = np.full(S, DROPPED)
    role[max(S - T - (window - 1), 0) : S - T] = HELD
    role[S - T :] = NEW
    return mask, role


def draw_window(T, S, window, ax=None):
    """Top row: each key's role (dropped, held, new). Below: which keys each new query sees, coloured by role."""
    mask, role = window_layout(T, S, window)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.5, 0.4 * S + 1.5), 0.4 * (T + 1) + 1.9))
    shades = ListedColormap(["white", "0.7", "tab:blue", "tab:green"])  # hidden, dropped, held, new
    # row 0 shows every key's role; row 1 + i shows query i's visible keys (a dropped one would show grey)
    picture = np.vstack([1 + role[None, :], np.where(mask, 1 + role[None, :], 0)])  # [1 + T, S]
    ax.imshow(picture, cmap=shades, vmin=0, vmax=3, aspect="equal", interpolation="nearest")
    ax.axhline(0.5, color="black", lw=1.5)
    ax.set_xticks(range(S), [str(j) for j in range(S)], fontsize=7)
    ax.set_yticks(range(T + 1), ["keys"] + [f"q{i} @ {S - T + i}" for i in range(T)], fontsize=7)
    ax.set_xticks(np.arange(-0.5, S), minor=True)
    ax.set_yticks(np.arange(-0.5, T + 1), minor=True)
    ax.grid(which="minor", color="0.85", lw=0.5)
    ax.tick_params(which="minor", length=0)
    held = int((role == HELD).sum())
    ax.set_title(f"T={T}, S={S}, W={window}: the cache held {held} old keys,\n"
                 f"the step attends over {held} + {T} = {held + T}", fontsize=9)
    ax.set_xlabel("key position j   (grey dropped, blue held in the ring, green new)", fontsize=8)
    return ax


def window_explorer(max_S=24):
    """Sliders for the window, T and S (S is kept >= T); redraws `draw_window`."""
    import ipywidgets as widgets

    def show(window, T, S):
        draw_window(T, max(S, T), window)
        plt.show()

    return explorer(show, {"window": widgets.IntSlider(4, 1, 16, description="window W"),
                           "T": widgets.IntSlider(3, 1, 12, description="T"),
                           "S": widgets.IntSlider(10, 1, max_S, description="S")})
