"""Checkers for lesson 02: what recomputing costs, and whether past keys and values change.

The FLOP checkers compare against kvlesson.costs.flops and, on a wrong answer, look it up in a table of the classic
slips (a range shifted by one, the prefill on one side only, the factor 2 forgotten, integer division) to say
which one it was. The drift checker feeds the learner's experiment fake models whose past keys or values do or
do not move, so an experiment that cannot see a change is caught, and the tiny transformer, whose past moves
only by float32 rounding. Each checker carries its reference answer as `.reference`.
"""
import math

import numpy as np

from kvlesson.costs.flops import cached_flops, flop_ratio, recompute_flops
from kvlesson.teaching.verdict import Reject, Slip, as_number, checker, first_slip, passed, reject, run

__all__ = ["check_recompute_flops", "check_flop_ratio", "check_past_kv_drift"]


def _same_number(got, wrong):
    return wrong is not None and math.isclose(got, float(wrong), rel_tol=1e-9, abs_tol=1e-12)


def _sum(lo, hi):
    return sum(range(lo, hi + 1))


def _fmt(x):
    """1,500.5 and 0.0006664 alike: thousands separated, no digits that matter dropped."""
    if x != 0 and abs(x) < 1:
        return f"{x:.4g}"
    return f"{x:,.4f}".rstrip("0").rstrip(".")


def _near_miss(got, want):
    """Right to about 7 digits but not exactly: a float32, or a float with too few digits, rounded the count."""
    return want != 0 and got != want and math.isclose(got, want, rel_tol=1e-6)


def _number(result, case):
    if result is None:
        reject(f"for {case} your function returned None", "is the return statement missing?")
    return as_number(result, case)


_ROUNDED = ("your number is right to about 7 digits but not exact: float32 (np.float32, or a numpy array of "
            "float32) rounded it. Count with Python ints, which never round")


# ------------------------------------------------------------------------------------- recompute FLOPs

_RECOMPUTE_SLIPS = [
    Slip("lengths P .. P+G-1", lambda N, P, G: 2 * N * _sum(P, P + G - 1), "",
         "you summed the lengths P .. P+G-1. Decode step k re-runs the prompt and the k tokens fed so far, "
         "P + k tokens, for k = 1 .. G: the lengths P+1 .. P+G"),
    Slip("range stops short", lambda N, P, G: 2 * N * _sum(P + 1, P + G - 1), "",
         "your sum stops one step short: range(a, b) stops before b, so the lengths P+1 .. P+G need "
         "range(P + 1, P + G + 1)"),
    Slip("summed from 1", lambda N, P, G: 2 * N * _sum(1, P + G), "",
         "you summed from 1: the prompt is never re-run token by token. The first decode step already re-runs "
         "P + 1 tokens"),
    Slip("prompt left out", lambda N, P, G: 2 * N * _sum(1, G) if P else None, "",
         "you left the prompt out: every re-run starts from the first prompt token, so step k re-runs P + k "
         "tokens, not k"),
    Slip("prefill added", lambda N, P, G: recompute_flops(N, P, G, prefill=True) if P else None, "",
         "you added the prefill (2N x P). It is the same work with or without a cache, so this count leaves it "
         "out; the ratio exercise that follows puts it on both sides when asked"),
    Slip("factor 2", lambda N, P, G: N * _sum(P + 1, P + G), "",
         "you are off by a factor 2: each weight costs a multiply and an add per token, 2 FLOPs"),
    Slip("N ignored", lambda N, P, G: 2 * _sum(P + 1, P + G) if N != 1 else None, "",
         "the sum is right; multiply it by N, the weights each token passes through"),
    Slip("cached cost", lambda N, P, G: 2 * N * G, "",
         "that is the cached cost, one token per step. Without a cache, step k re-runs P + k tokens"),
    Slip("one final pass", lambda N, P, G: 2 * N * (P + G), "",
         "that is one forward pass over the final sequence; recompute runs one pass per step, each over the "
         "tokens that exist at that step"),
    Slip("final length every step", lambda N, P, G: 2 * N * G * (P + G), "",
         "every step re-runs only the tokens that exist at that step (P + k), not the final length P + G"),
]


@checker
def check_recompute_flops(fn):
    """fn(N, prompt, generated) -> FLOPs of `generated` decode steps without a cache (prefill not counted)."""
    # the first case tells the classic slips apart: each gives a different number there
    for N, P, G in [(7, 5, 4), (1, 1000, 1000), (2, 0, 1), (7, 12, 1), (5, 9, 0), (4, 0, 6),
                    (7_504_658_432, 1000, 1000)]:
        case = f"N={N:,}, prompt={P:,}, generated={G:,}"
        got = _number(run(fn, N, P, G, case=case), case)
        want = recompute_flops(N, P, G)
        if math.isclose(got, want, rel_tol=1e-12):  # as a float, a count above 2**53 keeps 16 digits, not all
            continue
        problem = f"for {case} you counted {_fmt(got)} FLOPs; expected {want:,}"
        slip = first_slip(got, _RECOMPUTE_SLIPS, (N, P, G), same=_same_number)
        if slip is not None:
            reject(problem, slip.hint)
        if _near_miss(got, want):
            reject(problem, _ROUNDED)
        if G == 0:
            reject(problem, "with no generated tokens there are no decode steps, so no FLOPs")
        reject(problem, "write the steps out for a tiny case: P = 2, G = 3 re-runs 3, 4 and 5 tokens, each "
                        "costing 2N FLOPs per token")
    return passed("2N FLOPs per token, re-run over P+1 .. P+G tokens: 2N x 1,500,500 for 1,000 + 1,000")


check_recompute_flops.reference = recompute_flops

# ------------------------------------------------------------------------------------------ FLOP ratio

def _re(P, G, prefill=False):
    return recompute_flops(1, P, G, prefill=prefill)  # N = 1: N cancels in every ratio below


def _ca(P, G, prefill=False):
    return cached_flops(1, P, G, prefill=prefill)


_BOTH_SIDES = ("the prefill is the same work with or without a cache: with prefill=True add 2N x P to both sides, "
               "with prefill=False to neither")

_RATIO_SLIPS = [  # the answer expected with prefill=False
    Slip("prefill on both sides", lambda P, G: _re(P, G, True) / _ca(P, G, True) if P else None, "",
         "that is the ratio with the prefill on both sides, what prefill=True asks for; with prefill=False "
         "compare the decode steps only"),
    Slip("prefill in cached only", lambda P, G: _re(P, G) / _ca(P, G, True) if P else None, "", _BOTH_SIDES),
    Slip("prefill in recompute only", lambda P, G: _re(P, G, True) / _ca(P, G) if P else None, "", _BOTH_SIDES),
    Slip("upside down", lambda P, G: _ca(P, G) / _re(P, G), "",
         "the ratio is upside down: recompute over cached, so it comes out far above 1"),
    Slip("lengths P .. P+G-1", lambda P, G: 2 * _sum(P, P + G - 1) / _ca(P, G), "",
         "off by one: step k re-runs P + k tokens for k = 1 .. G, so the lengths are P+1 .. P+G"),
    Slip("range stops short", lambda P, G: 2 * _sum(P + 1, P + G - 1) / _ca(P, G), "",
         "your sum stops one step short: range(a, b) stops before b"),
    Slip("last step alone", lambda P, G: P + G, "",
         "that is the ratio of the last step alone (P + G tokens against 1); average over all G steps"),
    Slip("mean without the + 1", lambda P, G: P + G / 2, "",
         "the mean of P+1 .. P+G is the mean of its ends, (P+1 + P+G)/2 = P + (G + 1)/2: keep the + 1"),
    Slip("prompt left out", lambda P, G: (G + 1) / 2 if P else None, "",
         "step k re-runs the prompt too: P + k tokens, not k"),
]

_PREFILL_SLIPS = [  # the answer expected with prefill=True
    Slip("prefill ignored", lambda P, G: _re(P, G) / _ca(P, G) if P else None, "",
         "with prefill=True both runs also pay the prefill, 2N x P: add it to both sides (your function returns the "
         "decode-only ratio whatever prefill says)"),
    Slip("prefill in cached only", lambda P, G: _re(P, G) / _ca(P, G, True) if P else None, "", _BOTH_SIDES),
    Slip("prefill in recompute only", lambda P, G: _re(P, G, True) / _ca(P, G) if P else None, "", _BOTH_SIDES),
    Slip("prefill without its factor 2", lambda P, G: (_re(P, G) + P) / (_ca(P, G) + P) if P else None, "",
         "the prefill costs 2N per prompt token, like every other token: add 2P (with N = 1), not P"),
    Slip("upside down", lambda P, G: _ca(P, G, True) / _re(P, G, True), "",
         "the ratio is upside down: recompute over cached, so it comes out above 1"),
    Slip("decode off by one", lambda P, G: (2 * _sum(P, P + G - 1) + 2 * P) / _ca(P, G, True), "",
         "off by one in the decode part: step k re-runs P + k tokens for k = 1 .. G"),
]


@checker
def check_flop_ratio(fn):
    """fn(prompt, generated, prefill=False) -> recompute FLOPs / cached FLOPs for the same decode steps; with
    prefill=True both sides also include the prefill."""
    for P, G in [(5, 4), (1000, 1000), (0, 1), (3, 1), (10, 3), (1, 1000)]:
        case = f"prompt={P:,}, generated={G:,}"
        got = run(fn, P, G, case=case, crash_hint=_ratio_crash_hint)
        _ratio_verdict(got, flop_ratio(P, G), case, _RATIO_SLIPS, (P, G))
    for P, G in [(5, 4), (1000, 1000), (0, 1), (7, 2), (1, 1000)]:
        case = f"prompt={P:,}, generated={G:,}, prefill=True"
        got = run(fn, P, G, prefill=True, case=case, crash_hint=_ratio_crash_hint)
        _ratio_verdict(got, flop_ratio(P, G, prefill=True), case, _PREFILL_SLIPS, (P, G))
    return passed("decode steps alone: P + (G + 1)/2, 1,500.5 for 1,000 + 1,000; with the shared prefill on both "
                  "sides: 750.75")


def _reference_ratio(prompt, generated, prefill=False):
    return flop_ratio(prompt, generated, prefill=prefill)


check_flop_ratio.reference = _reference_ratio


def _ratio_crash_hint(e):
    text = str(e)
    if "unexpected keyword" in text:
        return "the third parameter must be called prefill: def recompute_over_cached(prompt, generated, prefill=False)"
    if "missing" in text and "positional" in text:
        return "give prefill a default, so the decode-only ratio is what you get without it: prefill=False"
    if isinstance(e, ZeroDivisionError):
        return "the cached cost of G >= 1 decode steps is never 0; check what you divide by"
    return None


def _ratio_verdict(result, want, case, slips, inputs):
    got = _number(result, case)
    if math.isclose(got, want, rel_tol=1e-12):
        return
    problem = f"for {case} your ratio is {_fmt(got)}; expected {_fmt(want)}"
    if isinstance(result, (int, np.integer)) and got == math.floor(want):  # an int where a fraction belongs
        reject(problem, "the ratio is not a whole number here: use / rather than //")
    slip = first_slip(got, slips, inputs, same=_same_number)
    if slip is not None:
        reject(problem, slip.hint)
    reject(problem, "divide recompute FLOPs by cached FLOPs for the same G decode steps (N cancels); with "
                    "prefill=True add the prefill, 2N x P, to both")


# ------------------------------------------------------------------------------------- past K/V drift

_ROUNDING = 1e-5  # float32 keeps about 7 digits; values near 1 that differ only by rounding stay well below this


def _pair(run_, ids, n, layer):
    (K1, V1), (K2, V2) = run_(list(ids[:n]))[layer], run_(list(ids))[layer]
    return K1, V1, K2, V2


def _drift(run_, ids, n, layer):
    """The reference: first n positions of `layer`, from a run over ids[:n] against a run over all ids."""
    K1, V1, K2, V2 = _pair(run_, ids, n, layer)
    return float(max(np.abs(K1 - K2[:, :n]).max(initial=0.0), np.abs(V1 - V2[:, :n]).max(initial=0.0)))


def _from(stat, which="kv", first=True):
    """A wrong experiment: `stat` of the difference, over keys and/or values, first or last n positions."""
    def wrong(run_, ids, n, layer):
        K1, V1, K2, V2 = _pair(run_, ids, n, layer)
        part = (lambda a: a[:, :n]) if first else (lambda a: a[:, -n:])
        diffs = [K1 - part(K2)] * ("k" in which) + [V1 - part(V2)] * ("v" in which)
        return float(max(stat(x) for x in diffs))
    return wrong


_DRIFT_SLIPS = [
    Slip("layer 0 always", lambda r, ids, n, layer: _drift(r, ids, n, 0) if layer else None, "",
         "you compared layer 0 whatever `layer` said; pick run(...)[layer]"),
    Slip("keys only", _from(lambda x: np.abs(x).max(), "k"), "",
         "you compared the keys only; the values are cached too, so compare V as well"),
    Slip("values only", _from(lambda x: np.abs(x).max(), "v"), "",
         "you compared the values only; compare the keys as well"),
    Slip("signed difference", _from(lambda x: x.max()), "",
         "take the absolute difference before the max: a change downwards counts too"),
    Slip("mean, not max", _from(lambda x: np.abs(x).mean()), "",
         "report the largest difference (max), not the mean: one moved entry is enough"),
    Slip("sum, not max", _from(lambda x: np.abs(x).sum()), "",
         "report the largest absolute difference (max), not the sum of them"),
    Slip("last n positions", _from(lambda x: np.abs(x).max(), first=False), "",
         "compare the first n positions, K_long[:, :n]: those are the tokens both runs have seen"),
]


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

    def run_tiny(ids):
        caches = new_cache(cfg, np.float32, static=False)
        forward(cfg, w, ids, caches)
        return [(c.k, c.v) for c in caches]

    return cfg, run_tiny


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
        ("layer 1 of the tiny transformer (float32, causal)", tiny, tiny_ids, 7, 1),
    ]


@checker
def check_past_kv_drift(fn):
    """fn(run, ids, n, layer=0) -> largest |difference| between the first n positions of K and V of `layer`,
    computed once from ids[:n] and once from all of ids. run(ids) -> [(K, V) per layer], K, V [Hkv, S, d].
    """
    for case, run_, ids, n, layer in _drift_cases():
        result = run(fn, run_, list(ids), n, layer, case=case, crash_hint=_drift_crash_hint)
        if isinstance(result, (bool, np.bool_)):
            reject(f"for {case} your function returned {result!r}",
                   "return the largest absolute difference as a number (0.0 means nothing moved), not a bool")
        got = _number(result, case)
        want = _drift(run_, ids, n, layer)
        if want <= _ROUNDING:  # causal: the past may differ by float rounding only, never by more
            if 0 <= got <= _ROUNDING:
                continue
        elif math.isclose(got, want, rel_tol=1e-9):
            continue
        _drift_diagnosis(fn, got, want, case, (run_, ids, n, layer))
    return passed("your experiment sees a change in K or V at any layer, and none in a causal model")


def _reference_drift(run, ids, n, layer=0):
    return _drift(run, ids, n, layer)


check_past_kv_drift.reference = _reference_drift


def _drift_crash_hint(e):
    text = str(e)
    if "broadcast" in text or "shape" in text:
        return "positions are axis 1 of K [Hkv, S, d]: compare K_short with K_long[:, :n], not K_long[:n]"
    if isinstance(e, (IndexError, TypeError)):
        return "run(ids) returns a list with one (K, V) pair per layer: K, V = run(ids)[layer]"
    return None


def _drift_diagnosis(fn, got, want, case, inputs):
    if want <= _ROUNDING:
        problem = f"for {case} your drift is {got:.3g}; a causal model's past does not move (rounding aside)"
    else:
        problem = f"for {case} your drift is {got:.4g}; expected {want:.4g}"
    if got < 0:
        reject(problem, "a largest absolute difference is never negative: take np.abs before the max")
    if want > _ROUNDING and got <= _ROUNDING and not _sees_change(fn):
        reject(problem, "your experiment sees no change even in a model whose past moves. Run the model twice, on "
                        "ids[:n] and on ids, and compare the first n positions")
    slip = first_slip(got, _DRIFT_SLIPS, inputs, same=_same_number)
    if slip is not None:
        reject(problem, slip.hint)
    if want <= _ROUNDING:
        reject(problem, "in a causal model the first n positions come out the same from both runs; compare only "
                        "those: K_short against K_long[:, :n]")
    reject(problem, "run the model twice, on ids[:n] and on ids, and compare the first n positions of K and of V at "
                    "that layer: the largest absolute difference")


def _sees_change(fn):
    """Does the learner's experiment report anything at all on a model whose past plainly moves?"""
    case = "a model whose every layer leaks"
    try:
        got = as_number(run(fn, _FakeModel(leak_k={0, 1}, leak_v={0, 1}), [3, 1, 4, 1, 5, 9], 3, 0, case=case), case)
    except Reject:  # it crashed or returned junk there; the caller reports the main problem either way
        return False
    return got > _ROUNDING
