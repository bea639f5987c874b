"""What generation costs in FLOPs, with and without a KV cache.

The count follows the usual rule: a forward pass costs about 2N FLOPs per token, where N is the number of
weights a token is multiplied by (`matmul_params`), because each such weight takes part in one multiply and one
add per token. The prompt of P tokens is processed once (the prefill), then each of n decode steps feeds one
token:

    prefill     P tokens, once:                 2N P, the same work with or without a cache
    cached      step k runs 1 token:            2N per step
    recompute   step k re-runs P + k tokens:    2N (P + k) per step, k = 1 .. n

By default the counts cover the n decode steps only (1,000 + 1,000 tokens: re-runs of 1,001 .. 2,000 tokens
against 1,000 single tokens, a ratio of 1,500.5). With prefill=True both sides also pay the prefill, which
halves the ratio for P = n (750.75): quote both, and say which one you mean. A loop that returns n new tokens
feeds only n - 1 of them back (kvlesson.model.generate does so), so it makes n - 1 decode steps.

Attention scores add work that grows with the number of keys a query sees; the 2N rule ignores it, and it is
counted here only when `per_key` is given (see `score_flops_per_key`). All counts are exact Python integers.
"""

import math
import numbers

from kvlesson import validate
from kvlesson.configs import Config

__all__ = [
    "matmul_params",
    "score_flops_per_key",
    "prefill_flops",
    "recompute_flops",
    "cached_flops",
    "flop_ratio",
]


def matmul_params(w):
    """A weights dict, or a Config -> the number of weights one token multiplies by in a forward pass: the N of 2N.

    Every matrix counts except the token embedding, which is a table lookup (no arithmetic); a tied output layer
    multiplies by the same table, so it counts once, as the output. Norm weights (vectors) are elementwise and
    left out, as are biases: they are D-sized, a rounding error next to the matrices.
    """
    if isinstance(w, Config):
        return _config_matmul_params(w)
    if not isinstance(w, dict):
        raise TypeError(f"w must be a dict of weights or a kvlesson.configs.Config; got {type(w).__name__}")
    return sum(a.size for name, a in w.items() if a.ndim == 2 and name != "token_embd.weight")


def _config_matmul_params(cfg):
    if cfg.total_params is not None:
        raise ValueError(f"{cfg.name or 'this config'} is a mixture of experts: a token multiplies by only the "
                         "experts it is routed to, so 2N over all parameters does not hold")
    if None in (cfg.D, cfg.hidden, cfg.vocab):
        raise ValueError(f"{cfg.name or 'this config'}: counting the matrices needs D, hidden and vocab")
    D, H, Hkv, d = cfg.D, cfg.H, cfg.Hkv, cfg.d
    per_layer = D * H * d + 2 * D * Hkv * d + H * d * D + 3 * D * cfg.hidden  # Wq, Wk, Wv, Wo, SwiGLU
    return cfg.n_layers * per_layer + D * cfg.vocab  # + the output layer, tied or not


def score_flops_per_key(n_layers, H, d):
    """FLOPs one query spends on one key, over all layers: q . k (d multiply-adds) and p * v (d more), per head."""
    n_layers, H, d = (validate.integer(name, v, minimum=1) for name, v in (("n_layers", n_layers), ("H", H),
                                                                            ("d", d)))
    return 4 * n_layers * H * d


def prefill_flops(N, prompt, per_key=0, full_scores=False):
    """FLOPs of the prefill: one pass over the P prompt tokens, 2N P, plus its scores with per_key.

    Query i of the prompt sees i + 1 keys, P(P+1)/2 pairs in all (P * P with full_scores, see recompute_flops).
    """
    N, prompt, _, per_key = _check_args(N, prompt, 0, per_key)
    return 2 * N * prompt + per_key * (prompt * prompt if full_scores else _sum_range(1, prompt))


def recompute_flops(N, prompt, generated, per_key=0, full_scores=False, *, prefill=False):
    """FLOPs of n = `generated` decode steps without a cache: step k re-runs all P + k tokens.

    2N (P+1 + P+2 + ... + P+n), plus, with per_key, every query of every re-run scoring its keys.
    A re-run over t tokens is a prefill: its queries need 1 + 2 + ... + t = t(t+1)/2 scores.
    full_scores=True counts all t*t instead, as an implementation that scores first and masks
    afterwards (kvlesson.attention among them) really computes. prefill=True adds the prefill itself.
    """
    N, prompt, generated, per_key = _check_args(N, prompt, generated, per_key)
    lo, hi = prompt + 1, prompt + generated  # sequence lengths of the re-runs
    linear = 2 * N * _sum_range(lo, hi)
    if full_scores:
        scores = per_key * (_sum_squares(hi) - _sum_squares(lo - 1))
    else:
        scores = per_key * (_tetrahedral(hi) - _tetrahedral(lo - 1))
    return linear + scores + _prefill_term(N, prompt, per_key, full_scores, prefill)


def cached_flops(N, prompt, generated, per_key=0, full_scores=False, *, prefill=False):
    """FLOPs of n = `generated` decode steps with a cache: one new token per step.

    2N n, plus, with per_key, the one new query at step k scoring its P + k keys. prefill=True adds the
    prefill, the same one the recompute pays (full_scores only matters for it).
    """
    N, prompt, generated, per_key = _check_args(N, prompt, generated, per_key)
    decode = 2 * N * generated + per_key * _sum_range(prompt + 1, prompt + generated)
    return decode + _prefill_term(N, prompt, per_key, full_scores, prefill)


def flop_ratio(prompt, generated, N=None, per_key=0, full_scores=False, *, prefill=False):
    """Recompute FLOPs over cached FLOPs for the same decode steps (and, with prefill=True, the same prefill).

    Without the attention term N cancels. The decode-only ratio is then the mean re-run length, P + (n + 1)/2:
    1,500.5 for P = n = 1,000. With the prefill on both sides it is (P + n(P + (n + 1)/2)) / (P + n): 750.75.
    With per_key, pass N too.
    """
    generated = validate.integer("generated", generated)
    if generated == 0:
        raise ValueError("the ratio needs at least one generated token (0 / 0 otherwise)")
    if per_key and N is None:
        raise ValueError("the attention term depends on N: pass N along with per_key")
    N = 1 if N is None else N
    kw = dict(full_scores=full_scores, prefill=prefill)
    return recompute_flops(N, prompt, generated, per_key, **kw) / cached_flops(N, prompt, generated, per_key, **kw)


def _prefill_term(N, prompt, per_key, full_scores, prefill):
    if not isinstance(prefill, (bool, type(None))):
        raise TypeError(f"prefill must be True or False; got prefill={prefill!r}")
    return prefill_flops(N, prompt, per_key, full_scores) if prefill else 0


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
    return (_check_params(N), validate.integer("prompt", prompt), validate.integer("generated", generated),
            validate.integer("per_key", per_key))


def _check_params(N):
    """N may be a float such as 8.03e9, as long as it is a whole number: parameter counts are often written so."""
    if isinstance(N, bool) or not isinstance(N, numbers.Real):
        raise TypeError(f"N must be a number of parameters; got N={N!r} ({type(N).__name__})")
    if not math.isfinite(N) or N != int(N) or N < 1:
        raise ValueError(f"N must be a whole number >= 1; got N={N!r}")
    return int(N)
