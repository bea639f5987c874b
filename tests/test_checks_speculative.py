"""The lesson 14 checkers pass right answers, written several ways, and refuse each wrong one with its own hint.

Each row of a wrong-answer table is a plausible learner answer and the words its verdict must contain. Junk answers
(None, text, ragged lists, functions that raise) are fuzzed for every checker in test_checks_junk.py.
"""
import math

import numpy as np
import pytest

from kvlesson import causal_mask, sdpa, speculative, tree_mask
from kvlesson.serving.paged import PagedKVCache
from kvlesson.speculative import accept, walk
from kvlesson.teaching.checks import (
    check_accept,
    check_paged_truncate,
    check_tokens_per_pass,
    check_tree_mask,
    check_tree_walk,
)
from kvlesson.teaching.checks import speculative as spec_checks
from kvlesson.teaching.checks.speculative import _P as ACCEPT_P
from kvlesson.teaching.checks.speculative import ACCEPT_SLIPS
from tests.reference import tree_mask as by_loops

# ------------------------------------------------------------------------------------------------ tree mask


def tree_by_depths(parents, S):
    """Another right answer: node j is an ancestor of i when walking up from i reaches it (a set per node)."""
    T = len(parents)
    ancestors = []
    for i, p in enumerate(parents):
        ancestors.append({i} | (ancestors[p] if p >= 0 else set()))
    rows = [[True] * S + [j in ancestors[i] for j in range(T)] for i in range(T)]
    return np.array(rows, bool).reshape(T, S + T)


def test_tree_mask_checker_passes_right_answers():
    for right in (by_loops, tree_by_depths):
        assert check_tree_mask(right), right.__name__


def pointer_jumping(parents, S):
    """Ancestors by doubling, with floor(log2 T) rounds where ceil(log2 T) are needed: right up to 5 nodes deep."""
    T = len(parents)
    up = np.eye(T, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            up[i, p] = True
    for _ in range(int(np.log2(T)) if T > 1 else 0):
        up = up | (up.astype(int) @ up.astype(int) > 0)
    return np.concatenate([np.ones((T, S), bool), up], axis=1)


def wrong_past_depth_3(parents, S):
    """Walks at most three steps up: right on every tree of the old checker (depth 3 at most)."""
    m = np.concatenate([np.ones((len(parents), S), bool), np.eye(len(parents), dtype=bool)], axis=1)
    for i in range(len(parents)):
        j, steps = parents[i], 0
        while j >= 0 and steps < 3:
            m[i, S + j], j, steps = True, parents[j], steps + 1
    return m


# issue 29: each of these passed the checker (deeper trees catch them), or handed the exercise to kvlesson
@pytest.mark.parametrize("wrong, words", [
    (pointer_jumping, "a chain of 6 nodes"),
    (wrong_past_depth_3, "a chain of 6 nodes"),
    (tree_mask, "calls kvlesson's tree_mask"),
    (lambda p, S: tree_mask(p, S), "calls kvlesson's tree_mask"),
    (lambda p, S: np.array(sdpa.tree_mask(p, S)), "calls kvlesson's tree_mask"),
])
def test_tree_mask_checker_refuses_deep_mistakes_and_delegation(wrong, words):
    verdict = check_tree_mask(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def parent_only(parents, S):
    m = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i, p] = True
    return np.concatenate([np.ones((len(parents), S), bool), m], axis=1)


@pytest.mark.parametrize("wrong, words", [
    (lambda p, S: causal_mask(len(p), S + len(p)), "offset causal mask of a chunk"),
    (lambda p, S: np.tril(np.ones((len(p), S + len(p)), bool), k=S), "siblings and cousins included"),
    (parent_only, "sees its parent but not its parent's parent"),
    (lambda p, S: by_loops(p, S) & ~np.eye(len(p), S + len(p), S, dtype=bool), "must see its own key"),
    (lambda p, S: np.concatenate([np.ones((len(p), S), bool), by_loops(p, 0).T], axis=1), "descendants"),
    (lambda p, S: np.concatenate([np.zeros((len(p), S), bool), by_loops(p, 0)], axis=1), "all S cached keys"),
    (lambda p, S: by_loops(p, 0), "attend over the cache AND the tree"),
    (lambda p, S: by_loops(p, S).T, "the mask has shape (8, 5); expected (5, 8)"),
    (lambda p, S: by_loops(p, S).astype(float), "expected bool"),
    (lambda p, S: by_loops(p, S) | (np.arange(S + len(p)) == S + len(p) - 1), "node 0 (depth 0) sees"),
    (lambda p, S: None, "returned None"),
])
def test_tree_mask_checker_names_the_mistake(wrong, words):
    verdict = check_tree_mask(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_a_tree_mask_wrong_only_on_a_later_tree_is_caught_there():
    def right_for_one_root(parents, S):
        return by_loops([max(p, 0) if i else -1 for i, p in enumerate(parents)], S)  # every root joined to 0

    verdict = check_tree_mask(right_for_one_root)
    assert not verdict and "two roots" in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------------ accept


def rule(p, q, tokens, rng):
    """The accept rule, written here from its description (an answer that calls kvlesson's accept is delegation)."""
    for i, x in enumerate(tokens):
        if rng.random() < p[i, x] / q[i, x]:
            continue
        r = np.maximum(p[i] - q[i], 0)
        return list(tokens[:i]) + [int(rng.choice(len(r), p=r / r.sum() if r.sum() > 0 else p[i]))]
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


def accept_with_choice(p, q, tokens, rng):
    """Right, but drawing its randomness another way (rng.choice, and one uniform per draft up front)."""
    u = rng.random(len(tokens))
    for i, x in enumerate(tokens):
        if u[i] > p[i, x] / q[i, x]:
            r = np.maximum(p[i] - q[i], 0)
            return list(tokens[:i]) + [int(rng.choice(len(r), p=r / r.sum()))]
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


@pytest.mark.slow  # thousands of sampled rounds, a chi-square test each
def test_accept_checker_passes_right_answers():
    assert check_accept(rule)
    assert check_accept(accept_with_choice)
    assert check_accept(lambda p, q, t, rng: np.array(rule(p, q, t, rng)))  # an array of ids will do


@pytest.mark.parametrize("delegating", [accept, lambda p, q, t, rng: accept(p, q, t, rng),
                                        lambda p, q, t, rng: list(speculative.accept(p, q, t, rng))])
def test_an_accept_that_calls_kvlessons_is_told_so(delegating):
    verdict = check_accept(delegating)
    assert not verdict and "calls kvlesson's speculative.accept" in verdict.problem, repr(verdict)


def no_bonus(p, q, tokens, rng):
    out = rule(p, q, tokens, rng)
    return out[:-1] if len(out) == len(tokens) + 1 else out


def greedy_only(p, q, tokens, rng):
    """Keeps a draft when it is the target's argmax: right at temperature 0, biased at any other."""
    for i, x in enumerate(tokens):
        if x != int(np.argmax(p[i])):
            return list(tokens[:i]) + [int(np.argmax(p[i]))]
    return list(tokens) + [int(np.argmax(p[len(tokens)]))]


def residual_not_clipped(p, q, tokens, rng):
    """Samples the rejection from |p - q|: the right acceptance step, a wrong leftover."""
    for i, x in enumerate(tokens):
        if rng.random() >= p[i, x] / q[i, x]:
            r = np.abs(p[i] - q[i])
            return list(tokens[:i]) + [int(rng.choice(len(r), p=r / r.sum()))]
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


@pytest.mark.slow  # thousands of sampled rounds, a chi-square test each
@pytest.mark.parametrize("wrong, words", [
    (ACCEPT_SLIPS[0].wrong, "The ratio upside down"),
    (ACCEPT_SLIPS[1].wrong, "sample from max(0, p - q), normalised, not from p"),
    (ACCEPT_SLIPS[2].wrong, "one uniform draw per draft"),
    (no_bonus, "A round always emits one token more than it accepts"),
    (greedy_only, "a draft the target likes exactly as much as the drafter is always kept"),
    (residual_not_clipped, "your first emitted token came out with frequencies"),
    (lambda p, q, t, rng: list(t), "emitted [2, 0, 1]; it should emit [2, 4]"),
    (lambda p, q, t, rng: rule(p, q, t, rng) if t else [], "emitted 0 tokens; a round emits between 1 and k + 1 = 1"),
    (lambda p, q, t, rng: [int(np.argmax(p[0]))] * (len(t) + 2), "a round emits between 1 and k + 1"),
    (lambda p, q, t, rng: [9], "outside the vocabulary of 5"),
    (lambda p, q, t, rng: [[1, 2]], "expected a list of token ids"),
    (lambda p, q, t, rng: "2 4", "returned text"),
])
def test_accept_checker_names_the_mistake(wrong, words):
    verdict = check_accept(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def argmax_bonus(p, q, tokens, rng):
    out = rule(p, q, tokens, rng)
    return out[:-1] + [int(np.argmax(p[len(tokens)]))] if len(out) == len(tokens) + 1 else out


def residual_in_place(p, q, tokens, rng):
    """Right, but it writes the residual into p_target's row: the caller's array is changed."""
    for i, x in enumerate(tokens):
        if rng.random() >= p[i, x] / q[i, x]:
            p[i] = np.maximum(p[i] - q[i], 0)
            return list(tokens[:i]) + [int(rng.choice(len(p[i]), p=p[i] / p[i].sum()))]
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


def squared_after_the_first(p, q, tokens, rng):
    """Squares the ratio after the first draft: right at the first token and wherever p / q is 0 or 1 (greedy,
    p = q), wrong at the second token."""
    for i, x in enumerate(tokens):
        if rng.random() >= min(1.0, p[i, x] / q[i, x]) ** (2 if i else 1):
            r = np.maximum(p[i] - q[i], 0)
            return list(tokens[:i]) + [int(rng.choice(len(r), p=r / r.sum()))]
    return list(tokens) + [int(rng.choice(p.shape[1], p=p[len(tokens)]))]


@pytest.mark.slow  # thousands of sampled rounds, a chi-square test each
# issue 29: each of these passed the checker
@pytest.mark.parametrize("wrong, words", [
    (argmax_bonus, "last token is SAMPLED from p_target[k]"),
    (residual_in_place, "your function changed p_target in place"),
    (squared_after_the_first, "your second emitted token, in the trials that kept draft 1, came out with frequencies"),
])
def test_accept_checker_refuses_rules_wrong_after_the_first_token(wrong, words):
    verdict = check_accept(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


@pytest.mark.slow  # thousands of sampled rounds, a chi-square test each
def test_a_wrong_second_token_is_shown_with_its_own_frequencies():
    """The NOT YET shows the frequencies that are wrong (the second token's), not the first token's, which match."""
    verdict = check_accept(squared_after_the_first)
    shown = [float(x) for x in verdict.problem.split("frequencies [")[1].split("]")[0].split(", ")]
    assert "p_target[1]" in verdict.problem and np.abs(np.array(shown) - ACCEPT_P[1]).max() > 0.05


@pytest.mark.slow  # thousands of sampled rounds, a chi-square test each
def test_the_accept_checker_refuses_a_right_rule_only_as_often_as_it_says():
    """ALPHA is what the statistical case costs a right answer (three tests at 1e-4: a right rule fails with
    probability 3e-4). Right rules fed five other streams of random numbers all pass."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        assert check_accept(lambda p, q, t, _, rng=rng: rule(p, q, t, rng))


# ------------------------------------------------------------------------------------------------ paged truncate


def keep_blocks(self, seq, n, keep, free=True, refs=True, length=True):
    table = self._table(seq)
    if n > self._lens[seq]:
        raise ValueError(f"truncate(n={n}): too long")
    for block in table[keep:]:
        if refs:
            self.refs[block] -= 1
        if free and (self.refs[block] == 0 or not refs):
            self.refs[block] = 0
            self._free.append(block)
    del table[keep:]
    if length:
        self._lens[seq] = n


class Floor(PagedKVCache):
    def truncate(self, seq, n):
        keep_blocks(self, seq, n, n // self.block_size)


class OneExtra(PagedKVCache):
    def truncate(self, seq, n):
        keep_blocks(self, seq, n, n // self.block_size + 1)


class FreesShared(PagedKVCache):
    def truncate(self, seq, n):
        keep_blocks(self, seq, n, math.ceil(n / self.block_size), refs=False)


class NeverFrees(PagedKVCache):
    def truncate(self, seq, n):
        keep_blocks(self, seq, n, math.ceil(n / self.block_size), free=False)


class LengthOnly(PagedKVCache):
    def truncate(self, seq, n):
        if n > self._lens[seq]:
            raise ValueError("too long")
        self._lens[seq] = n


class TableOnly(PagedKVCache):
    def truncate(self, seq, n):
        keep_blocks(self, seq, n, math.ceil(n / self.block_size), length=False)


def right_truncate(self, seq, n, check=True):
    """A right answer written from the exercise's words: published blocks nobody uses stay cached."""
    table = self._table(seq)
    if check and not 0 <= n <= self._lens[seq]:
        raise ValueError(f"truncate(n={n}): sequence {seq} holds {self._lens[seq]} positions")
    keep = -(-n // self.block_size)
    for block in table[keep:]:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self._key_of:
                self._idle[block] = None
            else:
                self._free.append(block)
    del table[keep:]
    del self._keys[seq][n // self.block_size:]
    self._lens[seq] = n


class Mine(PagedKVCache):
    truncate = right_truncate


class NoCheck(PagedKVCache):
    def truncate(self, seq, n):
        right_truncate(self, seq, n, check=False)


class ChecksLate(PagedKVCache):
    def truncate(self, seq, n):
        self._free.append(self._free.pop())  # harmless
        if n > self._lens[seq]:
            self._free.pop()
            raise ValueError("too long")
        right_truncate(self, seq, n)


def test_paged_truncate_checker_passes_a_pool_written_from_the_exercise():
    assert check_paged_truncate(Mine)


class PublishedToFree(PagedKVCache):
    """The lesson's own answer before issue 29: every block nobody uses goes on the free list, published or not."""

    def truncate(self, seq, n):
        if n > self._lens[seq]:
            raise ValueError(f"truncate(n={n}): too long")
        keep_blocks(self, seq, n, -(-n // self.block_size))


class NegativeAccepted(PagedKVCache):
    def truncate(self, seq, n):
        if n > self._lens[seq]:
            raise ValueError(f"truncate(n={n}): too long")
        right_truncate(self, seq, max(n, 0))
        self._lens[seq] = n


class Delegates(PagedKVCache):
    def truncate(self, seq, n):
        super().truncate(seq, n)


class DelegatesByName(PagedKVCache):
    def truncate(self, seq, n):
        PagedKVCache.truncate(self, seq, n)


# issue 29: each of these passed the checker (the first was the lesson's own answer)
@pytest.mark.parametrize("wrong, words", [
    (PublishedToFree, "holding other keys than it published"),
    (NegativeAccepted, "truncate(seq, n=-1) of a sequence of 6 positions your pool accepted it"),
    (Delegates, "calls kvlesson's PagedKVCache.truncate"),
    (DelegatesByName, "calls kvlesson's PagedKVCache.truncate"),
    (PagedKVCache, "does not define truncate"),
])
def test_paged_truncate_checker_refuses_what_breaks_the_prefix_cache(wrong, words):
    verdict = check_paged_truncate(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


@pytest.mark.parametrize("wrong, words", [
    (Floor, "n // block_size would drop its positions"),
    (OneExtra, "keeps 3 blocks; 8 positions need ceil(8 / 4) = 2"),
    (FreesShared, "block 2 has refs 0, but 1 block tables point at it"),
    (NeverFrees, "goes back to the free list"),
    (LengthOnly, "keeps 3 blocks; 5 positions need"),
    (TableOnly, "set the sequence's length to n"),
    (NoCheck, "your pool accepted it"),
    (ChecksLate, "raised, but changed state first"),
    (type("NotAPool", (), {"__init__": lambda self, *args: None}), "not a PagedKVCache"),
])
def test_paged_truncate_checker_names_the_mistake(wrong, words):
    verdict = check_paged_truncate(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------------ tokens per pass


def expected_tokens(alpha, k):
    """Written from the derivation: the sum of alpha^j for j = 0..k."""
    return sum(alpha**j for j in range(k + 1))


def test_tokens_per_pass_checker_passes_right_answers():
    assert check_tokens_per_pass(expected_tokens)
    assert check_tokens_per_pass(lambda a, k: k + 1 if a == 1 else (1 - a ** (k + 1)) / (1 - a))
    assert check_tokens_per_pass(lambda a, k: np.float64(expected_tokens(a, k)))


@pytest.mark.parametrize("wrong, words", [
    (lambda a, k: 1 + k * a, "draft j is emitted with probability alpha^j"),
    (lambda a, k: expected_tokens(a, k) - 1, "the sum starts at 1"),
    (lambda a, k: expected_tokens(a, k) - 1 + a**k, "comes out in every round"),
    (lambda a, k: 1 / (1 - a) if a < 1 else k + 1, "limit for k -> infinity"),
    (lambda a, k: 1 / (1 - a) if a < 1 else math.inf, "treat alpha = 1 on its own"),
    (lambda a, k: np.float64(1 - a ** (k + 1)) / np.float64(1 - a), "treat alpha = 1 on its own"),
    (lambda a, k: expected_tokens(a, k - 1) if k else 1.0, "from alpha^0 to alpha^k"),
    (lambda a, k: (1 - a ** (k + 1)) / (1 - a), "treat alpha = 1 on its own"),  # 0 / 0 at alpha = 1
    (lambda a, k: (k + 1) * a, "you said"),
    (lambda a, k: "1.5", "text that spells a number"),
    (lambda a, k: [1.0], "expected a number"),
    (spec_checks.tokens_per_pass, "calls kvlesson's"),
])
def test_tokens_per_pass_checker_names_the_mistake(wrong, words):
    verdict = check_tokens_per_pass(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------------ the tree walk


def my_walk(wants, tokens, parents):
    """Written from the exercise's words."""
    path = [0]
    while True:
        kids = [i for i, p in enumerate(parents) if p == path[-1] and tokens[i] == wants[path[-1]]]
        if not kids:
            return path, [tokens[i] for i in path[1:]] + [wants[path[-1]]]
        path.append(kids[0])


def test_tree_walk_checker_passes_right_answers():
    assert check_tree_walk(my_walk)
    assert check_tree_walk(lambda w, t, p: tuple(np.array(x) for x in my_walk(w, t, p)))


@pytest.mark.parametrize("wrong, words", [
    (spec_checks._first_child_only, "look at every child of the last kept node"),
    (spec_checks._own_row, "not wants[child]"),
    (lambda w, t, p: (my_walk(w, t, p)[0], my_walk(w, t, p)[1][:-1]), "ends with the model's own token"),
    (lambda w, t, p: (my_walk(w, t, p)[0][1:], my_walk(w, t, p)[1]), "you returned path"),
    (lambda w, t, p: my_walk(w, t, p)[0], "expected (path, emitted)"),
    (lambda w, t, p: (["a"], [1]), "lists of whole numbers"),
    (lambda w, t, p: walk(np.eye(10)[w], t, p), "calls kvlesson's speculative.walk"),
    (lambda w, t, p: None, "expected (path, emitted)"),
])
def test_tree_walk_checker_names_the_mistake(wrong, words):
    verdict = check_tree_walk(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)
