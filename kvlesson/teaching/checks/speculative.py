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
from kvlesson.speculative import accept
from kvlesson.teaching.checks.mask import slip_for_all
from kvlesson.teaching.verdict import Slip, as_array, attribute, checker, passed, reject, run

__all__ = ["check_tree_mask", "check_accept", "check_paged_truncate"]

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
    return passed(f"tree_mask agrees with kvlesson.tree_mask on {len(_TREE_CASES)} trees: chains, forks, several "
                  "roots, an empty cache, no nodes")


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


@checker
def check_accept(fn):
    """fn(p_target [k+1, V], q_draft [k, V], draft_tokens [k], rng) -> the emitted ids: the accepted drafts, then
    one token of the target's. The emitted tokens must follow the target's distribution exactly."""
    rng = np.random.default_rng(14)
    for case, p, q, drafts, want, hint in _certain_cases():
        out = _emitted(run(fn, p.copy(), q.copy(), list(drafts), rng, case=case), case, len(drafts), p.shape[1])
        if out != want:
            slip = next((s for s in ACCEPT_SLIPS if s.wrong(p, q, drafts, np.random.default_rng(0)) == out), None)
            reject(f"for {case} your function emitted {out}; it should emit {want}", slip.hint if slip else hint)
    case = "p_target equal to q_draft (every draft must be kept)"
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]] * 3)
    for _ in range(50):
        out = _emitted(run(fn, p.copy(), p[:2].copy(), [2, 4], rng, case=case), case, 2, 5)
        if out[:2] != [2, 4] or len(out) != 3:
            reject(f"for {case} your function emitted {out}; it should keep both drafts [2, 4], then sample one more",
                   "p(d) / q(d) = 1, and min(1, 1) = 1: a draft the target likes exactly as much as the drafter is "
                   "always kept")
    first, second = _trials(fn, rng)
    if chi_square_p(np.bincount(first, minlength=5), _P[0]) >= ALPHA and \
            chi_square_p(np.bincount(second, minlength=5), _P[1]) >= ALPHA:
        return passed(f"certain cases exact; over {TRIALS:,} seeded trials the first token follows p_target[0] and "
                      f"the second, after an accepted draft, p_target[1] (chi-square at {ALPHA:g})")
    freq = np.bincount(first, minlength=5) / len(first)
    for slip in ACCEPT_SLIPS:
        theirs = np.bincount(_trials(slip.wrong, np.random.default_rng(15))[0], minlength=5) / TRIALS
        if np.abs(theirs - freq).max() < 0.03:
            _reject_distribution(freq, slip.hint)
    _reject_distribution(freq, "keep draft d with probability min(1, p(d) / q(d)); at the first rejection sample "
                               "from max(0, p - q) normalised; after k acceptances sample from p_target[k]")


def _trials(fn, rng):
    """-> (first emitted token of each trial [TRIALS], second emitted token of the trials that kept draft 1)."""
    first, second = [], []
    for t in range(TRIALS):
        drafts = [int(rng.choice(5, p=_Q[0])), int(rng.choice(5, p=_Q[1]))]
        out = _emitted(run(fn, _P.copy(), _Q.copy(), drafts, rng, case=f"trial {t} (drafts {drafts})"),
                       f"trial {t} (drafts {drafts})", 2, 5)
        first.append(out[0])
        if out[0] == drafts[0] and len(out) > 1:
            second.append(out[1])
    return np.array(first, int), np.array(second, int)


def _reject_distribution(freq, hint):
    shown = ", ".join(f"{f:.2f}" for f in freq)
    reject(f"over {TRIALS:,} trials your first emitted token came out with frequencies [{shown}]; the target's "
           f"p_target[0] is [{', '.join(f'{x:.2f}' for x in _P[0])}]", hint)


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


@checker
def check_paged_truncate(cls):
    """cls: a PagedKVCache subclass with its own truncate(seq, n): keep the first n positions of sequence seq, give
    back every block past them that no other sequence uses, keep shared ones shared."""
    for name, script in _TRUNCATE_SCRIPTS:
        _truncate_script(cls, name, script)
    _truncate_past_the_end(cls)
    return passed("after every truncation each sequence keeps ceil(n / block_size) blocks and its keys; blocks no "
                  "one uses come back; a fork's blocks stay with it")


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


def _truncate_past_the_end(cls):
    case = "truncate(seq, n=7) of a sequence of 6 positions"
    yours = run(cls, 6, 4, 1, 1, case=case)
    seq = run(yours.new_sequence, case=case)
    run(lambda: yours.sequence(seq).append(np.ones((1, 6, 1)), np.ones((1, 6, 1))), case=case)
    free = attribute(yours, "blocks_free", case, "your pool")
    try:
        yours.truncate(seq, 7)
    except ValueError:
        pass
    except Exception as e:
        reject(f"for {case} your pool raised {type(e).__name__}, not ValueError",
               "a sequence cannot grow by truncating: raise ValueError naming n, and change nothing")
    else:
        reject(f"for {case} your pool accepted it", "raise ValueError when n is more than the sequence holds, "
                                                    "before changing anything")
    if attribute(yours, "blocks_free", case, "your pool") != free or run(yours.length, seq, case=case) != 6:
        reject(f"for {case} your pool raised, but changed state first", "check n before touching any state")


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


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_tree_mask.reference = tree_mask
check_accept.reference = accept
check_paged_truncate.reference = PagedKVCache
