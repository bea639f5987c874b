"""What generation costs in FLOPs, with and without a KV cache.

The count follows the usual rule: a forward pass costs about 2N FLOPs per token for N parameters,
because each weight takes part in one multiply and one add per token. The prompt of P tokens is
processed once (the prefill, the same work with or without a cache, so not counted), then each
of n decode steps adds one token:

    cached      step k runs 1 token:         2N per step
    recompute   step k re-runs P + k tokens: 2N (P + k) per step, k = 1 .. n

This is the card's count (1,000 + 1,000 tokens: re-runs of 1,001 .. 2,000 tokens). Note that a
loop which returns n new tokens feeds only n - 1 of them back (kvlesson.model.generate does so),
so it makes n - 1 decode steps.

Attention scores add work that grows with the number of keys a query sees; it is ignored by the
2N rule and counted here only when `per_key` is given (see `score_flops_per_key`).
All counts are exact Python integers.
"""

import math
import numbers

__all__ = [
    "matmul_params",
    "score_flops_per_key",
    "recompute_flops",
    "cached_flops",
    "flop_ratio",
]


def matmul_params(w):
    """Weights dict -> the number of weights one token multiplies by in a forward pass.

    Every matrix counts except the token embedding, which is a table lookup (no arithmetic).
    Norm weights (vectors) are elementwise and left out; they are D per norm, a rounding error.
    """
    return sum(a.size for name, a in w.items() if a.ndim == 2 and name != "token_embd.weight")


def score_flops_per_key(n_layers, H, d):
    """FLOPs one query spends on one key, over all layers: q . k (d multiply-adds) and p * v (d more), per head."""
    n_layers, H, d = (_check_count(name, v, minimum=1) for name, v in (("n_layers", n_layers), ("H", H), ("d", d)))
    return 4 * n_layers * H * d


def recompute_flops(N, prompt, generated, per_key=0, full_scores=False):
    """FLOPs of n = `generated` decode steps without a cache: step k re-runs all P + k tokens.

    2N (P+1 + P+2 + ... + P+n), plus, with per_key, every query of every re-run scoring its keys.
    A re-run over t tokens is a prefill: its queries need 1 + 2 + ... + t = t(t+1)/2 scores.
    full_scores=True counts all t*t instead, as an implementation that scores first and masks
    afterwards (kvlesson.attention among them) really computes.
    """
    N, prompt, generated, per_key = _check_args(N, prompt, generated, per_key)
    lo, hi = prompt + 1, prompt + generated  # sequence lengths of the re-runs
    linear = 2 * N * _sum_range(lo, hi)
    if full_scores:
        scores = per_key * (_sum_squares(hi) - _sum_squares(lo - 1))
    else:
        scores = per_key * (_tetrahedral(hi) - _tetrahedral(lo - 1))
    return linear + scores


def cached_flops(N, prompt, generated, per_key=0):
    """FLOPs of n = `generated` decode steps with a cache: one new token per step, the prefill not counted.

    2N n, plus, with per_key, the one new query at step k scoring its P + k keys.
    """
    N, prompt, generated, per_key = _check_args(N, prompt, generated, per_key)
    return 2 * N * generated + per_key * _sum_range(prompt + 1, prompt + generated)


def flop_ratio(prompt, generated, N=None, per_key=0, full_scores=False):
    """Recompute FLOPs over cached FLOPs for the same decode steps.

    Without the attention term N cancels and the ratio is the mean re-run length, P + (n + 1)/2:
    1,500.5 for P = n = 1,000. With per_key, pass N too.
    """
    if generated == 0:
        raise ValueError("the ratio needs at least one generated token (0 / 0 otherwise)")
    if per_key and N is None:
        raise ValueError("the attention term depends on N: pass N along with per_key")
    N = 1 if N is None else N
    return recompute_flops(N, prompt, generated, per_key, full_scores) / cached_flops(N, prompt, generated, per_key)


def _sum_range(lo, hi):
    """lo + (lo + 1) + ... + hi, 0 when the range is empty (Gauss: count times the mean of the ends)."""
    return (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0


def _sum_squares(n):
    """1 + 4 + 9 + ... + n*n."""
    return n * (n + 1) * (2 * n + 1) // 6


def _tetrahedral(n):
    """1 + 3 + 6 + ... + n(n+1)/2, the sum of the first n triangular numbers."""
    return n * (n + 1) * (n + 2) // 6


def _check_args(N, prompt, generated, per_key):
    """Validate and return the four counts as Python ints, so every sum stays exact."""
    return (_check_count("N", N, minimum=1), _check_count("prompt", prompt),
            _check_count("generated", generated), _check_count("per_key", per_key))


def _check_count(name, value, minimum=0):
    """A whole number (int, numpy int, or a float such as 8.03e9 with no fraction) -> int."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value != int(value) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {value!r}")
    return int(value)
