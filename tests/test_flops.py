"""FLOP counts of generation: the card's figures, closed forms against brute-force loops, bad input."""
import numpy as np
import pytest

from kvlesson import causal_mask
from kvlesson.flops import cached_flops, flop_ratio, matmul_params, recompute_flops, score_flops_per_key
from kvlesson.model import random_weights, tiny_config


def brute(N, P, G, per_key=0, full_scores=False):
    """Step by step, the way the lesson states it: step k re-runs P + k tokens or runs 1 token."""
    recompute = cached = 0
    for k in range(1, G + 1):
        t = P + k
        scored = t * t if full_scores else int(causal_mask(t, t).sum())  # a prefill over t tokens
        recompute += 2 * N * t + per_key * scored
        cached += 2 * N + per_key * t  # one query over t keys
    return recompute, cached


def test_card_figures():
    """1,000 prompt + 1,000 generated: 2N x 1,500,500 against 2N x 1,000, a ratio of 1,500.5."""
    N = 7
    assert recompute_flops(N, 1000, 1000) == 2 * N * 1_500_500
    assert recompute_flops(N, 1000, 1000) == 2 * N * sum(range(1001, 2001))
    assert cached_flops(N, 1000, 1000) == 2 * N * 1000
    assert flop_ratio(1000, 1000) == 1500.5


@pytest.mark.parametrize("P, G", [(0, 1), (0, 5), (1, 1), (3, 4), (10, 7), (37, 23)])
@pytest.mark.parametrize("per_key", [0, 1, 12])
@pytest.mark.parametrize("full_scores", [False, True])
def test_closed_forms_match_the_loop(P, G, per_key, full_scores):
    want_re, want_ca = brute(5, P, G, per_key, full_scores)
    assert recompute_flops(5, P, G, per_key, full_scores) == want_re
    assert cached_flops(5, P, G, per_key) == want_ca
    assert flop_ratio(P, G, N=5, per_key=per_key, full_scores=full_scores) == pytest.approx(want_re / want_ca)


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


@pytest.mark.parametrize("args", [(0, 10, 10), (1, -1, 10), (1, 10, -2), (1, 2.5, 3), (1, True, 3),
                                  (float("nan"), 1, 1), (1, 1, float("inf")), (1, "10", 3)])
def test_bad_counts_raise(args):
    with pytest.raises(ValueError):
        recompute_flops(*args)
    with pytest.raises(ValueError):
        cached_flops(*args)


def test_ratio_needs_tokens_and_n():
    with pytest.raises(ValueError, match="at least one"):
        flop_ratio(10, 0)
    with pytest.raises(ValueError, match="pass N"):
        flop_ratio(10, 5, per_key=4)
    with pytest.raises(ValueError):
        score_flops_per_key(0, 4, 16)
