"""FLOP counts of generation: the 1,000 + 1,000 figures, closed forms against brute-force loops, bad input."""
import numpy as np
import pytest

from kvlesson import causal_mask
from kvlesson.configs import MODELS
from kvlesson.costs.flops import (
    cached_flops,
    flop_ratio,
    matmul_params,
    prefill_flops,
    recompute_flops,
    score_flops_per_key,
)
from kvlesson.model import random_weights, tiny_config


def brute(N, P, G, per_key=0, full_scores=False, prefill=False):
    """Step by step, the way the lesson states it: step k re-runs P + k tokens or runs 1 token."""
    recompute = cached = 0
    if prefill:  # one pass over the prompt, the same on both sides
        scored = P * P if full_scores else int(causal_mask(P, P).sum())
        recompute = cached = 2 * N * P + per_key * scored
    for k in range(1, G + 1):
        t = P + k
        scored = t * t if full_scores else int(causal_mask(t, t).sum())  # a prefill over t tokens
        recompute += 2 * N * t + per_key * scored
        cached += 2 * N + per_key * t  # one query over t keys
    return recompute, cached


def test_the_1000_plus_1000_figures():
    """1,000 prompt + 1,000 generated: 2N x 1,500,500 against 2N x 1,000, a ratio of 1,500.5; 750.75 with the
    prefill (2N x 1,000 more) on both sides."""
    N = 7
    assert recompute_flops(N, 1000, 1000) == 2 * N * 1_500_500
    assert recompute_flops(N, 1000, 1000) == 2 * N * sum(range(1001, 2001))
    assert cached_flops(N, 1000, 1000) == 2 * N * 1000
    assert flop_ratio(1000, 1000) == 1500.5
    assert recompute_flops(N, 1000, 1000, prefill=True) == 2 * N * 1_501_500
    assert cached_flops(N, 1000, 1000, prefill=True) == 2 * N * 2000
    assert flop_ratio(1000, 1000, prefill=True) == 750.75


@pytest.mark.parametrize("P, G", [(0, 1), (0, 5), (1, 1), (3, 4), (10, 7), (37, 23)])
@pytest.mark.parametrize("per_key", [0, 1, 12])
@pytest.mark.parametrize("full_scores", [False, True])
@pytest.mark.parametrize("prefill", [False, True])
def test_closed_forms_match_the_loop(P, G, per_key, full_scores, prefill):
    want_re, want_ca = brute(5, P, G, per_key, full_scores, prefill)
    assert recompute_flops(5, P, G, per_key, full_scores, prefill=prefill) == want_re
    assert cached_flops(5, P, G, per_key, full_scores, prefill=prefill) == want_ca
    ratio = flop_ratio(P, G, N=5, per_key=per_key, full_scores=full_scores, prefill=prefill)
    assert ratio == pytest.approx(want_re / want_ca, rel=1e-15)


@pytest.mark.parametrize("P", [0, 1, 6, 100])
def test_prefill_is_one_pass_over_the_prompt(P):
    assert prefill_flops(3, P) == 2 * 3 * P + 0
    assert prefill_flops(3, P, per_key=2) == 2 * 3 * P + 2 * int(causal_mask(P, P).sum())
    assert prefill_flops(3, P, per_key=2, full_scores=True) == 2 * 3 * P + 2 * P * P
    assert recompute_flops(3, P, 4, prefill=True) - recompute_flops(3, P, 4) == prefill_flops(3, P)


@pytest.mark.parametrize("P, G", [(0, 1), (1000, 1000), (128, 4096), (4096, 16)])
def test_prefill_ratio_closed_form(P, G):
    """(P + n(P + (n + 1)/2)) / (P + n): the decode ratio, diluted by the shared prefill."""
    assert flop_ratio(P, G, prefill=True) == pytest.approx((P + G * (P + (G + 1) / 2)) / (P + G), rel=1e-15)
    assert flop_ratio(P, G, prefill=True) <= flop_ratio(P, G)


@pytest.mark.parametrize("P, G", [(0, 1), (5, 1), (1000, 1000), (128, 4096)])
def test_ratio_is_the_mean_rerun_length(P, G):
    assert flop_ratio(P, G) == pytest.approx(P + (G + 1) / 2, rel=1e-15)


def test_counts_are_exact_integers():
    n = 8.03e9  # a float parameter count with no fraction, as in kvlesson.configs
    got = recompute_flops(n, 1000, 1000)
    assert isinstance(got, int) and got == 2 * 8_030_000_000 * 1_500_500
    assert isinstance(cached_flops(np.int64(3), np.int64(2), np.int64(4)), int)


def test_no_generation_costs_nothing():
    assert recompute_flops(10, 50, 0, per_key=4) == 0
    assert cached_flops(10, 50, 0, per_key=4) == 0


def test_attention_term():
    """Scores add more to recompute than to the cache; counted causally the ratio dips a little."""
    pk = score_flops_per_key(32, 32, 128)
    assert pk == 4 * 32 * 32 * 128
    N = 8_030_000_000
    saved_plain = recompute_flops(N, 1000, 1000) - cached_flops(N, 1000, 1000)
    saved_attn = recompute_flops(N, 1000, 1000, pk) - cached_flops(N, 1000, 1000, pk)
    assert saved_attn > saved_plain
    assert flop_ratio(1000, 1000, N, pk) < flop_ratio(1000, 1000) < flop_ratio(1000, 1000, N, pk, full_scores=True)


def test_matmul_params_of_the_tiny_model():
    cfg = tiny_config()
    w = random_weights(cfg, 0)
    D, hd, kvd = cfg.D, cfg.H * cfg.d, cfg.Hkv * cfg.d
    per_layer = D * hd + 2 * D * kvd + hd * D + 3 * D * cfg.hidden
    assert matmul_params(w) == cfg.n_layers * per_layer + D * cfg.vocab
    assert matmul_params(cfg) == matmul_params(w)  # counted from the shapes, or from the arrays: the same


def test_matmul_params_leave_out_the_embedding_lookup():
    """Llama 3.1 8B is untied: its 525M-entry embedding table is a lookup, not a product (7% of its params)."""
    spec = MODELS["Llama 3.1 8B"]
    norms = spec.D * (2 * spec.n_layers + 1)
    assert matmul_params(spec) == spec.params - spec.vocab * spec.D - norms == 7_504_658_432
    smol = MODELS["SmolLM2-135M"]  # tied: the one table is the output layer, counted once
    assert matmul_params(smol) == smol.params - smol.D * (2 * smol.n_layers + 1)


def test_matmul_params_refuse_what_2n_cannot_count():
    with pytest.raises(ValueError, match="mixture of experts"):
        matmul_params(MODELS["gpt-oss-120b"])
    with pytest.raises(TypeError, match="dict of weights"):
        matmul_params([1, 2])


@pytest.mark.parametrize("args", [(0, 10, 10), (1, -1, 10), (1, 10, -2), (float("nan"), 1, 1), (2.5, 1, 1)])
def test_bad_values_raise_value_error(args):
    with pytest.raises(ValueError):
        recompute_flops(*args)
    with pytest.raises(ValueError):
        cached_flops(*args)


@pytest.mark.parametrize("args", [(1, 2.5, 3), (1, True, 3), (1, 1, float("inf")), (1, "10", 3), ("7", 1, 1),
                                  (True, 1, 1)])
def test_wrong_kinds_raise_type_error(args):
    with pytest.raises(TypeError):
        recompute_flops(*args)
    with pytest.raises(TypeError):
        cached_flops(*args)
    with pytest.raises(TypeError, match="prefill"):
        cached_flops(1, 1, 1, prefill="yes")


def test_ratio_needs_tokens_and_n():
    with pytest.raises(ValueError, match="at least one"):
        flop_ratio(10, 0)
    with pytest.raises(ValueError, match="pass N"):
        flop_ratio(10, 5, per_key=4)
    with pytest.raises(ValueError):
        score_flops_per_key(0, 4, 16)
    with pytest.raises(ValueError, match="at least one"):
        flop_ratio(10, 0, prefill=True)
