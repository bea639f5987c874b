"""Checkers for lesson 16: the nucleus of top-p when probabilities tie, and the blocks an abort gives back.

The nucleus checker runs the learner's cut on distributions built so that the running sum reaches top_p inside a
tie, at a tie's edge, exactly on a boundary and nowhere near one, and compares with kvlesson.sample's rule (keep
every token at least as probable as the one at which the running sum first reaches top_p). It names the slips: a
cut through a tie (the sort's first n tokens), stopping one token short (the sum must reach top_p, not stay below it),
forgetting to rescale, cutting on probability alone. The abort checker asks which blocks go back to the free pool
when one sequence of a fork is aborted; it names giving back every block, giving back only the shared ones, and
counting a block twice.
"""
import numpy as np

from kvlesson.sample import Sampling, probabilities
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_nucleus", "check_abort_blocks"]


# ------------------------------------------------------------------------------------------------ top-p

def _nucleus(p, top_p):
    """kvlesson's own: probabilities [V] -> the nucleus, rescaled to sum to 1."""
    return probabilities(np.log(np.asarray(p, np.float64)), Sampling(temperature=1.0, top_p=float(top_p)))


_NUCLEUS_CASES = [  # (what, p, top_p)
    ("the running sum reaches 0.5 inside a tie of four tokens at 0.2", [0.2, 0.1, 0.2, 0.2, 0.1, 0.2], 0.5),
    ("a tie of two at the edge: 0.4, then 0.25 and 0.25, top_p 0.6", [0.25, 0.4, 0.1, 0.25], 0.6),
    ("one token holds 0.7, top_p 0.5", [0.1, 0.7, 0.1, 0.1], 0.5),
    ("all tokens equally probable, top_p 0.3", [0.25, 0.25, 0.25, 0.25], 0.3),
    ("top_p 1 keeps everything", [0.5, 0.3, 0.15, 0.05], 1.0),
    ("the sum reaches 0.85 on the third token, two small tokens tied far below", [0.05, 0.5, 0.1, 0.3, 0.05], 0.85),
]


def _sort_prefix(p, top_p):
    """The slip: the sort's first n tokens, whatever order the sort left a tie in."""
    p = np.asarray(p, np.float64)
    order = np.argsort(-p, kind="stable")
    n = int(np.searchsorted(np.cumsum(p[order]), top_p * p.sum() - 1e-12)) + 1
    out = np.zeros_like(p)
    out[order[:n]] = p[order[:n]]
    return out / out.sum()


def _one_short(p, top_p):
    """The slip: tokens whose running sum stays below top_p, without the one that reaches it."""
    p = np.asarray(p, np.float64)
    order = np.argsort(-p, kind="stable")
    keep = order[np.cumsum(p[order]) < top_p - 1e-12]
    keep = keep if keep.size else order[:1]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def _not_rescaled(p, top_p):
    got = _nucleus(p, top_p)
    p = np.asarray(p, np.float64)
    return np.where(got > 0, p, 0.0)


def _above_top_p(p, top_p):
    p = np.asarray(p, np.float64)
    out = np.where(p >= top_p, p, 0.0)
    return out / out.sum() if out.sum() else out


_NUCLEUS_SLIPS = [
    Slip("cut through a tie", _sort_prefix, "for {case}: you kept some of the tied tokens and dropped others",
         "tokens that are equally probable must be kept or dropped together, or the answer depends on the order a "
         "sort left them in (and so on the batch, the machine): keep every token at least as probable as the one "
         "at which the running sum first reaches top_p"),
    Slip("one short", _one_short, "for {case}: your nucleus holds less than top_p of the probability",
         "keep tokens until the running sum reaches top_p: the token that crosses it belongs to the nucleus"),
    Slip("not rescaled", _not_rescaled, "for {case}: what you kept does not sum to 1",
         "divide what is kept by its sum: it is the distribution the token is drawn from"),
    Slip("probability above top_p", _above_top_p, "for {case}: you kept the tokens whose own probability is at "
         "least top_p", "top_p is a share of the total, compared with a running sum from the most probable down, "
         "not with each token's probability (that is closer to min-p)"),
]


@checker
def check_nucleus(fn):
    """fn(p, top_p) -> the nucleus of p [V]: every token at least as probable as the one at which the running sum,
    most probable first, first reaches top_p; the rest 0; rescaled to sum to 1."""
    for case, p, top_p in _NUCLEUS_CASES:
        want = _nucleus(p, top_p)
        given = np.array(p)
        got = as_array(run(fn, given.copy(), top_p, case=case), case)
        if got.shape != want.shape:
            reject(f"for {case}: you returned shape {got.shape}; expected {want.shape}",
                   "one probability per token, 0 for the tokens cut")
        if not np.isfinite(got).all():
            reject(f"for {case}: your answer holds NaN or infinity", "divide by the sum of what is kept, which is > 0")
        if np.allclose(got, want, atol=1e-9):
            continue
        slip = first_slip(got, _NUCLEUS_SLIPS, (given, top_p))
        if slip is not None:
            reject_slip(slip, case)
        reject(f"for {case}: you returned {np.round(got, 3).tolist()}; expected {np.round(want, 3).tolist()}",
               "sort most probable first, find the first token whose running sum reaches top_p, keep every token at "
               "least as probable as it, then rescale")
    return passed("ties are kept whole, the token that reaches top_p is in, and the nucleus is rescaled")


# ------------------------------------------------------------------------------------------------ abort

_ABORT_CASES = [  # (what, tables {sequence: its block table}, the aborted sequence)
    ("a fork of 'a' that shares its two full blocks and has one of its own", {"a": [0, 1, 2], "b": [0, 1, 5]}, "b"),
    ("aborting the parent of that fork", {"a": [0, 1, 2], "b": [0, 1, 5]}, "a"),
    ("three sequences on one shared prefix block", {"a": [3, 4], "b": [3, 6], "c": [3, 7, 8]}, "c"),
    ("a sequence that shares nothing", {"a": [0, 1], "b": [2, 3, 4]}, "b"),
    ("a fork that has not written yet (every block shared)", {"a": [0, 1, 2], "b": [0, 1, 2]}, "b"),
]


def _returned(tables, aborted):
    others = {b for seq, t in tables.items() if seq != aborted for b in t}
    return sorted(set(tables[aborted]) - others)


_ABORT_SLIPS = [
    Slip("all its blocks", lambda t, a: sorted(set(t[a])), "for {case}: you gave back blocks another sequence "
         "still reads", "a shared block goes back only when nobody points at it any more: its reference count "
         "drops by one, and the other sequence keeps reading it"),
    Slip("only the shared", lambda t, a: sorted(set(t[a]) & {b for s, x in t.items() if s != a for b in x}),
         "for {case}: you gave back the shared blocks and kept its own", "the other way round: its private blocks "
         "lose their only user, the shared ones keep theirs"),
    Slip("none", lambda t, a: [], "for {case}: you gave back nothing",
         "its private blocks (reference count 1) go back to the pool at once; that is the point of aborting"),
]


@checker
def check_abort_blocks(fn):
    """fn(tables, aborted) -> sorted list of the blocks that go back to the free pool when sequence `aborted` is
    aborted; tables maps each live sequence to its block table (a list of block ids)."""
    for case, tables, aborted in _ABORT_CASES:
        want = _returned(tables, aborted)
        given = {s: list(t) for s, t in tables.items()}
        got = run(fn, given, aborted, case=case)
        if given != tables:
            reject(f"for {case}: your function changed the block tables", "read them; the pool still needs them")
        if isinstance(got, (set, tuple, np.ndarray)):
            got = got.tolist() if isinstance(got, np.ndarray) else list(got)
        if not isinstance(got, list) or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool)
                                                for b in got):
            reject(f"for {case}: you returned {type(got).__name__} {got!r:.60}; expected a list of block ids",
                   "return the ids of the blocks that go back, as a list of ints")
        got = [int(b) for b in got]
        if len(got) != len(set(got)):
            reject(f"for {case}: a block appears twice in your answer {got}",
                   "a block goes back once: count blocks, not places in the table")
        if sorted(got) == want:
            continue
        slip = first_slip(sorted(got), _ABORT_SLIPS, (tables, aborted), same=lambda g, w: g == list(w))
        if slip is not None:
            reject_slip(slip, case)
        reject(f"for {case}: you returned {sorted(got)}; expected {want}",
               "a block of the aborted sequence goes back when no other table points at it")
    return passed("an abort gives back exactly the blocks nobody else points at; shared ones stay with their users")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_nucleus.reference = _nucleus
check_abort_blocks.reference = _returned
