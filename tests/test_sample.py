"""The one sampler (kvlesson.sample) against a loop reference, and every path that generates through it.

  - probabilities equals a reference written token by token (no sort, no partition), under hypothesis over logits
    full of ties, every rule on and off, a mask and a repetition penalty; a permutation of the vocabulary permutes
    the answer (no cut depends on the order a sort leaves ties in);
  - draws follow the distribution (chi-square), and the same (seed, position) always gives the same token;
  - the same seed gives the same tokens in model.generate, lesson 09's Batcher and the Engine, batched with others;
  - greedy is the argmax everywhere (the rest of the suite keeps every greedy output token-identical);
  - where Hugging Face transformers has the same rule (temperature, top-k, top-p, min-p, repetition penalty), its
    logits processors keep the same tokens (skipped where transformers is not installed);
  - mutants: a top-p that splits a tie, a penalty that divides negative logits, top-p before temperature.
"""
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlesson import model as kvmodel
from kvlesson import sample, speculative
from kvlesson.sample import Sampling, probabilities
from kvlesson.serving import Engine, batch
from kvlesson.teaching.checks.speculative import chi_square_p
from tests.helpers import ENGINE_TINY, tiny_model

# ---- a reference, one token at a time


def reference(logits, params, history=(), allowed=None):
    """The rules as their definitions read, one token at a time, in float64."""
    z = [float(x) for x in logits]
    V = len(z)
    for t in set(history):
        if params.repetition_penalty != 1:
            z[t] = z[t] / params.repetition_penalty if z[t] > 0 else z[t] * params.repetition_penalty
    ok = [allowed is None or bool(allowed[i]) for i in range(V)]
    if params.temperature == 0:
        best = max(i for i in range(V) if ok[i] and all(z[i] >= z[j] for j in range(V) if ok[j]))
        best = min(i for i in range(V) if ok[i] and z[i] == z[best])  # the first of equal maxima
        return np.eye(V)[best]
    top = max(z[i] for i in range(V) if ok[i])
    p = [math.exp((z[i] - top) / params.temperature) if ok[i] else 0.0 for i in range(V)]
    if params.top_k:
        p = [x if sum(y > x for y in p) < params.top_k else 0.0 for x in p]  # fewer than k strictly above it
    if params.top_p < 1:
        total = sum(p)
        # token x is kept when the tokens strictly more probable than it hold less than top_p of the mass
        p = [x if sum(y for y in p if y > x) < params.top_p * total else 0.0 for x in p]
    if params.min_p > 0:
        p = [x if x >= params.min_p * max(p) else 0.0 for x in p]
    s = sum(p)
    return np.array([x / s for x in p])


@st.composite
def cases(draw):
    V = draw(st.integers(1, 12))
    levels = draw(st.lists(st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0, 2.0001]), min_size=V, max_size=V))  # ties
    params = Sampling(temperature=draw(st.sampled_from([0.0, 0.5, 1.0, 1.7])), top_k=draw(st.integers(0, V + 1)),
                      top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.2])), min_p=draw(st.sampled_from([0.0, 0.1, 0.5])),
                      repetition_penalty=draw(st.sampled_from([1.0, 1.3, 0.7])), seed=draw(st.integers(0, 99)))
    history = draw(st.lists(st.integers(0, V - 1), max_size=4))
    allowed = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=V, max_size=V).filter(any)))
    return np.array(levels), params, history, None if allowed is None else np.array(allowed)


@settings(max_examples=300)
@given(cases())
def test_probabilities_equal_the_loop_reference(case):
    logits, params, history, allowed = case
    got = probabilities(logits, params, history=history, allowed=allowed)
    np.testing.assert_allclose(got, reference(logits, params, history, allowed), rtol=1e-12, atol=1e-15)
    assert got.dtype == np.float64 and abs(got.sum() - 1) < 1e-12


@settings(max_examples=100)
@given(cases(), st.randoms())
def test_a_permuted_vocabulary_permutes_the_distribution(case, random):
    """No cut depends on where a sort leaves tied tokens: a cut that splits a tie fails this."""
    logits, params, history, allowed = case
    if params.greedy:
        return  # the first of equal maxima is an order by definition
    perm = np.array(random.sample(range(len(logits)), len(logits)))
    where = np.argsort(perm)  # token t of the original is token where[t] of the permuted
    moved = probabilities(logits[perm], params, history=[int(where[t]) for t in history],
                          allowed=None if allowed is None else allowed[perm])
    np.testing.assert_allclose(moved, probabilities(logits, params, history=history, allowed=allowed)[perm],
                               rtol=1e-12, atol=1e-15)


def test_top_p_keeps_a_tie_at_the_cut_whole():
    """Four tokens at 0.2 and two at 0.1: the running sum reaches 0.5 inside the tie, so all four stay (0.8)."""
    p = np.array([0.2, 0.1, 0.2, 0.2, 0.1, 0.2])
    got = probabilities(np.log(p), Sampling(temperature=1.0, top_p=0.5))
    np.testing.assert_allclose(got, [0.25, 0, 0.25, 0.25, 0, 0.25], atol=1e-12)


def test_a_top_p_that_splits_ties_is_caught():
    def sort_prefix(p, top_p):
        """The bug: keep the sort's first n tokens, cutting through a tie in whatever order the sort left it."""
        order = np.argsort(-p, kind="stable")
        p[order[int(np.searchsorted(np.cumsum(p[order]), top_p * p.sum())) + 1 :]] = 0.0
        return -1.0  # done in place: the caller's own cut then removes nothing more

    with mock.patch.object(sample, "_nucleus_cut", sort_prefix), pytest.raises(AssertionError):
        test_top_p_keeps_a_tie_at_the_cut_whole()


def test_a_penalty_that_divides_negative_logits_is_caught():
    def divides(logits, params, *, history=(), allowed=None, real=sample.probabilities):
        z = np.array(logits, dtype=np.float64)
        seen = np.unique(np.asarray(history, dtype=np.int64))
        if params.repetition_penalty != 1 and seen.size:
            z[seen] /= params.repetition_penalty  # the bug: a negative logit divided by 1.3 goes up
        return real(z, Sampling(**{**vars(params), "repetition_penalty": 1.0}), allowed=allowed)

    logits, params = np.array([1.0, -2.0, 0.5]), Sampling(temperature=1.0, repetition_penalty=1.3)
    want = reference(logits, params, history=[1])
    assert want[1] < reference(logits, Sampling(temperature=1.0))[1]  # the penalty lowers a seen negative logit
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(divides(logits, params, history=[1]), want, rtol=1e-9)


def test_temperature_comes_before_top_p():
    """At temperature 2 the nucleus of 0.75 holds more tokens than at temperature 1: top-p cuts the tempered
    distribution, as transformers' and vLLM's order has it."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    cold = probabilities(logits, Sampling(temperature=1.0, top_p=0.75))
    hot = probabilities(logits, Sampling(temperature=2.0, top_p=0.75))
    assert np.count_nonzero(cold) == 2 and np.count_nonzero(hot) == 3


# ---- draws


def test_draws_follow_the_distribution_and_a_seed_repeats_them():
    logits = np.array([0.3, -1.0, 1.2, 0.0, 0.7])
    params = Sampling(temperature=0.9, top_k=3, seed=11)  # 3 tokens kept: chi_square_p takes an odd count
    p = probabilities(logits, params)
    tokens = [sample.sample(logits, params, position=i) for i in range(6000)]
    assert chi_square_p(np.bincount(tokens, minlength=5)[p > 0], p[p > 0]) > 1e-3
    assert np.bincount(tokens, minlength=5)[p == 0].sum() == 0
    assert tokens[:50] == [sample.sample(logits, params, position=i) for i in range(50)]
    assert tokens[:50] != [sample.sample(logits, Sampling(temperature=0.9, top_k=3, seed=12), position=i)
                           for i in range(50)]


def test_greedy_is_the_argmax_and_draws_nothing():
    logits = np.array([0.1, 2.0, 2.0, -1.0], dtype=np.float32)
    assert sample.sample(logits) == 1  # the first of equal maxima, as np.argmax
    assert sample.sample(logits, allowed=np.array([True, False, True, True])) == 2


@pytest.mark.parametrize("bad, error, message", [
    (dict(temperature=-0.1), ValueError, "temperature must be finite and at least 0"),
    (dict(temperature="hot"), TypeError, "temperature must be a real number"),
    (dict(top_p=0.0), ValueError, r"top_p must lie in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must lie in \(0, 1\]"),
    (dict(top_k=-1), ValueError, "top_k must be at least 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an integer"),
    (dict(min_p=2.0), ValueError, r"min_p must lie in \[0, 1\]"),
    (dict(repetition_penalty=0.0), ValueError, "repetition_penalty must be finite and above 0"),
    (dict(seed=2**64), ValueError, "seed must fit in 64 bits"),
    (dict(seed=True), TypeError, "seed must be a real number"),
])
def test_bad_parameters_are_refused_by_name(bad, error, message):
    with pytest.raises(error, match=message):
        Sampling(**bad)


def test_a_sampled_token_needs_a_seed_and_a_mask_must_allow_something():
    with pytest.raises(ValueError, match="needs a seed"):
        sample.sample(np.zeros(3), Sampling(temperature=1.0))
    with pytest.raises(ValueError, match="allowing at least one token"):
        probabilities(np.zeros(3), allowed=np.zeros(3, bool))


# ---- every path: the same seed, the same tokens, alone or batched

SAMPLED = [Sampling(temperature=0.8, top_p=0.9, seed=1), Sampling(temperature=1.3, top_k=20, min_p=0.05, seed=2),
           Sampling(temperature=1.0, repetition_penalty=1.5, seed=3), Sampling()]
PROMPTS = [[5, 6, 7, 8], [11, 33, 11], [9, 1, 2, 3, 4, 5, 6], [42]]


def test_a_seed_gives_the_same_tokens_in_generate_the_batcher_and_the_engine():
    model = tiny_model(seed=1)
    alone = [kvmodel.generate(ENGINE_TINY, model.weights, p, 12, dtype=np.float64, sampling=s)
             for p, s in zip(PROMPTS, SAMPLED, strict=True)]
    assert len({tuple(a) for a in alone}) == 4 and alone[0] != kvmodel.generate(
        ENGINE_TINY, model.weights, PROMPTS[0], 12, dtype=np.float64, sampling=Sampling(temperature=0.8, top_p=0.9,
                                                                                      seed=9))
    batcher = batch.Batcher(ENGINE_TINY, model.weights, n_blocks=32, block_size=4, dtype=np.float64)
    rids = [batcher.submit(p, 12, sampling=s) for p, s in zip(PROMPTS, SAMPLED, strict=True)]
    while not batcher.done:
        batcher.step()
    assert [batcher.results[r] for r in rids] == alone
    eng = Engine(model, n_blocks=12, block_size=4, max_batch_tokens=8)  # tight: chunks and preemptions
    rids = [eng.submit(p, 12, sampling=s) for p, s in zip(PROMPTS, SAMPLED, strict=True)]
    out = eng.run()
    assert [out[r] for r in rids] == alone and eng.stats["preemptions"] > 0


def test_an_engine_picks_a_seed_for_a_request_without_one_and_keeps_it():
    eng = Engine(tiny_model(), n_blocks=16, block_size=4)
    rid = eng.submit([1, 2, 3], 6, sampling=Sampling(temperature=1.0))
    seed = eng.stats["requests"][rid]["seed"]
    assert isinstance(seed, int)
    got = eng.run()[rid]
    assert got == kvmodel.generate(ENGINE_TINY, tiny_model().weights, [1, 2, 3], 6, dtype=np.float64,
                                   sampling=Sampling(temperature=1.0, seed=seed))


# ---- Hugging Face transformers' logits processors, where it is installed


def test_the_rules_match_transformers_logits_processors():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lp = transformers.generation.logits_process
    rng = np.random.default_rng(0)
    for trial in range(50):
        V = 64
        logits = rng.standard_normal(V) * 3  # no ties: transformers breaks them by its sort, kvlesson keeps them whole
        history = rng.integers(0, V, 6).tolist()
        params = Sampling(temperature=float(rng.choice([0.5, 1.0, 1.5])), top_k=int(rng.choice([0, 5, 20])),
                          top_p=float(rng.choice([1.0, 0.9, 0.6])), min_p=float(rng.choice([0.0, 0.05])),
                          repetition_penalty=float(rng.choice([1.0, 1.2])))
        scores = torch.tensor(logits[None], dtype=torch.float64)
        ids = torch.tensor([history])
        chain = [lp.RepetitionPenaltyLogitsProcessor(params.repetition_penalty),
                 lp.TemperatureLogitsWarper(params.temperature)]
        chain += [lp.TopKLogitsWarper(params.top_k)] if params.top_k else []
        chain += [lp.TopPLogitsWarper(params.top_p)] if params.top_p < 1 else []
        chain += [lp.MinPLogitsWarper(params.min_p)] if params.min_p else []
        for processor in chain:
            scores = processor(ids, scores)
        theirs = torch.softmax(scores, dim=-1)[0].numpy()
        np.testing.assert_allclose(probabilities(logits, params, history=history), theirs, atol=1e-12,
                                   err_msg=f"trial {trial}: {params}")


# ---- speculative decoding: the accept rule on the processed distributions


def first_emitted(p, q_drawn, q_told, trials=6000, seed=0):
    """Counts of the first token the accept rule emits, drafts drawn from q_drawn, the rule told q_told."""
    rng = np.random.default_rng(seed)
    drafts = (rng.random(trials)[:, None] > np.cumsum(q_drawn)).sum(axis=1)  # [trials] drawn from q_drawn
    out = [speculative.accept(p, q_told[None], [int(d)], rng)[0] for d in drafts]
    return np.bincount(out, minlength=p.shape[1])


def processed_pair(params):
    rng = np.random.default_rng(5)
    target, draft = rng.standard_normal((2, 5)) * 1.5  # [5] logits each
    p = np.stack([probabilities(target, params), probabilities(target, params)])  # [k + 1 = 2, 5]
    return target, draft, p, probabilities(draft, params)


def test_the_accept_rule_keeps_the_processed_target_distribution():
    params = Sampling(temperature=0.8, top_k=3)
    _, draft, p, q = processed_pair(params)
    kept = p[0] > 0
    assert chi_square_p(first_emitted(p, q, q)[kept], p[0][kept]) > 1e-3
    assert first_emitted(p, q, q)[~kept].sum() == 0  # nothing outside the top 3 ever comes out


def test_a_raw_target_distribution_in_the_rule_is_caught():
    """The bug: the rule told the raw softmax, not what the request asked for: tokens outside the top-k come out."""
    params = Sampling(temperature=0.8, top_k=3)
    target, _, p, q = processed_pair(params)
    raw = probabilities(target, Sampling(temperature=0.8))
    assert first_emitted(np.stack([raw, raw]), q, q)[p[0] == 0].sum() > 100


def test_drafts_drawn_from_one_distribution_and_told_another_are_caught():
    """The bug: the drafter draws from its processed q, and the rule is told its raw softmax."""
    params = Sampling(temperature=0.8, top_k=3)
    _, draft, p, q = processed_pair(params)
    raw_q = probabilities(draft, Sampling(temperature=0.8))
    kept = p[0] > 0
    assert chi_square_p(first_emitted(p, q, raw_q, trials=20000)[kept], p[0][kept]) < 1e-6


def test_speculative_decoding_samples_through_the_same_rules():
    """top_k = 1 at any temperature leaves one token: speculative decoding, target and early-exit drafter processed
    alike, writes greedy's tokens; told the raw target distribution instead, it does not."""
    model = tiny_model(seed=2)
    model.tokenizer = None
    prompt, one = [3, 4, 5, 3, 4, 5, 3, 4], Sampling(temperature=1.5, top_k=1, seed=4)
    greedy = kvmodel.generate(ENGINE_TINY, model.weights, prompt, 16, dtype=np.float64)
    for draft in ("ngram", "early_exit"):
        assert speculative.generate(model, prompt, 16, draft=draft, k=3, sampling=one)[0] == greedy
    raw = lambda logits, params, **kw: probabilities(logits, Sampling(temperature=params.temperature,  # noqa: E731
                                                                      seed=params.seed), **kw)
    with mock.patch.object(speculative, "probabilities", raw):
        assert speculative.generate(model, prompt, 16, draft="ngram", k=3, sampling=one)[0] != greedy
