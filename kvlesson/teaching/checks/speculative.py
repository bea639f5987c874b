"""Checkers for lesson 14: the tree attention mask, the accept rule of speculative sampling, and truncate on a paged
sequence.

check_tree_mask compares the learner's mask with kvlesson.tree_mask on chains, forks, several roots, an empty cache
and no nodes at all, and names the slip that explains it on every tree it got wrong: the offset mask (siblings see
each other), the parent alone instead of every ancestor, a node blind to itself, descendants for ancestors, the
cached keys left out.

check_accept first runs cases whose answer is certain (one-hot distributions, p = q, drafts p favours at least as
much as q), then a statistical one: over TRIALS seeded trials, drafts sampled from q, the first emitted token must
follow p_target[0] and, after an accepted first draft, the second must follow p_target[1] (a chi-square test at
ALPHA: a correct rule fails it with probability ALPHA, whatever order it draws its random numbers in). The hint says
which rule the answer behaves like: the ratio upside down, a rejection resampled from p, every draft accepted.

check_paged_truncate plays scripts of appends, forks and truncations on the learner's pool and on kvlesson's, and
after each step compares what can be seen from outside: every sequence's keys, its block count, the reference
counts against the tables that point at each block, and the free blocks.
"""
import math

import numpy as np

from kvlesson.sdpa import tree_depths, tree_mask
from kvlesson.serving.paged import PagedKVCache
from kvlesson.speculative import accept, walk
from kvlesson.teaching.checks.delegation import refuse_delegation
from kvlesson.teaching.checks.mask import slip_for_all
from kvlesson.teaching.checks.scheduler import slip_for_answers
from kvlesson.teaching.verdict import (
    TIME_LIMIT,
    Slip,
    as_array,
    as_number,
    attempt,
    attribute,
    checker,
    first_slip,
    passed,
    reject,
    run,
    time_limit,
)

__all__ = ["check_tree_mask", "check_accept", "check_paged_truncate", "check_tokens_per_pass", "check_tree_walk"]

ALPHA = 1e-4  # significance of the checker's chi-square tests: a right rule is refused this rarely
TRIALS = 4000  # seeded trials per statistical case: enough for every slip below to fail by far (tested)


def chi_square_p(counts, probs):
    """-> the p-value of Pearson's chi-square test that `counts` [V] were drawn from `probs` [V] (V odd, so the
    degrees of freedom V - 1 are even and the tail has a closed form: e^(-x/2) sum_j<m (x/2)^j / j!, m = (V-1)/2)."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    V, n = len(counts), counts.sum()
    if V % 2 == 0:
        raise ValueError(f"chi_square_p needs an odd number of categories; got {V}")
    expected = n * probs
    x = float(((counts - expected) ** 2 / expected).sum())
    half = x / 2
    return math.exp(-half) * sum(half**j / math.factorial(j) for j in range((V - 1) // 2))


# ------------------------------------------------------------------------------------------------ tree mask

_TREE_CASES = [  # (what, parents, S): the lesson's tree first
    ("the lesson's tree, parents [-1, 0, 0, 1, 2] over S=3 cached keys", [-1, 0, 0, 1, 2], 3),
    ("a chain, parents [-1, 0, 1, 2], S=2", [-1, 0, 1, 2], 2),
    ("two roots, parents [-1, -1, 0, 1], S=4", [-1, -1, 0, 1], 4),
    ("a deeper tree, parents [-1, 0, 1, 0, 3, 3, 2], S=5", [-1, 0, 1, 0, 3, 3, 2], 5),
    ("an empty cache, parents [-1, 0, 0], S=0", [-1, 0, 0], 0),
    ("a chain of 6 nodes, S=1", [-1, 0, 1, 2, 3, 4], 1),
    ("a tree of 12 nodes, depth 6: a chain with branches, S=2", [-1, 0, 1, 2, 3, 4, 5, 1, 7, 3, 9, 10], 2),
    ("a tree of 16 nodes (each a child of an earlier node drawn at random), S=3",
     [-1, 0, 1, 1, 3, 2, 4, 0, 4, 3, 0, 6, 5, 0, 4, 13], 3),
    ("one node, parents [-1], S=6", [-1], 6),
    ("no nodes, parents [], S=3", [], 3),
]


def _ancestry(parents, own=True, depth=None):
    """bool [T, T]: row i marks i (when own) and its ancestors, or only the first `depth` of them."""
    T = len(parents)
    out = np.zeros((T, T), bool)
    for i in range(T):
        out[i, i] = own
        p, steps = parents[i], 0
        while p >= 0 and (depth is None or steps < depth):
            out[i, p] = True
            p, steps = parents[p], steps + 1
    return out


def _with_cache(rows, S, seen=True):
    return np.concatenate([np.full((rows.shape[0], S), seen), rows], axis=1)


_TREE_SLIPS = [
    Slip("offset mask", lambda parents, S: np.tril(np.ones((len(parents), S + len(parents)), bool), k=S), "",
         "that is the offset causal mask of a chunk: node i sees every node before it, siblings and cousins "
         "included. In a tree node i may see only the nodes on its own branch: itself and its ancestors, found by "
         "following parents[i] up to -1"),
    Slip("parent only", lambda parents, S: _with_cache(_ancestry(parents, depth=1), S), "",
         "node i sees its parent but not its parent's parent: a draft depends on its whole branch. Walk "
         "parents[] all the way up (or OR in the parent's row, which is complete because parents[i] < i)"),
    Slip("itself left out", lambda parents, S: _with_cache(_ancestry(parents, own=False), S), "",
         "a node must see its own key too, as every query does in causal attention (the diagonal is True)"),
    Slip("descendants", lambda parents, S: _with_cache(_ancestry(parents).T, S), "",
         "that marks node i's descendants, its future: row i must mark its ancestors, the nodes its branch "
         "passed through to reach it (the transpose of what you have)"),
    Slip("cache hidden", lambda parents, S: _with_cache(_ancestry(parents), S, seen=False), "",
         "every node comes after the whole cached text, so it sees all S cached keys: the first S columns are "
         "True"),
]


@checker
def check_tree_mask(fn):
    """fn(parents, S) -> bool [T, S + T]: node i sees the S cached keys and, among the T new ones, itself and its
    ancestors (parents[i] < i, or -1 for a child of the last cached token)."""
    refuse_delegation(fn, tree_mask, "tree_mask")
    answers = []  # (case, (parents, S), what the learner's mask shows)
    for case, parents, S in _TREE_CASES:
        want, T = tree_mask(parents, S), len(parents)
        got = as_array(run(fn, list(parents), S, case=case), case)
        if got.shape != want.shape:
            hint = ("the new nodes attend over the cache AND the tree: S + T columns, the S cached keys first"
                    if got.shape == (T, T) else "one row per node (T), one column per key: S cached, then T new")
            reject(f"for {case} the mask has shape {got.shape}; expected {want.shape}", hint)
        answers.append((case, (list(parents), S), got))
    wrong = [(args, got != 0) for _, args, got in answers if not np.array_equal(got != 0, tree_mask(*args))]
    for case, (parents, S), got in answers:
        want = tree_mask(parents, S)
        if not np.array_equal(got != 0, want):
            slip = slip_for_all(_TREE_SLIPS, wrong)
            i = int(np.flatnonzero(((got != 0) != want).any(axis=1))[0])
            reject(f"for {case} node {i} (depth {tree_depths(parents)[i]}) sees {_named(got[i] != 0, S)}; it "
                   f"should see {_named(want[i], S)}",
                   slip.hint if slip else "node i sees the S cached keys, itself, and its ancestors only")
        if got.dtype != bool:
            reject(f"for {case} the mask is {got.dtype}; expected bool",
                   "build it with dtype=bool, so that np.where(mask, scores, -np.inf) selects")
    return passed(f"tree_mask agrees with kvlesson.tree_mask on {len(_TREE_CASES)} trees: chains (of 6 nodes too), "
                  "forks, several roots, trees of 12 and 16 nodes, an empty cache, no nodes")


def _named(row, S):
    """bool [S + T] -> 'the 3 cached keys and nodes 0, 2' (or 'no cached key and node 1')."""
    cached, nodes = int(row[:S].sum()), np.flatnonzero(row[S:]).tolist()
    c = "every cached key" if cached == S and S else ("no cached key" if cached == 0 else f"{cached} of {S} cached "
                                                                                           "keys")
    n = "no node" if not nodes else ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))
    return f"{c} and {n}"


# ------------------------------------------------------------------------------------------------ the accept rule


def _certain_cases():
    """(what, p [k+1, V], q [k, V], drafts, check(out) -> None or what is wrong, hint): answers without chance."""
    V = 5
    eye = np.eye(V)
    return [
        ("greedy (one-hot p and q): the model wants [2, 4, 1, 3], the drafts are [2, 0, 1]",
         eye[[2, 4, 1, 3]], eye[[2, 0, 1]], [2, 0, 1], [2, 4],
         "with one-hot p and q a draft is kept exactly when it is the target's argmax (p/q is 1 or 0), and the "
         "first rejection is replaced by the argmax: max(0, p - q) is then p itself"),
        ("every draft accepted (one-hot p and q): target [3, 3, 0, 4], drafts [3, 3, 0]",
         eye[[3, 3, 0, 4]], eye[[3, 3, 0]], [3, 3, 0], [3, 3, 0, 4],
         "after k acceptances the round is not over: sample one more token from p_target[k], the row after "
         "the last draft. A round always emits one token more than it accepts"),
        ("no drafts (k = 0): p_target has one row, one-hot at 1", eye[[1]], np.zeros((0, V)), [], [1],
         "with k = 0 nothing is drafted, and the round emits one token sampled from p_target[0]"),
    ]


def _q_over_p(p, q, tokens, rng):
    """A slip: the ratio upside down."""
    out = []
    for i, x in enumerate(tokens):
        if p[i, x] > 0 and rng.random() < min(1.0, q[i, x] / p[i, x]):
            out.append(x)
            continue
        r = np.maximum(p[i] - q[i], 0)
        return out + [int(rng.choice(len(r), p=r / r.sum() if r.sum() > 0 else p[i]))]
    return out + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


def _resample_from_p(p, q, tokens, rng):
    """A slip: a rejected draft replaced by a sample from p, which over-weights what the draft already tried."""
    out = []
    for i, x in enumerate(tokens):
        if rng.random() < min(1.0, p[i, x] / q[i, x]):
            out.append(x)
            continue
        return out + [int(rng.choice(p.shape[1], p=p[i]))]
    return out + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


def _accept_all(p, q, tokens, rng):
    """A slip: every draft kept, the target only asked for the last token."""
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


# p and q chosen so that each slip moves the first token's distribution far from p[0] (tests/test_checks_...)
_P = np.array([[0.40, 0.25, 0.15, 0.12, 0.08],
               [0.05, 0.10, 0.15, 0.30, 0.40],
               [0.20, 0.20, 0.20, 0.20, 0.20]])  # [k + 1 = 3, V = 5]
_Q = np.array([[0.10, 0.20, 0.30, 0.30, 0.10],
               [0.30, 0.30, 0.20, 0.10, 0.10]])  # [k = 2, V = 5]

ACCEPT_SLIPS = [
    Slip("q over p", _q_over_p, "",
         "draft d is kept with probability min(1, p(d) / q(d)): target over draft. The ratio upside down keeps "
         "what the drafter likes more than the target does, so those tokens come out too often"),
    Slip("resample from p", _resample_from_p, "",
         "after a rejection, sample from max(0, p - q), normalised, not from p: the acceptance step already gave "
         "every token min(p, q) of its probability, and only the rest, p - min(p, q), is left to hand out"),
    Slip("accept all", _accept_all, "",
         "a draft is a guess: keep it with probability min(1, p(d) / q(d)), one uniform draw per draft, and stop "
         "at the first one you reject"),
]


def _emitted(x, case, k, V):
    """The learner's output -> list of ints, or a NOT YET."""
    a = as_array(x, case)
    whole = a.dtype.kind in "iu" or (a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.round(a)).all())
    if a.ndim != 1 or not whole:
        reject(f"for {case} your function returned {a.dtype} of shape {a.shape}; expected a list of token ids",
               "return the emitted ids: the accepted drafts, then one token of the target's")
    out = [int(t) for t in a]
    if not 1 <= len(out) <= k + 1:
        reject(f"for {case} your function emitted {len(out)} tokens; a round emits between 1 and k + 1 = {k + 1}",
               "the accepted drafts (0 to k of them), then exactly one token sampled by the target")
    if any(not 0 <= t < V for t in out):
        reject(f"for {case} your function emitted {out}, outside the vocabulary of {V}", "emit token ids in [0, V)")
    return out


def _argmax_bonus(p, q, tokens, rng):
    """A slip: the right rule, but the token after k acceptances is the target's argmax, not a sample."""
    out = accept(p, q, tokens, rng)
    return out[:-1] + [int(np.argmax(p[len(tokens)]))] if len(out) == len(tokens) + 1 else out


BONUS_SLIPS = [
    Slip("argmax bonus", _argmax_bonus, "",
         "after k acceptances the last token is SAMPLED from p_target[k], like any other token at a temperature "
         "above 0: taking its argmax makes every fully accepted round greedy at its end"),
]

# the target's rows for the bonus case: drafts p favours exactly as much as q (always kept), then a last row unlike
# them, whose argmax (4) it must not always take
_P_BONUS = np.array([[0.10, 0.20, 0.30, 0.25, 0.15],
                     [0.10, 0.20, 0.30, 0.25, 0.15],
                     [0.30, 0.05, 0.15, 0.10, 0.40]])  # [k + 1 = 3, V = 5]

_POSITIONS = (  # (what is counted, the row it must follow, the slips that can explain it)
    ("first emitted token", "p_target[0]", ACCEPT_SLIPS),
    ("second emitted token, in the trials that kept draft 1,", "p_target[1]", ACCEPT_SLIPS),
    ("last token, in rounds that kept both drafts,", "p_target[2]", BONUS_SLIPS),
)


@checker
def check_accept(fn):
    """fn(p_target [k+1, V], q_draft [k, V], draft_tokens [k], rng) -> the emitted ids: the accepted drafts, then
    one token of the target's. The emitted tokens must follow the target's distribution exactly, at every position
    of a round, the token after k acceptances included; p_target, q_draft and draft_tokens are read, never changed."""
    refuse_delegation(fn, accept, "speculative.accept")
    rng = np.random.default_rng(14)
    for case, p, q, drafts, want, hint in _certain_cases():
        out = _call(fn, p, q, drafts, rng, case)
        if out != want:
            slip = next((s for s in ACCEPT_SLIPS if s.wrong(p, q, drafts, np.random.default_rng(0)) == out), None)
            reject(f"for {case} your function emitted {out}; it should emit {want}", slip.hint if slip else hint)
    case = "p_target equal to q_draft (every draft must be kept)"
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]] * 3)
    for _ in range(50):
        out = _call(fn, p, p[:2], [2, 4], rng, case)
        if out[:2] != [2, 4] or len(out) != 3:
            reject(f"for {case} your function emitted {out}; it should keep both drafts [2, 4], then sample one more",
                   "p(d) / q(d) = 1, and min(1, 1) = 1: a draft the target likes exactly as much as the drafter is "
                   "always kept")
    samples = _trials(fn, rng)
    probs = (_P[0], _P[1], _P_BONUS[2])
    if all(chi_square_p(np.bincount(x, minlength=5), pr) >= ALPHA for x, pr in zip(samples, probs, strict=True)):
        return passed(f"certain cases exact; over {TRIALS:,} seeded trials each the first token follows p_target[0], "
                      "the second after an accepted draft p_target[1], and the token after k accepted drafts is "
                      f"sampled from p_target[k] (chi-square tests at {ALPHA:g}); the inputs are left unchanged")
    at = next(j for j, (x, pr) in enumerate(zip(samples, probs, strict=True))
              if chi_square_p(np.bincount(x, minlength=5), pr) < ALPHA)
    what, row, slips = _POSITIONS[at]
    freq = np.bincount(samples[at], minlength=5) / len(samples[at])
    for slip in slips:
        theirs = _trials(slip.wrong, np.random.default_rng(15))[at]
        if np.abs(np.bincount(theirs, minlength=5) / len(theirs) - freq).max() < 0.03:
            _reject_distribution(what, row, freq, probs[at], len(samples[at]), slip.hint)
    _reject_distribution(what, row, freq, probs[at], len(samples[at]),
                         "keep draft d with probability min(1, p(d) / q(d)); at the first rejection sample from "
                         "max(0, p - q) normalised; after k acceptances sample from p_target[k]")


def _call(fn, p, q, drafts, rng, case):
    """The learner's accept on copies of p, q and drafts -> the emitted ids; a NOT YET if it changed its inputs."""
    given = (p.copy(), q.copy(), list(drafts))
    out = _emitted(run(fn, *given, rng, case=case), case, len(drafts), p.shape[1])
    for name, mine, theirs in (("p_target", p, given[0]), ("q_draft", q, given[1])):
        if not isinstance(theirs, np.ndarray) or theirs.shape != mine.shape or not np.array_equal(theirs, mine):
            reject(f"for {case} your function changed {name} in place",
                   f"the caller still needs {name} after the round (speculative.generate reads the target's rows "
                   "again, a test reuses them): compute the residual into a new array (np.maximum(p[i] - q[i], 0) "
                   "makes one) and never assign into the inputs")
    if given[2] != list(drafts):
        reject(f"for {case} your function changed draft_tokens", "read the drafts; return the emitted ids in a new "
                                                                 "list")
    return out


def _trials(fn, rng):
    """-> (first emitted token of each trial [TRIALS], second emitted token of the trials that kept draft 1, the
    token after both drafts in TRIALS rounds that must keep them)."""
    first, second, bonus = [], [], []
    with time_limit(TIME_LIMIT):  # one limit for every trial: a watchdog thread per call costs more than the calls
        for t in range(TRIALS):
            drafts = [int(rng.choice(5, p=_Q[0])), int(rng.choice(5, p=_Q[1]))]
            out = _call(fn, _P, _Q, drafts, rng, f"trial {t} (drafts {drafts})")
            first.append(out[0])
            if out[0] == drafts[0] and len(out) > 1:
                second.append(out[1])
            drafts = [int(rng.choice(5, p=_P_BONUS[0])), int(rng.choice(5, p=_P_BONUS[1]))]
            out = _call(fn, _P_BONUS, _P_BONUS[:2], drafts, rng, f"trial {t} with p_target = q_draft (drafts {drafts})")
            if len(out) == 3:
                bonus.append(out[2])
    return np.array(first, int), np.array(second, int), np.array(bonus, int)


def _reject_distribution(what, row, freq, probs, n, hint):
    shown = ", ".join(f"{f:.2f}" for f in freq)
    reject(f"over {n:,} trials your {what} came out with frequencies [{shown}]; it must follow the target's {row}, "
           f"[{', '.join(f'{x:.2f}' for x in probs)}]", hint)


# ------------------------------------------------------------------------------------------------ paged truncate

_TRUNCATE_SCRIPTS = [  # (what, [(op, sequence, n)]); pools of 6 blocks of 4 slots; sequence 0 is made first
    ("truncate inside a block", [("append", 0, 10), ("truncate", 0, 5), ("append", 0, 2)]),
    ("truncate to a block boundary", [("append", 0, 10), ("truncate", 0, 8), ("truncate", 0, 4), ("append", 0, 5)]),
    ("truncate to nothing", [("append", 0, 9), ("truncate", 0, 0), ("append", 0, 3)]),
    ("truncate to the same length", [("append", 0, 6), ("truncate", 0, 6), ("append", 0, 1)]),
    ("truncate a fork", [("append", 0, 10), ("fork", 0, 0), ("truncate", 1, 5), ("append", 1, 1), ("append", 0, 1)]),
    ("truncate the parent of a fork", [("append", 0, 7), ("fork", 0, 0), ("truncate", 0, 2), ("append", 0, 3),
                                       ("free", 1, 0)]),
    ("a draft's round trip", [("append", 0, 3), ("append", 0, 5), ("truncate", 0, 4), ("append", 0, 5),
                              ("truncate", 0, 6)]),
]


_TRUNCATE = PagedKVCache.truncate  # kvlesson's, for the reference pool while the learner's class is checked


@checker
def check_paged_truncate(cls):
    """cls: a PagedKVCache subclass with its own truncate(seq, n): keep the first n positions of sequence seq, give
    back every block past them that no other sequence uses, keep shared ones shared, keep published ones cached."""
    if isinstance(cls, type) and issubclass(cls, PagedKVCache) and cls.truncate is _TRUNCATE:
        reject("your class does not define truncate: it is still kvlesson's",
               "write def truncate(self, seq, n): inside class MyPool(PagedKVCache)")
    refuse_delegation(cls, _TRUNCATE, "PagedKVCache.truncate", method="truncate")
    for name, script in _TRUNCATE_SCRIPTS:
        _truncate_script(cls, name, script)
    _truncate_published(cls)
    for n in (7, -1):
        _truncate_refused(cls, n)
    return passed("after every truncation each sequence keeps ceil(n / block_size) blocks and its keys; blocks no "
                  "one uses come back, published ones stay cached with their keys; a fork's blocks stay with it; n "
                  "past the end or below 0 is refused")


def _truncate_script(cls, name, script, n_blocks=6, block_size=4):
    yours = run(cls, n_blocks, block_size, 1, 1, case=f"{name}: making the pool")
    if not isinstance(yours, PagedKVCache):
        reject(f"{name}: your class made a {type(yours).__name__}, not a PagedKVCache",
               "write class MyPool(PagedKVCache) and override truncate only, so the rest of the pool is kvlesson's")
    ours, rng = PagedKVCache(n_blocks, block_size, 1, 1), np.random.default_rng(4)
    seqs = [(run(yours.new_sequence, case=name), ours.new_sequence())]
    for step, (op, i, n) in enumerate(script):
        case = f"{name}, step {step + 1} ({op} sequence {i}" + (f", n={n})" if op != "fork" else ")")
        y, o = seqs[i]
        if op == "fork":
            seqs.append((run(yours.fork, y, case=case), ours.fork(o)))
        elif op == "free":
            run(yours.free, y, case=case)
            ours.free(o)
        elif op == "append":
            k = rng.standard_normal((1, n, 1))
            ours.sequence(o).append(k, k)
            run(lambda: yours.sequence(y).append(k, k), case=case)  # noqa: B023  called right here
        else:
            ours.truncate(o, n)
            run(yours.truncate, y, n, case=case)
        _compare_pools(yours, ours, seqs, case, block_size)


def _truncate_refused(cls, n):
    case = f"truncate(seq, n={n}) of a sequence of 6 positions"
    why = ("a sequence cannot grow by truncating" if n > 0 else "a sequence holds 0 positions at least: n = -1 would "
           "drop every block and leave a length of -1, where the next append writes")
    yours = run(cls, 6, 4, 1, 1, case=case)
    seq = run(yours.new_sequence, case=case)
    run(lambda: yours.sequence(seq).append(np.ones((1, 6, 1)), np.ones((1, 6, 1))), case=case)
    free = attribute(yours, "blocks_free", case, "your pool")
    done = attempt(yours.truncate, seq, n)
    if done.error is None:
        reject(f"for {case} your pool accepted it", f"{why}: raise ValueError when n is below 0 or more than the "
                                                    "sequence holds, before changing anything")
    if not isinstance(done.error, ValueError):
        reject(f"for {case} your pool raised {type(done.error).__name__}, not ValueError",
               f"{why}: raise ValueError naming n, and change nothing")
    if attribute(yours, "blocks_free", case, "your pool") != free or run(yours.length, seq, case=case) != 6:
        reject(f"for {case} your pool raised, but changed state first", "check n before touching any state")


def _truncate_published(cls, n_blocks=6, bs=4):
    """Lesson 13's prefix cache on the pool: a published block that truncate leaves without a user must stay cached
    (idle, with its key), never go on the free list, where another sequence would write over what its key names."""
    name = "truncate a sequence whose full blocks were published to the prefix cache"
    yours = run(cls, n_blocks, bs, 1, 1, case=f"{name}: making the pool")
    ours = PagedKVCache(n_blocks, bs, 1, 1)
    ids = list(range(100, 110))  # the tokens at the sequence's 10 positions: two full blocks and two more
    k, other_k = np.random.default_rng(5).standard_normal((1, 10, 1)), np.full((1, 8, 1), 7.0)
    seq, o_seq = run(yours.new_sequence, case=name), ours.new_sequence()
    run(lambda: yours.sequence(seq).append(k, k), case=f"{name}, appending 10 positions")
    run(yours.publish, seq, ids, case=f"{name}, publishing its 2 full blocks")
    run(yours.truncate, seq, 3, case=f"{name}, truncate(seq, 3)")
    other, o_other = run(yours.new_sequence, case=name), ours.new_sequence()  # another text: every really free block
    run(lambda: yours.sequence(other).append(other_k, other_k), case=f"{name}, another sequence appending 8 positions")
    ours.sequence(o_seq).append(k, k)
    ours.publish(o_seq, ids)
    _TRUNCATE(ours, o_seq, 3)
    ours.sequence(o_other).append(other_k, other_k)
    case = f"{name}, after truncate(seq, 3) and another sequence's appends"
    _compare_pools(yours, ours, [(seq, o_seq), (other, o_other)], case, bs)
    found, want = run(yours.lookup, ids, case=case), ours.lookup(ids)
    if len(found) != len(want) or not np.array_equal(yours.k[:, found], ours.k[:, want]):
        reject(f"for {case} the prefix cache serves {len(found)} blocks for the published text, holding other keys "
               f"than it published; kvlesson's serves {len(want)}, with the keys the text computed",
               "a block registered in the prefix cache (block in self._key_of) that no table points at any more "
               "stays cached: put it at the end of self._idle (self._idle[block] = None), not on self._free. On the "
               "free list another sequence writes into it, and the cache then hands its key's text another text's "
               "keys and values")


def _compare_pools(yours, ours, seqs, case, block_size):
    for j, (y, o) in enumerate(seqs):
        if o not in ours._tables:
            continue
        n = ours.length(o)
        got_n = run(yours.length, y, case=case)
        if got_n != n:
            reject(f"after {case} sequence {j} holds {got_n!r} positions; it should hold {n}",
                   "set the sequence's length to n (self._lens[seq] = n): the next append writes at position n")
        table = run(yours.block_table, y, case=case)
        if not isinstance(table, list) or len(table) != len(ours.block_table(o)):
            want = len(ours.block_table(o))
            got = len(table) if isinstance(table, list) else table
            reject(f"after {case} sequence {j} keeps {got} block{'s' if got != 1 else ''}; {n} positions need "
                   f"ceil({n} / {block_size}) = {want}",
                   "keep ceil(n / block_size) blocks: a partly filled last block stays (n // block_size would drop "
                   "its positions), an empty one past a boundary goes")
        K = as_array(run(lambda: yours.gather(y)[0], case=case), case, "your pool's gather")  # noqa: B023
        if K.shape != ours.gather(o)[0].shape or not np.array_equal(K, ours.gather(o)[0]):
            reject(f"after {case} sequence {j}'s keys are wrong",
                   "a block another sequence still points at went back to the free list and was written over: "
                   "free a block only when its reference count drops to 0")
    pointers = {}
    for t in yours._tables.values():
        for b in t:
            pointers[b] = pointers.get(b, 0) + 1
    for b, count in enumerate(yours.refs):
        if count != pointers.get(b, 0):
            reject(f"after {case} block {b} has refs {count}, but {pointers.get(b, 0)} block tables point at it",
                   "each block dropped from a table loses one user: refs[block] -= 1, and it goes back to the free "
                   "list (self._free.append(block)) only when that reaches 0")
    free, want = attribute(yours, "blocks_free", case, "your pool"), ours.blocks_free
    if free != want:
        reject(f"after {case} your pool has {free} free blocks; {want} should be free",
               "a block no table points at any more belongs on the free list, once; one still in use does not"
               if free > want else "every block past ceil(n / block_size) that no one else uses goes back to the "
                                   "free list (self._free.append(block))")
    free_list, idle = list(getattr(yours, "_free", [])), set(getattr(yours, "_idle", {}))
    for b in range(len(yours.refs)):
        places = (pointers.get(b, 0) > 0) + free_list.count(b) + (b in idle)
        if places != 1 or b in free_list and b in getattr(yours, "_key_of", {}):
            where = ("on the free list twice" if free_list.count(b) > 1 else "both in use and free" if places > 1
                     else "nowhere: neither in a table nor free" if places == 0
                     else "on the free list while the prefix cache still names it")
            reject(f"after {case} block {b} is {where}",
                   "a block is in exactly one place: in a table (refs > 0), on the free list (self._free), or cached "
                   "with no user (self._idle, when the prefix cache registered it: block in self._key_of)")


# ------------------------------------------------------------------------------------------------ tokens per pass


def tokens_per_pass(alpha, k):
    """Expected tokens a round emits when each of its k drafts is accepted with probability alpha, independently
    of the others, until the first rejection: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


_PASS_CASES = [(a, k) for a in (0.0, 0.25, 0.5, 0.8, 1.0) for k in (0, 1, 3, 7)]

_PASS_SLIPS = [
    Slip("independent drafts", lambda a, k: 1 + k * a, "",
         "a draft counts only if every draft before it was accepted: the round stops at the first rejection, so "
         "draft j is emitted with probability alpha^j, not alpha"),
    Slip("no bonus", lambda a, k: tokens_per_pass(a, k) - 1, "",
         "every round also emits one token of the target's own, after the accepted drafts: the sum starts at 1"),
    Slip("bonus only when all accepted", lambda a, k: tokens_per_pass(a, k) - 1 + a ** k, "",
         "the target's own token comes out in every round: after the first rejection it is the residual's sample "
         "(greedy: the target's argmax), and after k acceptances a sample of the last row"),
    Slip("k infinite", lambda a, k: 1 / (1 - a) if a < 1 else math.inf, "",
         "that is the limit for k -> infinity: a round drafts only k tokens, so the sum stops at alpha^k"),
    Slip("one power short", lambda a, k: tokens_per_pass(a, k - 1) if k else 1.0, "",
         "with k drafts the round emits up to k + 1 tokens: the sum runs from alpha^0 to alpha^k"),
]


# the slips' answers rounded as the learner's are, so that equal means equal to 9 digits
_PASS_SLIPS_ROUNDED = [Slip(sl.name, lambda a, k, f=sl.wrong: round(f(a, k), 9), sl.problem, sl.hint)
                       for sl in _PASS_SLIPS]


def _alpha_one(error):
    if isinstance(error, ZeroDivisionError):
        return ("at alpha = 1 every draft is accepted, and the round emits all k + 1 tokens; the closed form "
                "(1 - alpha^(k + 1)) / (1 - alpha) divides 0 by 0 there, so treat alpha = 1 on its own (or sum the "
                "powers)")
    return None


@checker
def check_tokens_per_pass(fn):
    """fn(alpha, k) -> the expected tokens one round of k drafts emits, each draft accepted with probability alpha,
    independently, until the first rejection; the target adds one token of its own to every round."""
    refuse_delegation(fn, tokens_per_pass, "the formula's reference")
    answers = []
    for alpha, k in _PASS_CASES:
        case = f"alpha = {alpha:g}, k = {k}"
        raw = run(fn, alpha, k, case=case, crash_hint=_alpha_one)
        if alpha == 1 and isinstance(raw, (float, np.floating)) and not math.isfinite(raw):
            reject(f"for {case} you said {raw}; a round emits {k + 1} tokens", _alpha_one(ZeroDivisionError()))
        got = as_number(raw, case)
        answers.append((case, (alpha, k), round(got, 9)))
    for case, (alpha, k), got in answers:
        want = tokens_per_pass(alpha, k)
        if not math.isclose(got, want, rel_tol=1e-8, abs_tol=1e-9):
            slip = slip_for_answers([(c, a, g) for c, a, g in answers], (alpha, k), got, _PASS_SLIPS_ROUNDED)
            reject(f"for {case} you said {got:.6g}; a round emits {want:.6g} tokens on average",
                   slip.hint if slip else "token j of the round (j = 0 is the target's own when it comes first) is "
                                          "emitted when the j drafts before it were all accepted: sum alpha^j for "
                                          "j = 0..k")
    return passed(f"on {len(_PASS_CASES)} pairs of alpha and k your count is 1 + alpha + ... + alpha^k, "
                  "(1 - alpha^(k + 1)) / (1 - alpha), and k + 1 when every draft is accepted")


# ------------------------------------------------------------------------------------------------ the tree walk

_WALK_CASES = [  # (what, parents, tokens, wants: the model's token after each node)
    ("the lesson's tree, the first branch right twice", [-1, 0, 0, 1, 2], [7, 3, 5, 9, 2], [3, 9, 2, 4, 6]),
    ("the lesson's tree, the second branch right once", [-1, 0, 0, 1, 2], [7, 3, 5, 9, 2], [5, 9, 8, 4, 6]),
    ("the lesson's tree, no branch right", [-1, 0, 0, 1, 2], [7, 3, 5, 9, 2], [1, 9, 2, 4, 6]),
    ("a chain of 5, right up to node 3", [-1, 0, 1, 2, 3], [4, 4, 4, 4, 4], [4, 4, 4, 1, 4]),
    ("a chain, every draft right", [-1, 0, 1, 2], [1, 2, 3, 4], [2, 3, 4, 5]),
    ("three guesses at depth 1, the last right, then a fork", [-1, 0, 0, 0, 3, 3], [0, 1, 2, 3, 4, 5],
     [3, 0, 0, 5, 0, 8]),
    ("a node alone (no drafts)", [-1], [6], [2]),
    ("two guesses at depth 1, the later one right", [-1, 0, 1, 0, 3], [8, 5, 2, 1, 3], [1, 3, 0, 3, 9]),
]


def _one_hot_rows(wants, V=10):
    rows = np.zeros((len(wants), V), np.float32)  # [T, V]
    rows[np.arange(len(wants)), wants] = 1.0
    return rows


def _first_child_only(wants, tokens, parents):
    path, emitted = [0], []
    while True:
        emitted.append(wants[path[-1]])
        child = next((i for i, p in enumerate(parents) if p == path[-1]), None)
        if child is None or tokens[child] != wants[path[-1]]:
            return path, emitted
        path.append(child)


def _own_row(wants, tokens, parents):
    path, emitted = [0], []
    while True:
        child = next((i for i, p in enumerate(parents) if p == path[-1] and tokens[i] == wants[i]), None)
        emitted.append(wants[path[-1]])
        if child is None:
            return path, emitted
        path.append(child)


def _no_last_token(wants, tokens, parents):
    path, emitted = walk(_one_hot_rows(wants), tokens, parents)
    return path, emitted[:-1]


_WALK_SLIPS = [
    Slip("first child only", _first_child_only, "",
         "a node may have several children, one guess each: look at every child of the last kept node, and keep the "
         "one whose token is what the model wants after that node"),
    Slip("the child's own row", _own_row, "",
         "row i of the logits says what the model writes AFTER node i: a child is right when its token is "
         "wants[parent], the row of the node before it, not wants[child]"),
    Slip("no token of the model's", _no_last_token, "",
         "a round always ends with the model's own token after the last kept node (wants[path[-1]]), as a chain's "
         "round ends with the token after its accepted drafts"),
]


@checker
def check_tree_walk(fn):
    """fn(wants, tokens, parents) -> (path, emitted): from node 0 (the pending token) follow the child whose token is
    the model's choice after its parent (wants[parent]) while there is one; path: the kept nodes, node 0 first;
    emitted: the kept children's tokens, then the model's own token after the last kept node."""
    refuse_delegation(fn, walk, "speculative.walk")
    for case, parents, tokens, wants in _WALK_CASES:
        got = run(fn, list(wants), list(tokens), list(parents), case=case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            reject(f"for {case} you returned {got!r:.60}; expected (path, emitted)",
                   "return two lists: the nodes kept (node 0 first), and the tokens that come out")
        try:
            mine = tuple([int(x) for x in part] for part in got)
        except (TypeError, ValueError):
            reject(f"for {case} you returned {got!r:.60}; path and emitted must be lists of whole numbers",
                   "node indices for path, token ids for emitted")
        want = walk(_one_hot_rows(wants), tokens, parents)
        if mine == want:
            continue
        slip = first_slip(mine, _WALK_SLIPS, (list(wants), list(tokens), list(parents)),
                          same=lambda g, w: g == tuple(w))
        reject(f"for {case} (parents {parents}, tokens {tokens}, the model wants {wants}) you returned path "
               f"{mine[0]}, emitted {mine[1]}; expected path {want[0]}, emitted {want[1]}",
               slip.hint if slip else "start at node 0; while a child of the last kept node has the token "
                                      "wants[last], keep it; emit the kept children's tokens, then wants[last]")
    return passed(f"on {len(_WALK_CASES)} trees your walk keeps the branch the model agrees with, and ends with its "
                  "own token after the last kept node")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_tree_mask.reference = tree_mask
check_accept.reference = accept
check_paged_truncate.reference = PagedKVCache
check_tokens_per_pass.reference = tokens_per_pass
check_tree_walk.reference = lambda wants, tokens, parents: walk(_one_hot_rows(wants, max(wants) + 1), tokens, parents)
