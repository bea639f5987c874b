"""Explore what a cache saves in FLOPs: per decode step and in total, for any prompt, length and model.

The pure functions (`step_flops`, `flops_table`, `draw_flops`) are what the tests cover;
`flops_explorer` only wires them to sliders.
"""
import io

import numpy as np
from matplotlib.figure import Figure

from kvlesson.configs import MODELS
from kvlesson.costs.flops import cached_flops, flop_ratio, matmul_params, recompute_flops, score_flops_per_key
from kvlesson.teaching.widgets.explorer import explorer

SCORES = ("left out", "causal pairs", "all t*t pairs")  # how attention scores are counted, see kvlesson.costs.flops
DENSE = ("Llama 3.1 8B", "SmolLM2-135M")  # dense models: every matrix works on every token, so 2N holds


def _terms(model, scores):
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}")
    if scores not in SCORES:
        raise ValueError(f"scores must be one of {SCORES}; got {scores!r}")
    spec = MODELS[model]
    per_key = 0 if scores == "left out" else score_flops_per_key(spec.n_layers, spec.H, spec.d)
    return matmul_params(spec), per_key, scores == "all t*t pairs"  # N leaves out the embedding lookup


def step_flops(prompt, generated, model="Llama 3.1 8B", scores="left out"):
    """int arrays [G], [G]: the FLOPs of decode step k = 1 .. G without and with a cache."""
    N, per_key, full = _terms(model, scores)
    recompute = [recompute_flops(N, prompt + k - 1, 1, per_key, full) for k in range(1, generated + 1)]
    cached = [cached_flops(N, prompt + k - 1, 1, per_key) for k in range(1, generated + 1)]
    return np.array(recompute, dtype=object), np.array(cached, dtype=object)  # exact ints, beyond int64 too


def flops_table(prompt, generated, model="Llama 3.1 8B", scores="left out"):
    """A text summary: total FLOPs of the decode steps both ways, the ratio without and with the shared prefill,
    and the FLOPs saved (the prefill is the same both ways, so it saves nothing)."""
    N, per_key, full = _terms(model, scores)
    re = recompute_flops(N, prompt, generated, per_key, full)
    ca = cached_flops(N, prompt, generated, per_key, full)
    ratios = ["undefined (no steps)"] * 2
    if generated:
        ratios = [f"{flop_ratio(prompt, generated, N, per_key, full, prefill=p):,.2f}x" for p in (False, True)]
    return "\n".join([
        f"{model}, prompt {prompt:,} + {generated:,} decode steps, attention scores {scores}",
        f"  recompute        {re:.3e} FLOPs",
        f"  cached           {ca:.3e} FLOPs",
        f"  ratio            {ratios[0]}",
        f"  ratio + prefill  {ratios[1]}  (the prefill counted on both sides)",
        f"  saved            {re - ca:.3e} FLOPs",
    ])


def draw_flops(prompt, generated, model="Llama 3.1 8B", scores="left out"):
    """Two panels: FLOPs per decode step, and their running total, with and without a cache. Returns a Figure."""
    if generated < 1:
        raise ValueError(f"draw at least one decode step; got generated={generated}")
    recompute, cached = step_flops(prompt, generated, model, scores)
    k = np.arange(1, generated + 1)
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    per_step, total = fig.subplots(1, 2)
    panels = [(per_step, (recompute, cached), "FLOPs per decode step", "linear"),
              (total, (np.cumsum(recompute), np.cumsum(cached)), "FLOPs so far (log scale)", "log")]
    for ax, (a, b), title, scale in panels:
        ax.plot(k, a.astype(float), label="recompute")
        ax.plot(k, b.astype(float), label="cached")
        ax.set(xlabel="decode step k", title=title, yscale=scale)
        ax.grid(alpha=0.3)
        ax.legend()
    N, per_key, full = _terms(model, scores)
    ratio, with_prefill = (flop_ratio(prompt, generated, N, per_key, full, prefill=p) for p in (False, True))
    fig.suptitle(f"{model}, prompt {prompt:,}: {generated:,} decode steps cost {ratio:,.1f}x the FLOPs without a "
                 f"cache ({with_prefill:,.1f}x counting the prefill; scores {scores})")
    return fig


def show_flops(prompt, generated, model="Llama 3.1 8B", scores="left out"):
    """What the explorer shows for one setting: the figure as a PNG, then the table."""
    from IPython.display import Image, display

    png = io.BytesIO()
    draw_flops(prompt, generated, model, scores).savefig(png, format="png", dpi=80)
    display(Image(png.getvalue()))
    print(flops_table(prompt, generated, model, scores))


def flops_explorer(prompt=1000, generated=1000, model="Llama 3.1 8B", scores="left out"):
    """Sliders for the prompt and the generated length, a model and how to count the scores."""
    import ipywidgets as w

    return explorer(show_flops,
                    {"prompt": w.IntSlider(value=prompt, min=0, max=8192, description="prompt"),
                     "generated": w.IntSlider(value=generated, min=1, max=8192, description="generated")},
                    {"model": w.Dropdown(options=DENSE, value=model, description="model"),
                     "scores": w.Dropdown(options=SCORES, value=scores, description="scores")})
