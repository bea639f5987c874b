"""One sampler for every way kvlesson generates: a row of logits in, the next token out.

    params = Sampling(temperature=0.8, top_p=0.9, seed=7)
    token = sample(logits, params, position=0)    # the same logits, params and position: the same token, always

`probabilities` turns a row of logits into the distribution a token is drawn from, in the order vLLM and Hugging
Face transformers apply the same rules (transformers' generation/logits_process.py: processors, then warpers):
  1. repetition penalty   every token already in the text (prompt and output) has its logit divided by the penalty
                          when positive, multiplied by it when negative (CTRL, arXiv 1909.05858; dividing a negative
                          logit would raise it);
  2. allowed              a mask of the tokens a grammar allows next (lesson 16's constrained output): the others get
                          probability 0, whatever the model thinks of them;
  3. temperature          0 is greedy: the most probable allowed token, one-hot. Above 0, softmax(logits / T);
  4. top-k                keep the tokens at least as probable as the k-th most probable;
  5. top-p                keep the tokens at least as probable as the one at which the running sum, from the most
                          probable down, first reaches top_p (the nucleus, arXiv 1904.09751);
  6. min-p                keep the tokens at least min_p times as probable as the most probable (arXiv 2407.01082);
then what is kept is scaled to sum to 1. Every cut keeps whole classes of equally probable tokens: "at least as
probable as" never splits a tie, so no cut depends on the order a sort left tied tokens in.

The draw is one uniform number u in [0, 1) and the inverse of the cumulative distribution: the first token whose
running sum exceeds u. u comes from (seed, position), not from a generator that advances: the token at position i of
a request's output depends only on its logits, its parameters, its seed and i. So a request gets the same tokens alone
or in any batch, a step that is undone and run again (kvlesson.atomic) draws the same numbers with nothing to put back,
and tokens a grammar forces, which draw nothing, leave every later draw where it was.
"""
import dataclasses
import numbers
from collections.abc import Iterable

import numpy as np

from kvlesson import validate

__all__ = ["Sampling", "GREEDY", "probabilities", "sample", "draw", "uniform", "seeded"]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one request turns logits into tokens. The defaults are greedy decoding."""

    temperature: float = 0.0  # 0: greedy (the argmax); above 0: softmax(logits / temperature)
    top_k: int = 0  # keep the k most probable tokens (ties at the k-th kept too); 0: all
    top_p: float = 1.0  # keep the smallest top set whose probability reaches top_p (ties kept whole); 1: all
    min_p: float = 0.0  # keep tokens at least min_p times as probable as the most probable; 0: all
    repetition_penalty: float = 1.0  # > 1 discourages every token already in the text; 1: off
    seed: int | None = None  # the draws of a request; None: an engine picks one when the request arrives

    def __post_init__(self):
        for name, value in vars(self).items():
            if name == "seed" and value is None:
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number; got {name}={value!r} ({type(value).__name__})")
        validate.real("temperature", self.temperature, minimum=0)
        validate.integer("top_k", self.top_k)
        if not 0 < validate.real("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must lie in (0, 1]; got top_p={self.top_p}")
        if not 0 <= validate.real("min_p", self.min_p) <= 1:
            raise ValueError(f"min_p must lie in [0, 1]; got min_p={self.min_p}")
        validate.positive("repetition_penalty", self.repetition_penalty)
        if self.seed is not None:
            validate.integer("seed", self.seed, minimum=-(2**63))
            if self.seed >= 2**63:
                raise ValueError(f"seed must fit in 64 bits (-2**63 <= seed < 2**63); got seed={self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def probabilities(logits: np.ndarray, params: Sampling = GREEDY, *, history: Iterable[int] = (),
                  allowed: np.ndarray | None = None) -> np.ndarray:
    """[V] logits -> [V] float64 probabilities after every rule of `params` (one-hot when greedy).

    history: the token ids already in the text, for the repetition penalty (each counts once, however often it
    occurs). allowed: bool [V], the tokens a grammar allows next; at least one must be allowed.
    """
    z = np.array(logits, dtype=np.float64)  # [V], a copy: the caller's logits are never changed
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be one row [V] with V >= 1; got shape {z.shape}")
    if params.repetition_penalty != 1 and len(history):
        seen = np.unique(validate.token_ids("history", history, z.size))
        z[seen] = np.where(z[seen] > 0, z[seen] / params.repetition_penalty, z[seen] * params.repetition_penalty)
    if allowed is not None:
        if allowed.shape != z.shape or allowed.dtype != np.bool_ or not allowed.any():
            raise ValueError(f"allowed must be a bool [V={z.size}] mask allowing at least one token; got "
                             f"{allowed.dtype} {allowed.shape} with {int(np.count_nonzero(allowed))} allowed")
        z[~allowed] = -np.inf
    if params.greedy:
        p = np.zeros_like(z)
        p[int(np.argmax(z))] = 1.0  # the first of equal maxima, as np.argmax picks it
        return p
    if np.isnan(z).any() or np.isposinf(z).any():  # -inf is a token ruled out; these are not
        raise ValueError(f"the model's logits hold {'NaN' if np.isnan(z).any() else '+inf'}: nothing to sample from at "
                         f"temperature={params.temperature} (a weight or an activation is not finite)")
    z = z / params.temperature
    p = np.exp(z - z.max())  # [V]; a disallowed token's exp(-inf) is exactly 0
    if params.top_k and params.top_k < np.count_nonzero(p):
        p[p < np.partition(p, -params.top_k)[-params.top_k]] = 0.0
    if params.top_p < 1:
        p[p < _nucleus_cut(p, params.top_p)] = 0.0
    if params.min_p > 0:
        p[p < params.min_p * p.max()] = 0.0
    return p / p.sum()


def _nucleus_cut(p, top_p):
    """-> the probability of the token at which the running sum of p (unnormalised), most probable first, first
    reaches top_p of the total. Most of the mass sits in a few hundred tokens, so those are sorted first; the whole
    row only when they do not reach it (the same answer either way)."""
    total = p.sum()
    head = p if p.size <= 512 else np.partition(p, p.size - 512)[-512:]  # [<= 512] the largest, unordered
    if head is not p and head.sum() < top_p * total:
        head = p
    ordered = np.sort(head)[::-1]  # [n] most probable first
    i = int(np.searchsorted(np.cumsum(ordered), top_p * total))  # the first index whose running sum reaches it
    return ordered[min(i, ordered.size - 1)]


def seeded(params: Sampling) -> Sampling:
    """-> params with a seed: its own, or a fresh one from the operating system's entropy when it has none and
    samples (what an engine does when a request arrives, so that a step run twice draws the same numbers)."""
    if params.greedy or params.seed is not None:
        return params
    return dataclasses.replace(params, seed=int(np.random.SeedSequence().entropy % 2**63))


def uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) that draws the token at `position` of a request seeded with `seed`."""
    return float(np.random.default_rng([seed % 2**64, position]).random())


def draw(weights: np.ndarray, u: float) -> int:
    """-> the first index whose running sum of `weights` [V] (non-negative, summing above 0) exceeds u times the
    total: index i comes out with probability weights[i] / total when u is uniform in [0, 1)."""
    c = np.cumsum(weights, dtype=np.float64)  # [V]
    i = int(np.searchsorted(c, u * c[-1], side="right"))
    return min(i, int(np.flatnonzero(weights)[-1]))  # u * total can round up to the total itself


def sample(logits: np.ndarray, params: Sampling = GREEDY, *, position: int = 0, history: Iterable[int] = (),
           allowed: np.ndarray | None = None) -> int:
    """[V] logits -> the next token id: the argmax when greedy, else a draw from `probabilities` with the uniform
    number of (params.seed, position). position: the token's index in the request's output (0 for the first)."""
    p = probabilities(logits, params, history=history, allowed=allowed)
    if params.greedy:
        return int(np.argmax(p))
    if params.seed is None:
        raise ValueError("a sampled token needs a seed: give Sampling(seed=...), or submit to an engine, which picks "
                         "one for a request that has none")
    return draw(p, uniform(params.seed, validate.integer("position", position)))
