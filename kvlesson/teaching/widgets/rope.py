"""RoPE explorer: one pair of dimensions turning with position, and the angle of every pair.

`pair_path` and `draw_rope_pair` are pure (tested); `rope_explorer` only wires sliders to them.
"""
import matplotlib.pyplot as plt
import numpy as np

from kvlesson.rope import rope_angles
from kvlesson.teaching.widgets.explorer import explorer


def pair_path(position, m, d=64, base=10000.0):
    """-> float64 [position + 1, 2]: where the unit vector (1, 0) of pair m lands at positions 0 .. position."""
    if not 0 <= m < d // 2:
        raise ValueError(f"pair index m must be in 0 .. d/2 - 1 = {d // 2 - 1}; got m={m}")
    if position < 0:
        raise ValueError(f"position must be >= 0; got {position}")
    theta = rope_angles(np.arange(position + 1), d, base)[:, m]  # [position + 1]
    return np.stack([np.cos(theta), np.sin(theta)], axis=1)


def draw_rope_pair(position, m, d=64, base=10000.0, fig=None):
    """Left: pair m at `position` on the unit circle, with its path. Right: every pair's angle, wrapped to 2 pi."""
    fig = fig or plt.figure(figsize=(8.4, 3.6))
    fig.clear()
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    path = pair_path(position, m, d, base)
    omega = base ** (-2 * m / d)
    circle = np.linspace(0, 2 * np.pi, 200)
    left.plot(np.cos(circle), np.sin(circle), color="0.85", lw=1)
    left.plot(path[:, 0], path[:, 1], ".", color="tab:blue", ms=3, alpha=0.5, label="positions 0 .. p")
    left.annotate("", xy=(1, 0), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="0.6"))
    left.annotate("", xy=tuple(path[-1]), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="tab:red", lw=2))
    left.set(xlim=(-1.2, 1.2), ylim=(-1.2, 1.2), aspect="equal", xticks=[], yticks=[],
             title=f"pair m={m}: angle {position} x {omega:.3g} = {position * omega:.3g} rad")
    angles = np.mod(rope_angles([position], d, base)[0], 2 * np.pi)  # [d/2]
    colors = ["tab:red" if i == m else "tab:blue" for i in range(d // 2)]
    right.bar(np.arange(d // 2), angles, color=colors)
    right.set(ylim=(0, 2 * np.pi), xlabel="pair index m", ylabel="angle mod 2 pi (rad)",
              title=f"every pair at position {position} (d={d}, base={base:g})")
    fig.tight_layout()
    return fig


def rope_explorer(d=64, base=10000.0, max_position=256):
    """Sliders for the position and the pair index; redraws `draw_rope_pair`."""
    import ipywidgets as widgets

    def show(position, m):
        draw_rope_pair(position, m, d, base)
        plt.show()

    return explorer(show, {"position": widgets.IntSlider(5, 0, max_position, description="position"),
                           "m": widgets.IntSlider(0, 0, d // 2 - 1, description="pair m")})
