"""Ctrl-C anywhere: every stateful call happens whole or leaves everything as it was (issues 28, 29 and 33).

A learner's stop button raises KeyboardInterrupt at whatever line is running. Before this file's fixes, an Engine
step cut short inside its forward pass had already counted the new positions as written; the next step published
them to the prefix cache, and later requests sharing the prompt got other text (with preemption="swap" the next step
never returned). Lesson 09's Batcher raised IndexError for ever after; model.forward left its layer caches at
different lengths and ran on them without a word; speculative.rollback truncated some caches before refusing.

Here KeyboardInterrupt is raised at every place a run reaches in turn (before and after every layer of every forward
pass, after every pool method that moves state: tests.helpers.Interrupts), the call is run again as a learner re-runs
the cell, and every output must still equal generate alone, every interrupted call must leave the state exactly as it
was, and every pool must end whole.
"""
import copy
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlesson import KVCache, QuantizedKVCache, SinkKVCache, StaticKVCache, WindowKVCache, speculative, step
from kvlesson import model as kvmodel
from kvlesson.sample import Sampling
from kvlesson.serving import Engine, batch
from kvlesson.serving.forward import model_pool
from kvlesson.serving.grammar import Grammar
from kvlesson.shrink.evict import H2OKVCache
from tests.helpers import (
    ENGINE_TINY,
    Interrupts,
    accounts,
    check_trace,
    engine_state,
    generate_alone,
    pool_state,
    survive,
    tiny_chat_model,
    tiny_model,
    traces,
)

# ---- the engine: every place of a whole run, one at a time

TRACE = dict(requests=[dict(prompt=[5, 6, 7, 8, 9, 43, 26, 174, 14, 112, 25, 66], new=4, arrival=1, stop=None),
                       dict(prompt=[11, 33, 11, 137], new=5, arrival=1, stop=None),
                       dict(prompt=[5, 6, 7, 155, 82, 97], new=6, arrival=2, stop=None)],
             block_size=2, n_blocks=9, max_seqs=3, budget=8, seed=1)  # tight: every mode preempts, caching hits


def places(run, armed=True):
    """How many places an uninterrupted run reaches (armed=False: only inside survive())."""
    with Interrupts((), armed) as count:
        run(count) if not armed else run()
    return count.reached


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_an_engine_interrupted_at_each_place_in_turn_gives_every_token_of_generate_alone(preemption, prefix_caching):
    c = dict(TRACE, preemption=preemption, prefix_caching=prefix_caching)
    stats = check_trace(dict(c, requests=[dict(r) for r in c["requests"]])).stats
    assert stats["preemptions"] > 0 and (stats["prefix_hit_tokens"] > 0) == prefix_caching
    n = places(lambda count: check_trace(dict(c, requests=[dict(r) for r in c["requests"]]), interrupts=count),
               armed=False)
    for k in range(1, n + 1):
        with Interrupts([k], armed=False) as interrupts:
            check_trace(dict(c, requests=[dict(r) for r in c["requests"]]), interrupts=interrupts)
        assert interrupts.fired == 1, f"place {k} of {n} was never reached"


@settings(max_examples=60, deadline=None)
@given(traces(), st.lists(st.integers(1, 400), max_size=6))
def test_an_engine_interrupted_at_random_places_gives_every_token_of_generate_alone(c, at):
    with Interrupts(at, armed=False) as interrupts:
        check_trace(c, interrupts=interrupts)


# ---- sampled requests, grammars' state and aborts (lesson 16)

SAMPLED = [Sampling(temperature=0.9, top_p=0.8, seed=5), Sampling(temperature=1.2, top_k=30, seed=6),
           Sampling(temperature=0.7, repetition_penalty=1.3, seed=7)]


def test_sampled_requests_interrupted_at_each_place_in_turn_draw_the_same_tokens():
    """A step undone and run again draws the same numbers: the draw is a function of (seed, position)."""
    model = tiny_model(seed=1)
    prompts = [[5, 6, 7, 8, 9, 43], [11, 33, 11, 137], [5, 6, 7, 155]]
    want = [kvmodel.generate(model.config, model.weights, p, 5, dtype=np.float64, sampling=s)
            for p, s in zip(prompts, SAMPLED, strict=True)]

    def run(interrupts):
        eng = Engine(model, 7, 2, max_batch_tokens=6, max_seqs=3)
        rids = [eng.submit(p, 5, sampling=s) for p, s in zip(prompts, SAMPLED, strict=True)]
        while not eng.done:
            survive(eng.step, lambda: engine_state(eng), eng.pool, interrupts)
        assert [eng.requests[r].tokens for r in rids] == want
        assert eng.stats["preemptions"] > 0
        accounts(eng.pool)

    n = places(run, armed=False)
    for k in range(1, n + 1):
        with Interrupts([k], armed=False) as interrupts:
            run(interrupts)
        assert interrupts.fired == 1


def test_an_abort_cut_short_leaves_everything_as_it_was():
    model = tiny_model()
    fired = 0
    for preemption in ("recompute", "swap"):
        for at_step in range(5):
            eng = Engine(model, 7, 2, max_batch_tokens=6, max_seqs=3, preemption=preemption)
            rids = [eng.submit(p, 5) for p in ([5, 6, 7, 8, 9], [11, 33, 11], [5, 6, 7])]
            for _ in range(at_step):
                eng.step()
            for rid in rids:
                before = engine_state(eng), pool_state(eng.pool)
                with Interrupts([1]):
                    try:
                        eng.abort(rid)  # a running one's pool.free raises once it has freed
                    except KeyboardInterrupt:
                        fired += 1
                        assert (engine_state(eng), pool_state(eng.pool)) == before
                        assert eng.abort(rid)
                accounts(eng.pool)
            eng.run()
            assert eng.pool.blocks_free == eng.pool.n_blocks
    assert fired >= 10  # running requests were cut short in both modes


def test_grammar_requests_interrupted_at_each_place_in_turn_keep_their_grammar_in_step():
    """A step undone puts each grammar back too (Grammar.checkpoint): the output still matches, token for token."""
    model = tiny_chat_model(seed=1)
    tok = model.tokenizer
    pattern = r"[a-c]{2}-(yes|no)-[0-9]"
    prompts = [tok.encode("one"), tok.encode("second one")]

    def run(interrupts):
        eng = Engine(model, 12, 2, max_batch_tokens=6, max_seqs=2)
        rids = [eng.submit(p, 12, stop_ids=(tok.eos_id,), sampling=Sampling(temperature=1.0, seed=i),
                           grammar=Grammar.regex(tok, pattern)) for i, p in enumerate(prompts)]
        while not eng.done:
            if interrupts is None:
                eng.step()
            else:
                survive(eng.step, lambda: engine_state(eng) + tuple(
                    eng.requests[r].grammar.consumed for r in rids), eng.pool, interrupts)
        return [eng.requests[r].tokens for r in rids]

    want = run(None)
    assert all(re.fullmatch(pattern, tok.decode([t for t in w if t != tok.eos_id])) for w in want)
    n = places(run, armed=False)
    assert n > 20
    for k in range(1, n + 1, 2):
        with Interrupts([k], armed=False) as interrupts:
            assert run(interrupts) == want
        assert interrupts.fired == 1


# ---- lesson 09's Batcher


def batcher_state(engine):
    return (repr([r.id for r in engine.waiting]), repr([(r.id, r.seq, list(r.tokens)) for r in engine.running]),
            repr(engine.results), engine._next_id)


def test_a_batcher_interrupted_at_each_place_in_turn_gives_every_token_of_generate_alone():
    model = tiny_model(seed=2)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14], [2, 2]]
    want = [generate_alone(model, p, 4) for p in prompts]

    def run(interrupts):
        engine = batch.Batcher(ENGINE_TINY, model.weights, n_blocks=6, block_size=3, max_batch=2, dtype=np.float64)
        rids = [engine.submit(p, 4) for p in prompts]
        while not engine.done:
            survive(engine.step, lambda: batcher_state(engine), engine.pool, interrupts)
        assert [engine.results[r] for r in rids] == want
        accounts(engine.pool)
        assert engine.pool.blocks_free == engine.pool.n_blocks

    n = places(run, armed=False)
    for k in range(1, n + 1):
        with Interrupts([k], armed=False) as interrupts:
            run(interrupts)
        assert interrupts.fired == 1


# ---- one sequence's forward pass, on every kind of cache


CACHES = {
    "KVCache": lambda cfg: KVCache(cfg.Hkv, cfg.d),
    "StaticKVCache": lambda cfg: StaticKVCache(cfg.Hkv, cfg.d, 40),
    "WindowKVCache": lambda cfg: WindowKVCache(cfg.Hkv, cfg.d, 4),
    "SinkKVCache": lambda cfg: SinkKVCache(cfg.Hkv, cfg.d, 2, 4),
    "QuantizedKVCache": lambda cfg: QuantizedKVCache(cfg.Hkv, cfg.d, bits=8, dtype=np.float64),
    "H2OKVCache": lambda cfg: H2OKVCache(cfg.Hkv, cfg.d, heavy=2, recent=3),
}


def cache_state(caches):
    """Every attribute of each cache, into the objects it holds; of a cache that writes only past its length, its
    arrays up to that length (what lies past it is never read)."""
    def state(v, upto=None):
        if isinstance(v, np.ndarray):
            return (v if upto is None else v[:, :upto]).tobytes()
        if hasattr(v, "__dict__") and not isinstance(v, (type, np.dtype)):
            return sorted((k, state(x, upto)) for k, x in vars(v).items())
        if isinstance(v, (list, tuple)):
            return [state(x) for x in v]
        return repr(v)
    return [state(c, len(c) if c.appends == "writes past end" else None) for c in caches]


@pytest.mark.parametrize("kind", list(CACHES) + ["PagedKVCache"])
def test_a_forward_pass_interrupted_at_any_layer_leaves_every_cache_as_it_was(kind):
    cfg = kvmodel.tiny_config(n_layers=4, max_len=64)
    w = kvmodel.random_weights(cfg, seed=3, dtype=np.float64)
    if kind == "PagedKVCache":
        pools = [model_pool(kvmodel.tiny_config(n_layers=1), 20, 3, np.float64) for _ in range(cfg.n_layers)]
        caches = [pool.sequence(pool.new_sequence()) for pool in pools]
        state = lambda: [pool_state(p) for p in pools]  # noqa: E731
    else:
        caches = [CACHES[kind](cfg) for _ in range(cfg.n_layers)]
        state = lambda: cache_state(caches)  # noqa: E731
    chunks = [[1, 2, 3, 4, 5], [6], [7, 8, 9], [10], [11]]
    reference = [CACHES.get(kind, CACHES["KVCache"])(cfg) for _ in range(cfg.n_layers)]
    for ids in chunks:
        expected = kvmodel.forward(cfg, w, ids, reference)
        n = places(lambda: kvmodel.forward(cfg, w, ids, copy.deepcopy(caches)))  # noqa: B023
        for k in range(1, n + 1):  # before and after every layer, after every move of a pool
            before = state()
            with Interrupts([k]), pytest.raises(KeyboardInterrupt):
                kvmodel.forward(cfg, w, ids, caches)
            assert state() == before, f"{kind}: a pass cut short at place {k} of {n} moved the caches"
        np.testing.assert_allclose(kvmodel.forward(cfg, w, ids, caches), expected, rtol=0, atol=1e-12)


def test_caches_that_disagree_on_their_length_are_refused_by_name():
    """What a cache of the learner's own, which kvlesson cannot put back, leaves after a pass cut short."""
    cfg = kvmodel.tiny_config(n_layers=2, max_len=32)
    w = kvmodel.random_weights(cfg, seed=0, dtype=np.float64)
    caches = [KVCache(cfg.Hkv, cfg.d), KVCache(cfg.Hkv, cfg.d)]
    caches[1].append(np.zeros((cfg.Hkv, 2, cfg.d)), np.zeros((cfg.Hkv, 2, cfg.d)))
    with pytest.raises(ValueError, match=r"the layer caches disagree on how many positions they hold: \[0, 2\]"):
        kvmodel.forward(cfg, w, [4], caches)


def test_step_cut_short_after_its_append_puts_the_cache_back():
    rng = np.random.default_rng(0)
    x, Wq, Wk, Wv = (rng.standard_normal(s) for s in ((3, 8), (8, 8), (8, 4), (8, 4)))
    for cache in (KVCache(2, 2), StaticKVCache(2, 2, 8), WindowKVCache(2, 2, 2)):
        step(x[:2], Wq, Wk, Wv, cache, 4, 2, rope_base=100.0)
        before = cache_state([cache])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("kvlesson.layer.attention", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
            with pytest.raises(KeyboardInterrupt):
                step(x[2:], Wq, Wk, Wv, cache, 4, 2, rope_base=100.0)
        assert cache_state([cache]) == before, type(cache).__name__


# ---- speculative decoding


@pytest.mark.parametrize("draft", ["ngram", "early_exit"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_decoding_cut_short_anywhere_leaves_the_generator_as_it_was(draft, temperature):
    model = tiny_model(seed=1)
    model.tokenizer = None
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    want, _ = speculative.generate(model, prompt, 10, draft=draft, k=3, temperature=temperature,
                                   rng=np.random.default_rng(7))
    n = places(lambda: speculative.generate(model, prompt, 10, draft=draft, k=3, temperature=temperature,
                                            rng=np.random.default_rng(7)))
    for k in range(1, n + 1, 3):
        rng = np.random.default_rng(7)
        state = rng.bit_generator.state
        with Interrupts([k]), pytest.raises(KeyboardInterrupt):
            speculative.generate(model, prompt, 10, draft=draft, k=3, temperature=temperature, rng=rng)
        assert rng.bit_generator.state == state
        assert speculative.generate(model, prompt, 10, draft=draft, k=3, temperature=temperature, rng=rng)[0] == want


def test_a_rollback_that_one_cache_refuses_truncates_none():
    """Uneven caches, a ring that has overwritten what a rollback needs, and Ctrl-C in the middle of the truncates."""
    caches = [StaticKVCache(1, 2, 10), KVCache(1, 2), WindowKVCache(1, 2, 3, slack=2)]
    for c in caches:
        c.append(np.ones((1, 6, 2)), np.ones((1, 6, 2)))
    before = cache_state(caches)
    with pytest.raises(ValueError, match=r"caches\[2\]"):
        speculative.rollback(caches, 2)  # the ring (window 3, slack 2) has overwritten position 2
    assert cache_state(caches) == before
    uneven = caches[:2] + [KVCache(1, 2)]
    with pytest.raises(ValueError, match=r"caches\[2\] holds only 0 positions"):
        speculative.rollback(uneven, 4)
    assert cache_state(caches[:2]) == before[:2]
    real = KVCache.truncate

    def cut_short(self, n):
        real(self, n)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp, pytest.raises(KeyboardInterrupt):
        mp.setattr(KVCache, "truncate", cut_short)
        speculative.rollback(caches, 5)
    assert cache_state(caches) == before
    speculative.rollback(caches, 5)
    assert [len(c) for c in caches] == [5, 5, 5]
