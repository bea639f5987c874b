"""The FLOP explorer's pure functions: per-step costs that add up to kvlesson.costs.flops, a table, a figure."""
import numpy as np
import pytest
from matplotlib.figure import Figure

from kvlesson.configs import MODELS
from kvlesson.costs.flops import cached_flops, matmul_params, recompute_flops, score_flops_per_key
from kvlesson.teaching.widgets.flops import SCORES, draw_flops, flops_explorer, flops_table, show_flops, step_flops


def test_steps_follow_the_lessons_count():
    """Step k re-runs P + k tokens (2N each) or runs 1: re-runs of 1,001 .. 2,000 tokens for 1,000 + 1,000."""
    recompute, cached = step_flops(1000, 1000, "SmolLM2-135M")
    N = matmul_params(MODELS["SmolLM2-135M"])  # the weights a token multiplies by: no embedding lookup
    assert recompute[0] == 2 * N * 1001 and recompute[-1] == 2 * N * 2000
    assert set(cached) == {2 * N}


@pytest.mark.parametrize("scores", SCORES)
@pytest.mark.parametrize("P, G", [(0, 1), (5, 7), (1000, 300)])
def test_steps_add_up_to_the_totals(P, G, scores):
    spec = MODELS["Llama 3.1 8B"]
    per_key = 0 if scores == "left out" else score_flops_per_key(spec.n_layers, spec.H, spec.d)
    full = scores == "all t*t pairs"
    recompute, cached = step_flops(P, G, "Llama 3.1 8B", scores)
    assert len(recompute) == len(cached) == G
    N = matmul_params(spec)
    assert sum(recompute) == recompute_flops(N, P, G, per_key, full)
    assert sum(cached) == cached_flops(N, P, G, per_key)


def test_table_reports_both_ratios():
    """1,000 + 1,000: 1,500.5x for the decode steps, 750.75x with the shared prefill on both sides."""
    lines = flops_table(1000, 1000).splitlines()
    assert lines[3].split() == ["ratio", "1,500.50x"]
    assert lines[4].split()[:4] == ["ratio", "+", "prefill", "750.75x"]
    assert flops_table(10, 0).count("undefined") == 2


def test_figure_for_edge_cases():
    for P, G in [(0, 1), (1000, 1000), (4096, 5)]:
        fig = draw_flops(P, G, scores="all t*t pairs")
        assert isinstance(fig, Figure) and len(fig.axes) == 2
    title = draw_flops(1000, 1000)._suptitle.get_text()
    assert "1,500.5x" in title and "750.8x counting the prefill" in title


def test_bad_input_raises():
    with pytest.raises(ValueError, match="at least one"):
        draw_flops(10, 0)
    with pytest.raises(ValueError, match="unknown model"):
        step_flops(10, 3, model="GPT-9")
    with pytest.raises(ValueError, match="scores"):
        flops_table(10, 3, scores="some")
    with pytest.raises(ValueError, match="prompt"):
        step_flops(-1, 3)


def test_explorer_wires_the_controls():
    pytest.importorskip("ipywidgets")
    box = flops_explorer(prompt=100, generated=50)
    prompt, generated = box.children[0].children
    model, scores = box.children[1].children
    assert (prompt.value, generated.value, model.value, scores.value) == (100, 50, "Llama 3.1 8B", "left out")


def test_show_flops_displays_an_image_then_the_table(capsys):
    pytest.importorskip("IPython")
    show_flops(64, 8, "SmolLM2-135M")
    out = capsys.readouterr().out
    assert "Image" in out and out.strip().endswith(flops_table(64, 8, "SmolLM2-135M").splitlines()[-1].strip())
    assert np.isfinite(float(flops_table(64, 8).splitlines()[1].split()[1]))
