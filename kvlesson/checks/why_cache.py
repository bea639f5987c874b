"""Checkers for lesson 02: what recomputing costs, and whether past keys and values change.

The FLOP checkers compare against kvlesson.flops and, on a wrong answer, try the classic slips
one by one (a range shifted by one, the prefill counted, the factor 2 forgotten, integer division)
to say which one it was. The drift checker feeds the learner's experiment fake models whose past
keys or values do or do not move, so an experiment that cannot see a change is caught.
"""
import math
import numbers

import numpy as np

from kvlesson.checks._verdict import call, failed, passed
from kvlesson.flops import cached_flops, flop_ratio, recompute_flops

__all__ = ["check_recompute_flops", "check_flop_ratio", "check_past_kv_drift"]


def _number(got):
    """The learner's answer as a float, or None when it is not a single real number."""
    if isinstance(got, np.ndarray) and got.shape == ():
        got = got.item()
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        return float(got)
    return None


def _same(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def _s(n, P, G):
    return f"N={n:,}, prompt={P:,}, generated={G:,}"


# ------------------------------------------------------------------------------------- recompute FLOPs

def check_recompute_flops(fn):
    """fn(N, prompt, generated) -> FLOPs of `generated` decode steps without a cache (prefill not counted)."""
    # the first case tells the classic slips apart: each gives a different number there
    cases = [(3, 5, 4), (1, 1000, 1000), (2, 0, 1), (7, 12, 1), (5, 9, 0), (4, 0, 6)]
    for N, P, G in cases:
        got, bad = call(fn, N, P, G)
        if bad is not None:
            return bad
        value = _number(got)
        if value is None:
            return failed(f"for {_s(N, P, G)} your function returned {got!r}; expected one number of FLOPs")
        want = recompute_flops(N, P, G)
        if not _same(value, want):
            return _recompute_diagnosis(value, want, N, P, G)
    return passed("2N FLOPs per token, re-run over P+1 .. P+G tokens: 2N x 1,500,500 for 1,000 + 1,000")


def _sum(lo, hi):
    return sum(range(lo, hi + 1))


def _recompute_slips(N, P, G):
    """(value, hint) for each classic wrong count, on one case."""
    return [
        (2 * N * _sum(P, P + G - 1),
         "you summed the lengths P .. P+G-1 (1,000 .. 1,999 for the card). Step k re-runs the prompt and the k "
         "tokens generated so far, P + k tokens, for k = 1 .. G: that is P+1 .. P+G"),
        (2 * N * _sum(P + 1, P + G - 1),
         "your sum stops one step short: range(a, b) stops before b, so the lengths P+1 .. P+G need "
         "range(P + 1, P + G + 1)"),
        (2 * N * _sum(1, P + G),
         "you summed from 1: the prompt is never re-run token by token. The first decode step already re-runs "
         "P + 1 tokens"),
        (2 * N * _sum(P + 1, P + G) + 2 * N * P,
         "you added the prefill (2N x P). It is the same work with or without a cache, so the lesson leaves it out "
         "of both counts"),
        (N * _sum(P + 1, P + G),
         "you are off by a factor 2: each parameter costs a multiply and an add per token, 2 FLOPs"),
        (2 * _sum(P + 1, P + G), "the sum is right; multiply it by N, the parameters each token passes through"),
        (2 * N * G, "that is the cached cost, one token per step. Without a cache, step k re-runs P + k tokens"),
        (2 * N * (P + G), "that is one forward pass over the final sequence; recompute runs one pass per step, "
                          "each over the tokens that exist at that step"),
        (2 * N * G * (P + G), "every step re-runs only the tokens that exist at that step (P + k), not the final "
                              "length P + G"),
    ]


def _recompute_diagnosis(value, want, N, P, G):
    problem = f"for {_s(N, P, G)} you counted {value:,.0f} FLOPs; expected {want:,}"
    for slip, hint in _recompute_slips(N, P, G):
        if _same(value, slip):
            return failed(problem, hint)
    if G == 0:
        return failed(problem, "with no generated tokens there are no decode steps, so no FLOPs")
    return failed(problem, "write the steps out for a tiny case: P = 2, G = 3 re-runs 3, 4 and 5 tokens, each "
                           "costing 2N FLOPs per token")


# ------------------------------------------------------------------------------------------ FLOP ratio

def check_flop_ratio(fn):
    """fn(prompt, generated) -> recompute FLOPs / cached FLOPs for the decode steps (prefill in neither)."""
    cases = [(1000, 1000), (5, 4), (0, 1), (3, 1), (10, 3), (1, 1000)]
    for P, G in cases:
        got, bad = call(fn, P, G)
        if bad is not None:
            return bad
        value = _number(got)
        if value is None:
            return failed(f"for prompt={P:,}, generated={G:,} your function returned {got!r}; expected one number")
        want = flop_ratio(P, G)
        if not _same(value, want):
            return _ratio_diagnosis(value, want, P, G)
    return passed("the ratio is the mean re-run length, P + (G + 1)/2: 1,500.5 for 1,000 + 1,000")


def _fmt(x):
    """1,500.5 and 0.0006664 alike: thousands separated, no digits that matter dropped."""
    return f"{x:,.4f}".rstrip("0").rstrip(".") if abs(x) >= 1 else f"{x:.4g}"


def _ratio_slips(P, G):
    re, ca = recompute_flops(1, P, G), cached_flops(1, P, G)  # N cancels
    return [
        (re / (ca + 2 * P),
         "you counted the prefill in the cached cost only. It is the same work with or without the cache: leave it "
         "out of both sides (the card's 'after prefill')"),
        ((re + 2 * P) / (ca + 2 * P),
         "you counted the prefill on both sides. That is a fair question too, but it is not the card's ratio: the "
         "prefill is shared, so the lesson compares the decode steps only"),
        ((re + 2 * P) / ca, "you counted the prefill in the recompute cost only; it is shared, leave it out of both"),
        (ca / re, "the ratio is upside down: recompute over cached, so it comes out far above 1"),
        (2 * _sum(P, P + G - 1) / ca,
         "off by one: step k re-runs P + k tokens for k = 1 .. G, so the lengths are P+1 .. P+G"),
        (2 * _sum(P + 1, P + G - 1) / ca, "your sum stops one step short: range(a, b) stops before b"),
        (P + G, "that is the ratio of the last step alone (P + G tokens against 1); average over all G steps"),
    ]


def _ratio_diagnosis(value, want, P, G):
    problem = f"for prompt={P:,}, generated={G:,} your ratio is {_fmt(value)}; expected {_fmt(want)}"
    for slip, hint in _ratio_slips(P, G):
        if _same(value, slip):
            return failed(problem, hint)
    if value == math.floor(want) and value != want:
        return failed(problem, "the true mean of P+1 .. P+G is P + (G + 1)/2, which is not a whole number here: "
                               "use / rather than //, and keep the + 1 (the mean of a range is the mean of its ends)")
    return failed(problem, "divide recompute FLOPs by cached FLOPs for the same G decode steps; N cancels")


# ------------------------------------------------------------------------------------- past K/V drift

def check_past_kv_drift(fn):
    """fn(run, ids, n, layer=0) -> largest |difference| between the first n positions of K and V of `layer`,
    computed once from ids[:n] and once from all of ids. run(ids) -> [(K, V) per layer], K, V [Hkv, S, d].
    """
    for case, run, ids, n, layer in _drift_cases():
        got, bad = call(fn, run, list(ids), n, layer)
        if bad is not None:
            return _drift_crash(bad, case)
        if isinstance(got, bool | np.bool_):
            return failed(f"for {case} your function returned {got!r}",
                          "return the largest absolute difference as a number (0.0 means nothing moved), not a bool")
        value = _number(got)
        if value is None:
            return failed(f"for {case} your function returned {got!r}; expected one number")
        want = _drift(run, ids, n, layer)
        if not math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-12):
            return _drift_diagnosis(fn, value, want, case, run, ids, n, layer)
    return passed("your experiment sees a change in K or V at any layer, and none in a causal model")


def _drift(run, ids, n, layer):
    """The reference: first n positions of `layer`, from a run over ids[:n] against a run over all ids."""
    K1, V1 = run(list(ids[:n]))[layer]
    K2, V2 = run(list(ids))[layer]
    return float(max(np.abs(K1 - K2[:, :n]).max(initial=0.0), np.abs(V1 - V2[:, :n]).max(initial=0.0)))


class _FakeModel:
    """Per-layer K and V [Hkv, S, d] built from token embeddings; `leak` decides which ones also depend
    on later tokens (as a model without a causal mask would), with `sign` setting the direction of the change."""

    def __init__(self, leak_k=(), leak_v=(), sign=1.0, n_layers=2, Hkv=2, d=3, vocab=11):
        self.emb = np.random.default_rng(5).standard_normal((vocab, Hkv, d))
        self.leak_k, self.leak_v, self.sign, self.n_layers = set(leak_k), set(leak_v), sign, n_layers

    def __call__(self, ids):
        x = self.emb[np.asarray(ids, dtype=np.int64)].transpose(1, 0, 2)  # [Hkv, S, d]
        past = np.cumsum(x, axis=1) / np.arange(1, x.shape[1] + 1)[:, None]  # mean of tokens 0..j: causal
        whole = np.abs(x).mean(axis=1, keepdims=True)  # every position sees every token: not causal
        out = []
        for layer in range(self.n_layers):
            k = past * (layer + 1) + (self.sign * whole if layer in self.leak_k else 0.0)
            v = past * (layer + 2) + (self.sign * whole if layer in self.leak_v else 0.0)
            out.append((k, v))
        return out


def _tiny_run():
    from kvlesson.model import forward, new_cache, random_weights, tiny_config

    cfg = tiny_config(n_layers=2)
    w = random_weights(cfg, seed=3)

    def run(ids):
        caches = new_cache(cfg, np.float32, static=False)
        forward(cfg, w, ids, caches)
        return [(c.k, c.v) for c in caches]

    return cfg, run


def _drift_cases():
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    cfg, tiny = _tiny_run()
    tiny_ids = np.random.default_rng(4).integers(0, cfg.vocab, 12).tolist()
    return [
        ("a causal model (nothing should move)", _FakeModel(), ids, 5, 0),
        ("a model whose layer-0 keys see later tokens", _FakeModel(leak_k={0}), ids, 5, 0),
        ("a model whose layer-0 values (only) see later tokens", _FakeModel(leak_v={0}), ids, 5, 0),
        ("a model whose layer-1 keys see later tokens", _FakeModel(leak_k={1}, sign=-1.0), ids, 4, 1),
        ("layer 1 of a model where only layer 0 leaks", _FakeModel(leak_k={0}, leak_v={0}), ids, 3, 1),
        ("n = 1 (one position to compare)", _FakeModel(leak_k={0}), ids, 1, 0),
        ("layer 1 of the tiny transformer", tiny, tiny_ids, 7, 1),
    ]


def _drift_crash(bad, case):
    if "NotImplementedError" in bad.message:  # a student copy, not filled in yet
        return bad
    first = bad.message.removeprefix("NOT YET: ").split("\n")[0]
    if "broadcast" in first or "shape" in first:
        return failed(f"for {case} {first}",
                      "positions are axis 1 of K [Hkv, S, d]: compare K_short with K_long[:, :n], not K_long[:n]")
    return failed(f"{first} (on {case})", "call run(ids[:n]) and run(ids), pick [layer], and compare K and V")


def _drift_diagnosis(fn, value, want, case, run, ids, n, layer):
    problem = f"for {case} your drift is {value:.4g}; expected {want:.4g}"
    K1, V1 = run(list(ids[:n]))[layer]
    K2, V2 = run(list(ids))[layer]
    dk, dv = K1 - K2[:, :n], V1 - V2[:, :n]
    sees_k, sees_v = (_sees_change(fn, _FakeModel(**leak), ids) for leak in ({"leak_k": {0}}, {"leak_v": {0}}))
    if sees_k and not sees_v:
        return failed(problem, "you compared the keys only; the values are cached too, so compare V as well")
    if sees_v and not sees_k:
        return failed(problem, "you compared the values only; compare the keys as well")
    if not sees_k and not sees_v:
        return failed(problem, "your experiment sees no change even in a model whose past moves. Run the model "
                               "twice from fresh caches, on ids[:n] and on ids, and compare the first n positions")
    if _close(value, max(dk.max(), dv.max())) or _close(value, max((-dk).max(), (-dv).max())):
        return failed(problem, "take the absolute difference before the max: a change downwards counts too")
    if layer != 0 and _close(value, _drift(run, ids, n, 0)):
        return failed(problem, "you compared layer 0 whatever `layer` said; pick run(...)[layer]")
    if value > 0 and want > 0 and value < want and _close(value, max(np.abs(dk).mean(), np.abs(dv).mean())):
        return failed(problem, "report the largest difference (max), not the mean: one moved entry is enough")
    if want == 0:
        return failed(problem, "in a causal model the first n positions come out the same from both runs; compare "
                               "only those: K_short against K_long[:, :n]")
    return failed(problem, "run the model twice from fresh caches, on ids[:n] and on ids, and compare the first n "
                           "positions of K and of V at that layer: the largest absolute difference")


def _sees_change(fn, run, ids):
    got, bad = call(fn, run, list(ids), 4, 0)
    value = None if bad is not None or isinstance(got, bool | np.bool_) else _number(got)
    return value is not None and value > 0


def _close(a, b):
    return math.isclose(a, float(b), rel_tol=1e-6, abs_tol=1e-12)
