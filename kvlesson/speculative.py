"""Speculative decoding: draft k tokens cheaply, verify them in one pass of the model, keep what it agrees with.

    tokens, stats = speculative.generate(model, ids, 32, draft="ngram", k=4)   # == model.generate(ids, 32)

One round, on caches that hold the prompt and every token kept so far, with one pending token t (the last one
emitted, not yet in the caches):
  1. draft     d_1 .. d_k, guesses at what follows t: prompt lookup ("ngram"), the model's own first layers and
               output head ("early_exit"), or any callable draft(context_ids, k) -> up to k ids;
  2. verify    [t, d_1, .., d_k] through the model as ONE chunk of T = k + 1 onto the caches, a chunked prefill
               under lesson 04's offset mask: row i is the model's next-token distribution after d_i;
  3. accept    keep d_1 .. d_n while the model agrees, then one token of the model's own (`accept`: the
               rejection rule of Leviathan et al., arXiv 2211.17192, and Chen et al., arXiv 2302.01318), so a
               round emits n + 1 tokens for one pass of the model;
  4. roll back truncate every cache to the prompt and the kept tokens: the keys of d_(n+1) .. d_k belong to a
               text that was never written, and a later query must not see them.

At temperature 0 every distribution is one-hot (the target's argmax, the draft's token), and the same rule keeps a
draft exactly when it is the argmax, so the tokens equal greedy `Model.generate`'s. At a temperature above 0 the
emitted tokens follow the target's own distribution, whatever the drafter proposes.

Which distribution: the one plain decoding would draw from, after every rule of the request's sampling (top-k,
top-p, min-p, the repetition penalty; kvlesson.sample.probabilities). The rule hands out exactly the p it is given,
so p must be that processed distribution, or the tokens follow the raw softmax instead of what was asked for; and q
must be exactly what each draft was drawn from, processed or not, or the correction max(0, p - q) is computed
against the wrong proposal and the output leans towards it (tests/test_sample.py shows both failures).

A tree of drafts (several guesses at one position, each with its own continuation) is verified in one pass too:
`TreeCache` wraps a layer's cache so that node i is rotated at position S + depth(i) and sees the S cached keys and
its own ancestors only (kvlesson.tree_mask), `verify_tree` runs the model over it, `walk` follows the branch the
model agrees with, and `TreeCache.keep` keeps that branch in the cache and drops the rest.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from kvlesson import atomic, validate
from kvlesson import model as _model
from kvlesson.cache import Cache, CacheLike, checkpoint, rules
from kvlesson.configs import Config, ModelLike
from kvlesson.sample import Sampling, draw, probabilities
from kvlesson.sdpa import tree_depths, tree_mask

__all__ = ["generate", "accept", "ngram", "EarlyExit", "rollback", "TreeCache", "verify_tree", "walk"]



# ---- the loop


def generate(model: ModelLike, ids: Sequence[int], max_new_tokens: int,
             draft: str | EarlyExit | Callable[[list[int], int], Sequence[int]] = "ngram", k: int = 4,
             temperature: float = 0.0, rng: np.random.Generator | None = None, sampling: Sampling | None = None
             ) -> tuple[list[int], dict[str, int]]:
    """-> (the max_new_tokens new token ids, stats): speculative decoding of `model` (a kvlesson.llama.Model).

    draft: "ngram" (prompt lookup, `ngram`), "early_exit" (`EarlyExit()`, the first half of the layers), an
    `EarlyExit`, or a callable draft(context_ids, k) -> a list of up to k token ids. k: drafts per round (0 is plain
    decoding). temperature 0 is greedy, and the tokens equal model.generate(ids, max_new_tokens); above 0 the tokens are
    sampled from softmax(logits / temperature) with `rng` (a numpy Generator; None: a fresh unseeded one).
    sampling: a kvlesson.sample.Sampling instead of temperature, whose every rule (top-k, top-p, min-p, repetition
    penalty) shapes the target's distribution and the early-exit drafter's alike; its seed seeds rng when rng is None.

    stats: drafted (draft tokens proposed), accepted (of those, kept), target_passes (passes of the whole model
    after the prompt's prefill, one per round), draft_passes (forward passes the drafter made, 0 for prompt lookup).
    Each round emits its accepted drafts and one token of the model's, so (accepted + target_passes) / target_passes
    tokens come out of each pass of the model.
    """
    cfg, w, ids, n, k, params, rng, propose = _checked(model, ids, max_new_tokens, draft, k, temperature, rng,
                                                       sampling)
    stats = dict(drafted=0, accepted=0, target_passes=0, draft_passes=0)
    if n == 0:
        return [], stats
    state = rng.bit_generator.state  # the caches are this call's own; the generator is the caller's: put it back
    with atomic.undo_on_error(lambda: setattr(rng.bit_generator, "state", state)):
        caches = _model.new_cache(_model.with_max_len(cfg, len(ids) + n), w["output.weight"].dtype)
        logits = _model.forward(cfg, w, ids, caches)  # prefill: [len(ids), vocab]
        out = [_sample(probabilities(logits[-1], params, history=ids), rng)]  # the pending token: not yet cached
        while len(out) < n:
            room = n - len(out) - 1  # a round emits up to room + 1 tokens
            drafts, q = propose(cfg, w, caches, ids + out, min(k, room), params, rng)
            stats["drafted"] += len(drafts)
            stats["draft_passes"] += 0 if q is None else len(drafts)
            S = len(caches[0])
            logits = _model.forward(cfg, w, [out[-1], *drafts], caches)  # verify: ONE pass over T = len(drafts) + 1
            stats["target_passes"] += 1
            # row i follows the pending token and drafts 1 .. i: its penalty counts those too
            p = np.stack([probabilities(row, params, history=ids + out + drafts[:i])
                          for i, row in enumerate(logits)])  # [T, vocab]
            q = _one_hot(drafts, p.shape[1]) if q is None else q  # a drafter naming tokens proposes them surely
            emitted = accept(p, q, drafts, rng)
            stats["accepted"] += len(emitted) - 1
            rollback(caches, S + len(emitted))  # the pending token and the accepted drafts stay; the rest go
            out += emitted
    return out, stats


def rollback(caches: list, n: int) -> None:
    """Truncate every cache to its first n positions: after a verify pass, the prompt, the pending token and the
    accepted drafts. Without it the next round's queries attend over the keys of rejected drafts. Every cache is
    checked first (n between the furthest each can roll back and what it holds); a refused rollback truncates none."""
    if isinstance(caches, (str, bytes)) or not hasattr(caches, "__len__"):
        raise TypeError(f"caches must be a list of caches, one per layer; got {type(caches).__name__}")
    n = validate.integer("n", n)
    for i, cache in enumerate(caches):
        if not hasattr(cache, "truncate"):
            raise TypeError(f"caches[{i}] ({type(cache).__name__}) has no truncate(n): it cannot roll back")
        if n > len(cache):
            raise ValueError(f"rollback(n={n}): caches[{i}] holds only {len(cache)} positions "
                             f"(the caches hold {[len(c) for c in caches]})")
    # a ring buffer knows how far back it can go only by trying: whichever refuses, the others are put back
    with atomic.undo_on_error(*map(checkpoint, caches)):
        for i, cache in enumerate(caches):
            try:
                cache.truncate(n)
            except ValueError as e:
                raise ValueError(f"rollback(n={n}): caches[{i}] refused, so none was truncated: {e}") from None


# ---- the rule


def accept(p_target: ArrayLike, q_draft: ArrayLike, draft_tokens: Sequence[int], rng: np.random.Generator
           ) -> list[int]:
    """-> the emitted ids: the accepted drafts, then one token of the target's. Preserves the target distribution.

    p_target [k + 1, V]: the target's next-token probabilities after each of the k + 1 verified tokens; q_draft
    [k, V]: the distributions the drafts were sampled from; draft_tokens [k]. Draft i is kept with probability
    min(1, p(d_i) / q(d_i)) (p and q its rows); at the first rejection the token is sampled from
    max(0, p - q), normalised, and the round ends; after k acceptances the last token is sampled from p_target[k].
    Why the emitted token then follows p exactly: the interview corner of lesson 14, or Leviathan et al. (2023),
    Appendix A.1.
    """
    p, q, tokens, rng = _checked_rule(p_target, q_draft, draft_tokens, rng)
    out = []
    for i, x in enumerate(tokens):
        if rng.random() < p[i, x] / q[i, x]:  # a uniform draw in [0, 1) below min(1, p/q)
            out.append(x)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)  # [V] what p has and q over-proposed nothing of
        out.append(_sample(residual if residual.sum() > 0 else p[i], rng))
        return out
    out.append(_sample(p[len(tokens)], rng))
    return out


def _sample(weights, rng):
    """-> one index drawn in proportion to the non-negative `weights` [V] (summing to anything above 0)."""
    return draw(weights, rng.random())


def _one_hot(tokens, V):
    out = np.zeros((len(tokens), V))  # [len(tokens), V]
    out[np.arange(len(tokens)), tokens] = 1.0
    return out


# ---- the drafters


def ngram(context: Sequence[int], k: int, n: int = 3) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the context's last m tokens,
    trying m = n, n - 1, .., 1 (a longer match is a better bet); [] when even the last token never occurred before.

    It costs no model pass, and it pays off wherever the text repeats itself: code edits, quotes of the prompt,
    names (Saxena's prompt lookup decoding, github.com/apoorvumang/prompt-lookup-decoding).
    """
    context = validate.token_ids("context", context).tolist()
    k, n = validate.integer("k", k), validate.integer("n", n, minimum=1)
    for m in range(min(n, len(context) - 1), 0, -1):
        tail = context[-m:]
        for start in range(len(context) - m - 1, -1, -1):  # latest first; the match must have a continuation
            if context[start : start + m] == tail:
                return context[start + m : start + m + k]
    return []


@dataclasses.dataclass(frozen=True)
class EarlyExit:
    """The model's own first `layers` layers, its final norm and its output head, as the drafter (self-speculative
    decoding, as in LayerSkip, arXiv 2404.16710, without the training that makes early layers good at it).

    It shares the target's caches: its first layers compute exactly the keys and values the target's first layers
    would, so each draft step appends to those caches, and the drafts are truncated away before the verify pass.
    """

    layers: int | None = None  # None: the first half, n_layers // 2

    def depth(self, cfg: Config) -> int:
        """-> how many layers the drafter runs on a model of this config."""
        L = cfg.n_layers // 2 if self.layers is None else self.layers
        if not 1 <= L < cfg.n_layers:
            raise ValueError(f"EarlyExit(layers={self.layers}) needs 1 <= layers < the model's {cfg.n_layers}")
        return L

    def propose(self, cfg: Config, w: dict, caches: list, pending: int, k: int, params: Sampling | float,
                rng: np.random.Generator, history: Sequence[int] = ()) -> tuple[list[int], np.ndarray]:
        """-> (k drafts after `pending`, the distributions they were drawn from [k, V]), the caches as they were.
        params: a kvlesson.sample.Sampling (or a temperature), which processes the drafter's rows as the target's;
        history: the text so far, pending included, for its repetition penalty."""
        params = params if isinstance(params, Sampling) else Sampling(temperature=params)
        L = self.depth(cfg)
        sub, mine = dataclasses.replace(cfg, n_layers=L), caches[:L]
        S, token, drafts, q = len(mine[0]), pending, [], []
        for _ in range(k):
            row = _model.forward(sub, w, [token], mine)[-1]  # [V]
            dist = probabilities(row, params, history=[*history, *drafts])  # [V]
            token = _sample(dist, rng)
            drafts.append(token)
            q.append(dist)
        rollback(mine, S)
        return drafts, np.array(q).reshape(len(q), cfg.vocab)  # [k, V]


def _drafter(draft):
    """draft -> propose(cfg, w, caches, context, k, params, rng) -> (drafts, q [k, V] or None for one-hot)."""
    if isinstance(draft, str) and draft == "early_exit":
        draft = EarlyExit()
    if isinstance(draft, EarlyExit):
        if draft.layers is not None:
            validate.integer("draft.layers", draft.layers, minimum=1)
        return lambda cfg, w, caches, context, k, params, rng: draft.propose(
            cfg, w, caches, context[-1], k, params, rng, history=context)
    if isinstance(draft, str) and draft == "ngram":
        draft = ngram
    if isinstance(draft, str):
        raise ValueError(f"draft must be 'ngram', 'early_exit', an EarlyExit or a callable; got draft={draft!r}")
    if not callable(draft):
        raise TypeError(f"draft must be 'ngram', 'early_exit', an EarlyExit or a callable draft(context_ids, k); "
                        f"got {type(draft).__name__}")

    def propose(cfg, w, caches, context, k, params, rng):
        return _checked_drafts(draft(list(context), k) if k else [], k, cfg.vocab), None

    return propose


# ---- a tree of drafts


class TreeCache(Cache):
    """One layer's cache with a tree of T new tokens appended after its S cached positions.

    parents[i] < i is node i's parent among the new tokens, or -1 for a child of the last cached token. The T nodes
    are appended after the S cached positions in node order, like any chunk; what makes them a tree is where they
    sit and what they see: node i at position S + depth(i) (positions(T), what RoPE turns it by) and, among the
    new keys, only itself and its ancestors (mask(T) = kvlesson.tree_mask). After the pass, keep(path) leaves the
    wrapped cache holding the S cached positions and the nodes of one root-to-node path, at S, S + 1, ... (moving a
    branch into place appends its keys again, so a cache that stores keys lossily, as QuantizedKVCache does, encodes
    them once more).
    """

    def __init__(self, cache: CacheLike, parents: Sequence[int]):
        window, capacity, dtype = rules(cache)
        if window is not None or (isinstance(cache, Cache) and cache.mask(1) is not None):
            raise ValueError(f"a tree of drafts needs a cache whose queries see every cached key; "
                             f"{type(cache).__name__} has a window or a mask of its own")
        self.inner, self.parents = cache, validate.parents(parents)
        self.depths = tree_depths(self.parents)  # [T]
        self.Hkv, self.d, self.dtype, self.capacity = cache.Hkv, cache.d, dtype, capacity
        self.S = len(cache)
        self._new = None  # the nodes' rotated keys and values, once appended

    def __len__(self):
        return len(self.inner)

    def positions(self, T: int) -> np.ndarray:
        """-> int [T]: node i at S + depth(i), where it sits in every text it belongs to."""
        self._check_nodes(T)
        return len(self.inner) + self.depths

    def mask(self, T: int) -> np.ndarray:
        """-> bool [T, S + T]: every cached key, then the node itself and its ancestors."""
        return tree_mask(self.parents, len(self) - T)

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(self.inner) != self.S or self._new is not None:
            raise ValueError("a TreeCache takes its tree once, onto the cache as it was wrapped")
        self._check_nodes(k_new.shape[1])
        K, V = self.inner.append(k_new, v_new)
        self._new = (np.array(k_new), np.array(v_new))  # [Hkv, T, d] each, rotated where the nodes sit
        return K, V

    def keep(self, path: Sequence[int]) -> None:
        """Keep the nodes of `path` (root first, each the parent of the next) after the S cached positions."""
        if isinstance(path, (str, bytes)) or not hasattr(path, "__len__"):
            raise TypeError(f"path must be a list of node indices, root first; got {type(path).__name__}")
        path = [validate.integer(f"path[{i}]", node) for i, node in enumerate(path)]
        if self._new is None:
            raise ValueError("keep(path) comes after the tree's pass: nothing was appended yet")
        for a, b in zip([-1, *path], path, strict=False):
            if not 0 <= b < len(self.parents) or self.parents[b] != a:
                raise ValueError(f"path={path} is not a branch from a root: node {b}'s parent is not {a}")
        if path == list(range(len(path))):  # a chain's prefix already sits where it belongs
            self.inner.truncate(self.S + len(path))
            return
        k, v = self._new
        self.inner.truncate(self.S)
        self.inner.append(k[:, path], v[:, path])  # node at depth j to position S + j, rotated there already

    def checkpoint(self) -> Callable[[], None]:
        inner, new = checkpoint(self.inner), self._new

        def restore():
            inner()
            self._new = new
        return restore

    def _check_nodes(self, T):
        if T != len(self.parents):
            raise ValueError(f"this TreeCache was made for {len(self.parents)} nodes; got T={T} new tokens")

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes


def verify_tree(model: ModelLike, caches: list, tokens: Sequence[int], parents: Sequence[int]
                ) -> tuple[np.ndarray, list[TreeCache]]:
    """One pass of the model over a tree of T tokens -> (logits [T, V], the TreeCache of each layer).

    Row i is the model's next-token logits after the branch that ends at node i; the same numbers a pass over that
    branch alone would give. Call keep(path) on every view (or `walk`'s path) afterwards to keep one branch.
    """
    cfg, w = _model_parts(model)
    tokens = validate.token_ids("tokens", tokens, cfg.vocab).tolist()
    if len(tokens) != len(parents):
        raise ValueError(f"tokens has {len(tokens)} nodes and parents {len(parents)}; give one parent per node")
    if not isinstance(caches, (list, tuple)) or len(caches) != cfg.n_layers:
        raise TypeError(f"caches must be a list of {cfg.n_layers} caches, one per layer")
    if len({len(c) for c in caches}) != 1:
        raise ValueError(f"the caches disagree on how many tokens they hold: {sorted({len(c) for c in caches})}")
    views = [TreeCache(c, parents) for c in caches]
    return _model.forward(cfg, w, tokens, views), views


def walk(logits: ArrayLike, tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """Greedy acceptance on a tree -> (path, emitted): from root node 0 (the pending token), follow the child whose
    token is the model's argmax after its parent, while there is one. path: the nodes kept (node 0 first);
    emitted: the tokens that come out, the accepted children and then the model's own token after the last.

    logits [T, V] (verify_tree's), tokens [T] and parents [T] describe one tree of T nodes; each parent comes before
    its child, so the walk ends."""
    parents = validate.parents(parents)
    logits = validate.floats("logits", logits)
    T = len(parents)
    if T == 0:
        raise ValueError("parents is empty: a tree holds at least its root, node 0 (the pending token)")
    if logits.ndim != 2 or logits.shape[0] != T:
        raise ValueError(f"logits must be [T, V] with one row per node, T={T} (len(parents)); got {logits.shape}")
    if np.isnan(logits).any():
        raise ValueError(f"logits hold NaN (row {int(np.flatnonzero(np.isnan(logits).any(axis=1))[0])}): no argmax "
                         "to follow")
    tokens = validate.token_ids("tokens", tokens, logits.shape[1]).tolist()
    if len(tokens) != T:
        raise ValueError(f"tokens has {len(tokens)} nodes and parents {T}; give one token per node")
    path, emitted = [0], []
    while True:
        want = int(np.argmax(logits[path[-1]]))
        emitted.append(want)
        child = next((i for i, p in enumerate(parents) if p == path[-1] and tokens[i] == want), None)
        if child is None:
            return path, emitted
        path.append(child)


# ---- checks


def _model_parts(model):
    cfg, w = getattr(model, "config", None), getattr(model, "weights", None)
    if not isinstance(w, dict) or not hasattr(cfg, "n_layers"):
        raise TypeError(f"model must be a kvlesson.llama.Model (config and weights); got {type(model).__name__}")
    return cfg, w


def _checked(model, ids, max_new_tokens, draft, k, temperature, rng, sampling):
    cfg, w = _model_parts(model)
    ids, n = validate.request(ids, max_new_tokens, cfg.vocab, cfg.max_len)
    k = validate.integer("k", k)
    if sampling is None:
        params = Sampling(temperature=temperature)  # checks it: a real number, finite, at least 0
    elif not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a kvlesson.sample.Sampling or None; got {type(sampling).__name__}")
    elif temperature != 0.0:
        raise ValueError(f"give the temperature once: temperature={temperature!r} and sampling={sampling!r}")
    else:
        params = sampling
    if rng is None:
        rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)
    elif not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)) or None; got "
                        f"{type(rng).__name__}")
    return cfg, w, ids, n, k, params, rng, _drafter(draft)


def _checked_drafts(drafts, k, vocab):
    if isinstance(drafts, (str, bytes)) or not hasattr(drafts, "__len__"):
        raise TypeError(f"draft(context_ids, k) must return a list of token ids; got {type(drafts).__name__}")
    drafts = validate.token_ids("draft(context_ids, k)", drafts, vocab).tolist()
    if len(drafts) > k:
        raise ValueError(f"draft(context_ids, k={k}) returned {len(drafts)} tokens; at most k")
    return drafts


def _checked_rule(p_target, q_draft, draft_tokens, rng):
    p, q = validate.floats("p_target", p_target), validate.floats("q_draft", q_draft)
    if p.ndim != 2 or p.shape[0] < 1:
        raise ValueError(f"p_target must be [k + 1, V]; got shape {p.shape}")
    k, V = p.shape[0] - 1, p.shape[1]
    if q.shape != (k, V):
        raise ValueError(f"q_draft must be [k, V] = ({k}, {V}) to match p_target {p.shape}; got {q.shape}")
    tokens = validate.token_ids("draft_tokens", draft_tokens, V)
    if tokens.shape != (k,):
        raise ValueError(f"draft_tokens must hold k={k} ids (p_target has k + 1 rows); got {tokens.shape[0]}")
    for name, a in (("p_target", p), ("q_draft", q)):
        if not (a >= 0).all() or not np.isfinite(a).all():  # NaN fails the first test too
            raise ValueError(f"{name} must hold probabilities: finite and at least 0")
        sums = a.sum(axis=-1, dtype=np.float64)  # [rows]
        if sums.size and np.abs(sums - 1).max() > 1e-4:  # float32 softmax rows sum to 1 within about 1e-6
            raise ValueError(f"{name}: every row must sum to 1; got sums {sums.round(6).tolist()[:4]}")
    if k and (q[np.arange(k), tokens] <= 0).any():
        i = int(np.flatnonzero(q[np.arange(k), tokens] <= 0)[0])
        raise ValueError(f"q_draft[{i}, {tokens[i]}] is 0: the drafter could not have proposed draft_tokens[{i}]")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)); got {type(rng).__name__}")
    return p.astype(np.float64), q.astype(np.float64), tokens.tolist(), rng
