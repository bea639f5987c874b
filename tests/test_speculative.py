"""Speculative decoding (kvlesson.speculative) against plain decoding, the accept rule against the target's own
distribution, a tree of drafts against each of its branches alone; and the bugs lesson 14 shows, each caught.

  - greedy speculative generation equals model.generate token for token, for every drafter (an adversarial one that
    proposes random tokens included) and k = 0 .. 8, on the tiny model in float64 and on SmolLM2 in float32;
  - accept: over seeded trials the first emitted token follows p_target[0], and after an accepted draft the second
    follows p_target[1] (Pearson's chi-square at ALPHA); the same test refuses three wrong rules by far;
  - sampling end to end: the tokens of speculative.generate at temperature 0.7 follow the model's own distribution;
  - a tree verified in one pass gives, at every node, the logits of its branch verified alone, and keeping one branch
    leaves the caches as a pass over that branch alone would;
  - mutants: verification without rollback, tree nodes rotated by their index instead of their depth, siblings that
    see each other (the offset mask in place of the tree mask).
"""
import dataclasses
import functools
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlesson import KVCache, SinkKVCache, StaticKVCache, WindowKVCache, speculative
from kvlesson import model as kvmodel
from kvlesson.llama import Model
from kvlesson.speculative import EarlyExit, TreeCache, accept, ngram, verify_tree, walk
from kvlesson.teaching.checks.speculative import ACCEPT_SLIPS, chi_square_p
from kvlesson.text import long_text

TINY = kvmodel.tiny_config(n_layers=3, max_len=160)
TINY64 = Model(TINY, kvmodel.random_weights(TINY, seed=3, dtype=np.float64), None)
ALPHA = 1e-3  # significance of every chi-square test here; each is seeded, so its verdict is fixed
PROMPT = [5, 17, 99, 5, 17, 42, 7, 5, 17, 99, 3, 8]  # repeats itself, so prompt lookup has matches to propose


def reference(model, ids, n):
    return kvmodel.generate(model.config, model.weights, ids, n, dtype=model.dtype)


def random_drafts(seed):
    """The adversary: k random tokens every round, almost all of them rejected."""
    rng = np.random.default_rng(seed)
    return lambda context, k: rng.integers(0, TINY.vocab, k).tolist()


def oracle(prompt, truth, wrong_from=None):
    """Proposes the true continuation (every draft accepted), or from draft `wrong_from` on, tokens that are not."""
    def draft(context, k):
        done = len(context) - len(prompt)
        guess = truth[done : done + k]
        return [t if wrong_from is None or i < wrong_from else (t + 1) % TINY.vocab for i, t in enumerate(guess)]
    return draft


DRAFTERS = {
    "ngram": lambda truth: "ngram",
    "early_exit": lambda truth: "early_exit",
    "EarlyExit(1)": lambda truth: EarlyExit(1),
    "random": lambda truth: random_drafts(0),
    "oracle": lambda truth: oracle(PROMPT, truth),
    "oracle, wrong from draft 2": lambda truth: oracle(PROMPT, truth, wrong_from=1),
}


@pytest.mark.parametrize("k", range(9))
@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_speculative_equals_generate(name, k):
    n = 30
    truth = reference(TINY64, PROMPT, n)
    tokens, stats = speculative.generate(TINY64, PROMPT, n, draft=DRAFTERS[name](truth), k=k)
    assert tokens == truth
    assert stats["accepted"] + stats["target_passes"] == n - 1  # each pass emits its accepted drafts and one more
    assert stats["accepted"] <= stats["drafted"] <= k * stats["target_passes"]


def test_the_drafters_are_exercised():
    """Each path of the loop runs: full acceptance with the bonus token, partial acceptance, none."""
    n, k = 21, 4
    truth = reference(TINY64, PROMPT, n)
    _, stats = speculative.generate(TINY64, PROMPT, n, draft=oracle(PROMPT, truth), k=k)
    assert stats == dict(drafted=16, accepted=16, target_passes=4, draft_passes=0)  # 4 rounds of 4 + 1
    _, stats = speculative.generate(TINY64, PROMPT, 19, draft=oracle(PROMPT, truth, wrong_from=2), k=k)
    assert stats == dict(drafted=22, accepted=12, target_passes=6, draft_passes=0)  # 2 right, then a correction
    _, stats = speculative.generate(TINY64, PROMPT, n, draft="ngram", k=k)
    assert stats["drafted"] > 0
    _, stats = speculative.generate(TINY64, PROMPT, n, draft="early_exit", k=k)
    assert 0 < stats["accepted"] < stats["drafted"] == stats["draft_passes"]


@settings(max_examples=40)
@given(st.lists(st.integers(0, TINY.vocab - 1), min_size=1, max_size=20), st.integers(0, 25), st.integers(0, 8),
       st.integers(0, 2**32 - 1), st.sampled_from(["random", "ngram", "EarlyExit(1)"]))
def test_greedy_speculative_equals_generate_on_random_prompts(prompt, n, k, seed, name):
    truth = reference(TINY64, prompt, n)
    draft = random_drafts(seed) if name == "random" else DRAFTERS[name](truth)
    assert speculative.generate(TINY64, prompt, n, draft=draft, k=k)[0] == truth


PROMPTS = {  # SmolLM2 in float32: greedy tokens must be the same as model.generate's
    "story": lambda m: m.tokenizer.encode(long_text())[:64],
    "chat": lambda m: m.tokenizer.encode(m.chat_prompt("Name three rivers in Europe.")),
}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_generate_on_smollm2(model, prompt):
    ids, n = PROMPTS[prompt](model), 16
    truth = model.generate(ids, n)
    rng = np.random.default_rng(1)
    for draft, k in [("ngram", 1), ("ngram", 4), ("ngram", 8), ("early_exit", 2),
                     (lambda context, k: rng.integers(0, model.config.vocab, k).tolist(), 3)]:
        assert speculative.generate(model, ids, n, draft=draft, k=k)[0] == truth, (draft, k)


# ---- the rule


def random_rule_inputs(seed, V=5, k=3):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(V), k + 1), rng.dirichlet(np.ones(V), k)  # p [k + 1, V], q [k, V]


def first_two(rule, p, q, trials, seed):
    """-> (first emitted token of each trial, second emitted token of the trials that kept draft 1)."""
    rng = np.random.default_rng(seed)
    u = rng.random((trials, len(q), 1))
    all_drafts = (u > np.cumsum(q, axis=-1)).sum(axis=-1)  # [trials, k]: drafts sampled from q, as a drafter would
    first, second = [], []
    for drafts in all_drafts.tolist():
        out = rule(p, q, drafts, rng)
        first.append(out[0])
        if out[0] == drafts[0] and len(out) > 1:
            second.append(out[1])
    V = p.shape[1]
    return np.bincount(first, minlength=V), np.bincount(second, minlength=V)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accept_preserves_the_target_distribution(seed):
    p, q = random_rule_inputs(seed)
    first, second = first_two(accept, p, q, 20_000, seed)
    assert chi_square_p(first, p[0]) > ALPHA
    assert second.sum() > 2_000 and chi_square_p(second, p[1]) > ALPHA


@pytest.mark.parametrize("slip", ACCEPT_SLIPS, ids=lambda s: s.name)
def test_the_distribution_test_refuses_a_wrong_rule(slip):
    """The test above has power: each wrong rule (the ratio q/p, a rejection resampled from p, every draft kept)
    moves the first token's distribution so far that its p-value is below 1e-12 on every seed."""
    for seed in [0, 1, 2]:
        p, q = random_rule_inputs(seed)
        assert chi_square_p(first_two(slip.wrong, p, q, 20_000, seed)[0], p[0]) < 1e-12


def test_chi_square_p_is_the_chi_square_tail():
    assert chi_square_p([10, 10, 10], [1 / 3] * 3) == 1.0
    assert chi_square_p([60, 30, 30], [1 / 3] * 3) == pytest.approx(np.exp(-15 / 2))  # x = 15, 2 dof: e^(-x/2)
    # 9.4877 is the 5% critical value of chi-square with 4 degrees of freedom (any table of the distribution)
    x = 9.4877
    counts = np.array([100, 100, 100, 100, 100]) + np.sqrt(x * 100 / 2) * np.array([1, -1, 0, 0, 0])
    assert chi_square_p(counts, [0.2] * 5) == pytest.approx(0.05, abs=1e-5)


def test_greedy_is_the_rule_with_one_hot_distributions():
    eye = np.eye(6)
    rng = np.random.default_rng(0)
    assert accept(eye[[1, 2, 3, 4]], eye[[1, 2, 5]], [1, 2, 5], rng) == [1, 2, 3]
    assert accept(eye[[1, 2, 3, 4]], eye[[1, 2, 3]], [1, 2, 3], rng) == [1, 2, 3, 4]
    assert accept(eye[[0]], np.zeros((0, 6)), [], rng) == [0]


def test_a_draft_the_target_likes_at_least_as_much_is_always_kept():
    p, q = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]), np.array([[0.2, 0.3, 0.5]])
    rng = np.random.default_rng(0)
    assert all(accept(p, q, [0], rng)[0] == 0 for _ in range(200))  # p(0) / q(0) > 1
    assert all(accept(p, q, [1], rng)[0] == 1 for _ in range(200))  # p = q at token 1


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_sampled_speculative_tokens_follow_the_model(temperature):
    """The second and third tokens of speculative.generate, over many seeded runs, against their exact marginals:
    sum over the earlier tokens of products of the model's softmax(logits / temperature)."""
    cfg = kvmodel.tiny_config(n_layers=2, D=16, H=2, Hkv=1, d=8, hidden=32, vocab=5, max_len=16)
    model = Model(cfg, kvmodel.random_weights(cfg, seed=2, dtype=np.float64), None)
    prompt = [1, 3]

    def dist(ids):
        z = kvmodel.forward(cfg, model.weights, ids, kvmodel.new_cache(cfg, np.float64))[-1] / temperature
        e = np.exp(z - z.max())
        return e / e.sum()

    p1 = dist(prompt)
    p2 = sum(p1[a] * dist(prompt + [a]) for a in range(5))
    p3 = sum(p1[a] * dist(prompt + [a])[b] * dist(prompt + [a, b]) for a in range(5) for b in range(5))
    rng = np.random.default_rng(int(temperature * 10))
    for draft in (EarlyExit(1), lambda context, k: rng.integers(0, 5, k).tolist()):
        runs = [speculative.generate(model, prompt, 3, draft=draft, k=2, temperature=temperature, rng=rng)[0]
                for _ in range(3_000)]
        second, third = (np.bincount([r[i] for r in runs], minlength=5) for i in (1, 2))
        assert chi_square_p(second, p2) > ALPHA and chi_square_p(third, p3) > ALPHA


# ---- the drafters


def test_ngram_proposes_what_followed_the_latest_match_of_the_longest_tail():
    assert ngram([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]  # the latest of two matches of [1, 2, 3]
    assert ngram([4, 2, 3, 5, 6, 1, 2, 3], 3) == [5, 6, 1]  # [1, 2, 3] never occurred before: [2, 3] did
    assert ngram([5, 6, 7, 8, 9], 3) == []  # 9 never occurred before
    assert ngram([7, 7, 7], 4) == [7]  # the continuation may run into the tail itself
    assert ngram([1, 2, 1, 2, 1, 2], 8, n=2) == [1, 2]  # latest earlier match at 2: what follows it is [1, 2]
    assert ngram([3], 4) == [] and ngram([], 4) == []


def test_early_exit_shares_the_caches_and_leaves_them_as_they_were():
    caches = kvmodel.new_cache(TINY, np.float64)
    kvmodel.forward(TINY, TINY64.weights, PROMPT, caches)
    before = [(c.k[:, :len(c)].copy(), c.v[:, :len(c)].copy()) for c in caches]
    drafts, q = EarlyExit(2).propose(TINY, TINY64.weights, caches, 7, 5, 0.0, np.random.default_rng(0))
    assert len(drafts) == 5 and q.shape == (5, TINY.vocab)
    assert [len(c) for c in caches] == [len(PROMPT)] * TINY.n_layers
    for c, (k, v) in zip(caches, before, strict=True):
        np.testing.assert_array_equal(c.k[:, :len(c)], k)
        np.testing.assert_array_equal(c.v[:, :len(c)], v)
    sub = dataclasses.replace(TINY, n_layers=2)  # the drafter is the model's first 2 layers and its own head
    logits = kvmodel.forward(sub, TINY64.weights, PROMPT + [7], kvmodel.new_cache(sub, np.float64))
    assert drafts[0] == int(logits[-1].argmax())


# ---- a tree of drafts

#  the lesson's tree: node 0 is the pending token; nodes 1 and 2 are two guesses after it, 3 follows 1, 4 follows 2
TREE = [-1, 0, 0, 1, 2]


@st.composite
def trees(draw):
    T = draw(st.integers(1, 7))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, T)]  # one root: the pending token
    return parents, draw(st.lists(st.integers(0, TINY.vocab - 1), min_size=T, max_size=T)), \
        draw(st.lists(st.integers(0, TINY.vocab - 1), min_size=1, max_size=9))


def branch(parents, i):
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def prefilled(prompt, model=TINY64, static=False):
    caches = kvmodel.new_cache(model.config, model.dtype, static=static)
    kvmodel.forward(model.config, model.weights, prompt, caches)
    return caches


def tree_against_branches(parents, tokens, prompt):
    """-> the largest |logit difference| between the tree's one pass and each node's branch verified alone."""
    logits, _ = verify_tree(TINY64, prefilled(prompt), tokens, parents)
    worst = 0.0
    for i in range(len(parents)):
        path = branch(parents, i)
        alone = kvmodel.forward(TINY, TINY64.weights, [tokens[j] for j in path], prefilled(prompt))[-1]
        worst = max(worst, float(np.abs(logits[i] - alone).max()))
    return worst


@given(trees())
def test_a_tree_in_one_pass_gives_each_branch_its_own_logits(case):
    assert tree_against_branches(*case) < 1e-12


@given(trees(), st.data())
def test_keeping_a_branch_leaves_the_caches_of_that_branch_alone(case, data):
    parents, tokens, prompt = case
    caches = prefilled(prompt)
    logits, views = verify_tree(TINY64, caches, tokens, parents)
    path = branch(parents, data.draw(st.integers(0, len(parents) - 1)))
    for view in views:
        view.keep(path)
    alone = prefilled(prompt)
    kvmodel.forward(TINY, TINY64.weights, [tokens[j] for j in path], alone)
    for mine, theirs in zip(caches, alone, strict=True):
        np.testing.assert_allclose(mine.k, theirs.k, rtol=0, atol=1e-12)
        np.testing.assert_allclose(mine.v, theirs.v, rtol=0, atol=1e-12)
    nxt = [int(logits[path[-1]].argmax())]  # decoding goes on from the kept branch as from the branch alone
    np.testing.assert_allclose(kvmodel.forward(TINY, TINY64.weights, nxt, caches),
                               kvmodel.forward(TINY, TINY64.weights, nxt, alone), rtol=0, atol=1e-12)


def test_walk_follows_the_branch_the_model_agrees_with():
    prompt = PROMPT
    truth = reference(TINY64, prompt, 3)
    wrong = (truth[0] + 1) % TINY.vocab
    tokens = [prompt[-1], wrong, truth[0], 0, truth[1]]  # node 1 a wrong guess; node 2 right, then node 4 right
    logits, views = verify_tree(TINY64, prefilled(prompt[:-1], static=True), tokens, TREE)
    path, emitted = walk(logits, tokens, TREE)
    assert path == [0, 2, 4] and emitted == truth
    for view in views:
        view.keep(path)
    assert len(views[0].inner) == len(prompt) + 2


def test_a_tree_in_float32_stays_float32():
    model = Model(TINY, kvmodel.random_weights(TINY, seed=3), None)
    logits, views = verify_tree(model, prefilled(PROMPT, model, static=True), [1, 2, 3, 4, 5], TREE)
    assert logits.dtype == np.float32 and views[0].inner.k.dtype == np.float32
    tokens, _ = speculative.generate(model, PROMPT, 8, draft="early_exit", k=3)
    assert tokens == reference(model, PROMPT, 8)


def test_tree_caches_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="window or a mask of its own"):
        TreeCache(WindowKVCache(2, 16, 4), TREE)
    with pytest.raises(ValueError, match="window or a mask of its own"):
        TreeCache(SinkKVCache(2, 16, 2, 4), TREE)
    view = TreeCache(KVCache(2, 16), TREE)
    with pytest.raises(ValueError, match="made for 5 nodes; got T=3"):
        view.positions(3)
    with pytest.raises(ValueError, match="nothing was appended yet"):
        view.keep([0])
    logits, views = verify_tree(TINY64, prefilled(PROMPT), [1, 2, 3, 4, 5], TREE)
    with pytest.raises(ValueError, match=r"path=\[0, 3\] is not a branch"):
        views[0].keep([0, 3])
    with pytest.raises(ValueError, match="takes its tree once"):
        views[0].append(np.zeros((2, 5, 16)), np.zeros((2, 5, 16)))
    with pytest.raises(ValueError, match="tokens has 2 nodes and parents 5"):
        verify_tree(TINY64, prefilled(PROMPT), [1, 2], TREE)
    uneven = prefilled(PROMPT)
    uneven[1].truncate(3)
    with pytest.raises(ValueError, match=r"disagree on how many tokens they hold: \[3, 12\]"):
        verify_tree(TINY64, uneven, [1, 2, 3, 4, 5], TREE)
    assert [len(c) for c in uneven] == [12, 3, 12]  # refused before anything moved
    with pytest.raises(TypeError, match="a list of 3 caches"):
        verify_tree(TINY64, prefilled(PROMPT)[:2], [1, 2, 3, 4, 5], TREE)


# ---- the mutants the lesson shows


def test_verifying_without_rolling_back_is_caught():
    """The rejected drafts' keys stay in the cache: the next round's queries attend over them, at positions shifted
    by every rejection. With a static cache the rounds also run out of room."""
    n, draft = 30, random_drafts(0)
    truth = reference(TINY64, PROMPT, n)
    growing = functools.partial(kvmodel.new_cache, static=False)
    with mock.patch.object(speculative, "rollback", lambda caches, n: None), \
            mock.patch.object(kvmodel, "new_cache", lambda cfg, dtype, static=True: growing(cfg, dtype)):
        assert speculative.generate(TINY64, PROMPT, n, draft=draft, k=4)[0] != truth
    with mock.patch.object(speculative, "rollback", lambda caches, n: None), pytest.raises(ValueError, match="full"):
        speculative.generate(TINY64, PROMPT, n, draft=draft, k=4)


def test_tree_nodes_rotated_by_their_index_are_caught():
    def by_index(self, T):
        return len(self.inner) + np.arange(T)

    with mock.patch.object(TreeCache, "positions", by_index):
        assert tree_against_branches(TREE, [1, 2, 3, 4, 5], PROMPT) > 1e-3


def test_siblings_that_see_each_other_are_caught():
    with mock.patch.object(TreeCache, "mask", lambda self, T: None):  # the offset mask of a plain chunk
        assert tree_against_branches(TREE, [1, 2, 3, 4, 5], PROMPT) > 1e-3


def test_the_tree_mask_of_a_chain_is_the_offset_mask_so_a_chain_needs_no_tree():
    chain = [-1, 0, 1, 2]
    logits, _ = verify_tree(TINY64, prefilled(PROMPT), [1, 2, 3, 4], chain)
    np.testing.assert_allclose(logits, kvmodel.forward(TINY, TINY64.weights, [1, 2, 3, 4], prefilled(PROMPT)),
                               rtol=0, atol=1e-12)


# ---- bad input


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(ids=[]), ValueError, "ids is empty"),
    (dict(ids=[1, 999]), ValueError, "ids must lie in"),
    (dict(ids="hello"), TypeError, "not text"),
    (dict(max_new_tokens=200), ValueError, "exceed the context of 160"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be at least 0"),
    (dict(k=-1), ValueError, "k must be at least 0"),
    (dict(k=2.5), TypeError, "k must be an integer"),
    (dict(temperature=-0.5), ValueError, "temperature must be finite and at least 0"),
    (dict(temperature="hot"), TypeError, "temperature must be a real number"),
    (dict(temperature=True), TypeError, "temperature must be a real number"),
    (dict(rng=42), TypeError, "rng must be a numpy Generator"),
    (dict(draft="medusa"), ValueError, "draft must be 'ngram', 'early_exit'"),
    (dict(draft=3), TypeError, "draft must be 'ngram'"),
    (dict(draft=lambda c, k: [1] * (k + 1)), ValueError, "returned 5 tokens; at most k"),
    (dict(draft=lambda c, k: [1, -2]), ValueError, "draft(context_ids, k) must lie in"),
    (dict(draft=lambda c, k: "ab"), TypeError, "must return a list of token ids"),
    (dict(draft=EarlyExit(3)), ValueError, "needs 1 <= layers < the model's 3"),
    (dict(draft=EarlyExit(1.5)), TypeError, "draft.layers must be an integer"),
])
def test_bad_generate_arguments_are_named(kwargs, error, words):
    args = dict(ids=PROMPT, max_new_tokens=10, k=4) | kwargs
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        speculative.generate(TINY64, **args)


def test_a_model_that_is_not_one_is_named():
    with pytest.raises(TypeError, match="model must be a kvlesson.llama.Model"):
        speculative.generate("gpt", PROMPT, 4)


P2, Q1 = np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[1.0, 0.0]])


@pytest.mark.parametrize("args, error, words", [
    ((P2[0], Q1, [0]), ValueError, r"p_target must be \[k \+ 1, V\]"),
    ((P2, Q1[:, :1], [0]), ValueError, r"q_draft must be \[k, V\] = \(1, 2\)"),
    ((P2, Q1, [0, 1]), ValueError, "draft_tokens must hold k=1 ids"),
    ((P2, Q1, [2]), ValueError, r"draft_tokens must lie in \[0, 2\)"),
    ((P2 * 2, Q1, [0]), ValueError, "p_target: every row must sum to 1"),
    ((P2, -Q1, [0]), ValueError, "q_draft must hold probabilities"),
    ((P2, Q1, [1]), ValueError, r"q_draft\[0, 1\] is 0: the drafter could not have proposed"),
    ((P2, Q1, [0], 7), TypeError, "rng must be a numpy Generator"),
    ((P2.astype(int), Q1, [0]), TypeError, "p_target must hold floating-point numbers"),
])
def test_bad_accept_arguments_are_named(args, error, words):
    args = args if len(args) == 4 else (*args, np.random.default_rng(0))
    with pytest.raises(error, match=words):
        accept(*args)


def test_static_caches_roll_back_in_place():
    cache = StaticKVCache(1, 2, 8)
    view = TreeCache(cache, [-1, 0, 0])
    view.append(np.ones((1, 3, 2)), np.arange(6.0).reshape(1, 3, 2))
    view.keep([0, 2])
    assert len(cache) == 2 and cache.v[0, :2].tolist() == [[0.0, 1.0], [4.0, 5.0]]


# ---- lesson 14's helpers, fed junk


def _tree_views():
    """Every layer's TreeCache after one pass of TREE over the prompt, and the caches' lengths before it."""
    caches = prefilled(PROMPT)
    _, views = verify_tree(TINY64, caches, [1, 2, 3, 4, 5], TREE)
    return views


LOGITS5 = np.random.default_rng(0).standard_normal((5, TINY.vocab))  # [T, V] for TREE's five nodes
ONES = np.zeros((5, TINY.vocab))  # [5, V]: after every node the model wants token 1
ONES[:, 1] = 1.0

HELPER_CASES = [  # (what, call, error, words): before, each hung, raised a raw error, or returned quietly
    ("walk: a node its own parent", lambda: walk(ONES[:1], [1], [0]), ValueError,
     r"parents\[0\]=0: a node's parent must come before it"),
    ("walk: a parent cycle", lambda: walk(ONES[:2], [1, 1], [1, 0]), ValueError,
     r"parents\[0\]=1: a node's parent must come before"),
    ("walk: a cycle below the root", lambda: walk(ONES[:3], [1, 1, 1], [-1, 2, 1]), ValueError,
     r"parents\[1\]=2: a node's parent must come"),
    ("walk: too few logit rows", lambda: walk(LOGITS5[:2], [1, 2, 3, 4, 5], TREE), ValueError,
     r"logits must be \[T, V\] with one row per node, T=5 \(len\(parents\)\); got \(2, 256\)"),
    ("walk: too few tokens", lambda: walk(LOGITS5, [1, 2], TREE), ValueError, "tokens has 2 nodes and parents 5"),
    ("walk: a token outside the vocabulary", lambda: walk(LOGITS5, [1, 2, 3, 4, 999], TREE), ValueError,
     r"tokens must lie in \[0, 256\)"),
    ("walk: an empty tree", lambda: walk(LOGITS5[:0], [], []), ValueError, "parents is empty"),
    ("walk: NaN logits", lambda: walk(np.where(np.eye(5, TINY.vocab), np.nan, LOGITS5), [1, 2, 3, 4, 5], TREE),
     ValueError, r"logits hold NaN \(row 0\)"),
    ("walk: parents a string", lambda: walk(LOGITS5, [1, 2, 3, 4, 5], "01"), TypeError,
     "parents must be a list of T integers"),
    ("walk: integer logits", lambda: walk(LOGITS5.astype(int), [1, 2, 3, 4, 5], TREE), TypeError,
     "logits must hold floating-point"),
    ("keep('0')", lambda: _tree_views()[0].keep("0"), TypeError, "path must be a list of node indices"),
    ("keep(None)", lambda: _tree_views()[0].keep(None), TypeError, "path must be a list of node indices"),
    ("keep([0.0])", lambda: _tree_views()[0].keep([0.0]), TypeError, r"path\[0\] must be an integer"),
    ("keep([0, -1])", lambda: _tree_views()[0].keep([0, -1]), ValueError, r"path.*-1"),  # named on main too
    ("TreeCache(parents=None)", lambda: TreeCache(KVCache(2, 16), None), TypeError,
     "parents must be a list of T integers"),
    ("TreeCache(parents=[0])", lambda: TreeCache(KVCache(2, 16), [0]), ValueError, r"parents\[0\]=0"),
    ("ngram(k=2.5)", lambda: ngram(PROMPT, 2.5), TypeError, "k must be an integer; got k=2.5"),
    ("ngram(k=-1)", lambda: ngram(PROMPT, -1), ValueError, "k must be at least 0; got k=-1"),
    ("ngram(n=0)", lambda: ngram(PROMPT, 2, n=0), ValueError, "n must be at least 1; got n=0"),
    ("ngram(n=1.5)", lambda: ngram(PROMPT, 2, n=1.5), TypeError, "n must be an integer"),
    ("ngram(context='hello')", lambda: ngram("hello", 2), TypeError, "context must be a sequence of token ids, not"),
    ("ngram(context=[1, 2.5, 1])", lambda: ngram([1, 2.5, 1], 2), TypeError, "context must hold integer token ids"),
    ("ngram(context=[1, -2, 1])", lambda: ngram([1, -2, 1], 2), ValueError, r"context must be at least 0; got \[-2\]"),
    ("a draft of 2-D ids", lambda: speculative.generate(TINY64, PROMPT, 6, draft=lambda c, k: np.ones((k, 2), int)),
     TypeError, r"draft\(context_ids, k\) must be a 1-D array of integer token ids; got int64 \(4, 2\)"),
    ("a draft of a list of arrays",
     lambda: speculative.generate(TINY64, PROMPT, 6, draft=lambda c, k: [np.array([1, 2])]), TypeError,
     r"draft\(context_ids, k\) must hold integer token ids; got an array of shape \(2,\) \(one id per token"),
]


@pytest.mark.parametrize("what, call, error, words", HELPER_CASES, ids=[case[0] for case in HELPER_CASES])
def test_the_helpers_name_what_is_wrong(what, call, error, words):
    """Before: walk never returned when a node was its own parent and accepted a cycle; keep('0' / None / [0.0]),
    walk with too few logit rows, a draft of 2-D ids and ngram(k=2.5) raised raw errors; ngram(k=-1) and
    ngram(n=0) returned [] quietly (issue 33, item 7; issue 29, section 5)."""
    with pytest.raises(error, match=words):
        call()


def test_a_refused_keep_moves_no_cache():
    views = _tree_views()
    before = [len(v.inner) for v in views]
    for path in ("0", None, [0.0], [0, 3], [0, -1]):
        with pytest.raises((TypeError, ValueError)):
            views[0].keep(path)
    assert [len(v.inner) for v in views] == before


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_nan_logits_when_sampling_are_named_as_nan(temperature):
    """Before: 'q_draft/p_target must hold probabilities', the rule's internal names, not the NaN that caused it."""
    w = dict(TINY64.weights)
    w["output.weight"] = w["output.weight"].copy()
    w["output.weight"][0, 7] = np.nan  # one logit column NaN for every token
    model = Model(TINY, w, None)
    for draft in ("ngram", "early_exit"):
        with pytest.raises(ValueError, match=f"the model's logits hold NaN: nothing to sample from at "
                                             f"temperature={temperature}"):
            speculative.generate(model, PROMPT, 6, draft=draft, temperature=temperature,
                                 rng=np.random.default_rng(0))
