"""The scheduler (kvlesson.serving.Engine) against each request run alone, and the pool it adds to.

The invariants of issue 21, under hypothesis over arrival steps, prompt lengths, shared prefixes, pools just big
enough for the longest request, budgets, max_seqs, both preemption modes, prefix caching on and off, stop ids:
  - every request's tokens, as step() streams them and as run() returns them, equal model.generate on that prompt
    alone, cut at its stop, token for token (tiny model, float64);
  - every step is one forward pass of at most max_batch_tokens tokens, and a sequence that is decoding gets its token
    in every step unless it is preempted in that step;
  - reference counts never go negative and always count the block tables; after run() every block is free or cached
    with no user.
Then the same on SmolLM2 in float32 (tokens identical; its logits differ from generate's by float32 rounding only,
far below the gaps between its top tokens here). Then the mutants: each invariant's test, run on a deliberately broken
engine, fails.
"""
import math
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from kvlesson import Engine as TopLevelEngine
from kvlesson import KVCache
from kvlesson.serving import Engine, batch, engine, forward, paged, trace
from kvlesson.serving.paged import PagedKVCache, SwappedSequence, block_hash, block_hashes
from kvlesson.text import long_text
from tests.helpers import ENGINE_TINY, accounts, check_trace, generate_alone, tiny_model, traces


@settings(max_examples=150)
@given(traces())
def test_every_request_equals_itself_alone_and_every_invariant_holds(c):
    check_trace(c)


# ---- mutants: each invariant's test fails on a deliberately broken engine

MUTANT = settings(max_examples=400, derandomize=True, database=None, phases=[Phase.generate])


def falsified(make=Engine):
    """Run the property above on `make` engines under hypothesis (derandomized: the same examples every run) ->
    the message of the first failure it finds."""
    with pytest.raises(AssertionError) as failure:
        MUTANT(given(traces())(lambda c: check_trace(c, make) and None))()
    return str(failure.value)


def own_tokens_key(parent, tokens):
    """The bug: a block keyed on its own tokens only, not on everything before it."""
    return block_hash(None, tokens)


def test_a_prefix_cache_keyed_on_one_blocks_own_tokens_is_caught():
    with mock.patch.object(paged, "block_hash", own_tokens_key):
        assert "alone" in falsified()


class Forgetful(Engine):
    """The bug: a request preempted by recompute forgets what it generated (it resumes from its prompt alone)."""

    def _preempt(self, r):
        super()._preempt(r)
        if self.preemption == "recompute":
            r.tokens = []


def test_a_preemption_that_forgets_generated_tokens_is_caught():
    assert "alone" in falsified(Forgetful)


def prefill_only_budget(decodes, prefills, budget, split=engine.split_budget):
    """The bug: the budget counts prefill tokens only, as if decodes were free."""
    return split(0, prefills, budget)


def test_a_budget_that_counts_only_prefill_tokens_is_caught():
    with mock.patch.object(engine, "split_budget", prefill_only_budget):
        assert "max_batch_tokens" in falsified()


class PrefillFirst(Engine):
    """The bug: prefill chunks spend the budget first and the decodes get what is left, so a long prompt arriving
    stalls the sequences already decoding."""

    def _schedule(self):
        plan, spent = self._decodes()
        chunks = self._prefills([r for r in self.running if r not in plan], 0, spent)
        room, merged = self.max_batch_tokens, {}
        for r, n in [*chunks.items(), *plan.items()]:
            if min(n, room):
                merged[r], room = min(n, room), room - min(n, room)
        return merged


def test_a_decode_skipped_behind_a_prefill_is_caught():
    assert "got no token" in falsified(PrefillFirst)


def adopt_without_counting(self, ids, limit=None):
    """The bug: a new sequence starts on cached blocks without counting itself as their user."""
    hits, held, keys = self._prefix(ids, limit)
    for block in hits:
        self._idle.pop(block, None)
    return self._add(list(hits), held, keys[: held // self.block_size]), held


def test_reference_counts_that_miss_a_user_are_caught():
    with mock.patch.object(PagedKVCache, "new_cached_sequence", adopt_without_counting):
        assert "refs" in falsified()


# ---- prefix caching, by hand

BS = 16


def shared(n=48, seed=7):
    return np.random.default_rng(seed).integers(0, ENGINE_TINY.vocab, n).tolist()


def test_requests_sharing_a_48_token_prefix_reuse_at_least_32_tokens():
    """Issue 21's bound, for a request that arrives after the first has finished and for one that arrives while the
    first is still decoding (its prompt's full blocks are published as soon as they are full)."""
    model, prefix = tiny_model(), shared()
    eng = Engine(model, 32, BS)
    a = eng.submit(prefix + [1, 2, 3], 4)
    eng.run()
    b = eng.submit(prefix + [9, 8], 4)
    c = eng.submit(prefix + [7], 4)
    eng.step()
    d = eng.submit(prefix + [5, 5, 5, 5], 4)  # arrives while b and c decode
    out = eng.run()
    per = eng.stats["requests"]
    assert per[a]["prefix_hit_tokens"] == 0
    assert all(per[r]["prefix_hit_tokens"] >= 32 for r in (b, c, d)), per
    assert [per[r]["prefix_hit_tokens"] for r in (b, c, d)] == [48, 48, 48]
    for r, tail in ((b, [9, 8]), (c, [7]), (d, [5, 5, 5, 5])):
        assert out[r] == generate_alone(model, prefix + tail, 4)


def test_a_prompt_that_is_all_cached_still_runs_its_last_token():
    """When every block of a prompt is cached, the last prompt token must still be run for its logits: the sequence
    starts one short, inside a shared full block, and copies it before its first write (copy-on-write)."""
    model, prompt = tiny_model(), shared(32)
    eng = Engine(model, 8, BS, max_seqs=2)
    first = eng.submit(prompt, 6)
    eng.step()  # the prompt's two blocks are full and published
    again = eng.submit(prompt, 6)
    eng.step()
    assert eng.stats["requests"][again]["prefix_hit_tokens"] == 31
    seq_first, seq_again = eng.requests[first].seq, eng.requests[again].seq
    assert eng.pool.block_table(seq_again)[0] == eng.pool.block_table(seq_first)[0]  # the full first block, shared
    assert eng.pool.block_table(seq_again)[1] != eng.pool.block_table(seq_first)[1]  # the second, copied
    out = eng.run()
    assert out[first] == out[again] == generate_alone(model, prompt, 6)


def test_different_earlier_tokens_give_a_block_another_key():
    a, b = shared(16, 1), shared(16, 2)
    block = shared(16, 3)
    assert block_hashes(a + block, BS)[1] != block_hashes(b + block, BS)[1]
    assert block_hashes(a + block, BS)[0] == block_hash(None, a)
    assert block_hashes(a + block + [1, 2], BS) == block_hashes(a + block, BS)  # a partial block has no key
    assert block_hashes(a[:15], BS) == []
    assert block_hash(None, np.array(a)) == block_hash(None, a)  # ids as numpy integers or Python ints


def test_cached_blocks_count_as_free_and_the_least_recently_released_go_first():
    pool = PagedKVCache(4, 2, 1, 1)
    ids = list(range(8))
    a = pool.new_sequence()
    pool.sequence(a).append(*np.arange(16.0).reshape(2, 1, 8, 1))
    pool.publish(a, ids)
    assert pool.blocks_cached == 4 and pool.blocks_free == 0
    pool.free(a)
    assert pool.blocks_free == 4 and pool.blocks_cached == 4 and pool.refs == [0] * 4
    assert pool.lookup(ids + [9]) == [0, 1, 2, 3]
    b = pool.new_sequence()
    pool.sequence(b).append(np.zeros((1, 2, 1)), np.zeros((1, 2, 1)))  # takes one block: the tail of a's run
    assert pool.block_table(b) == [3] and pool.lookup(ids) == [0, 1, 2]
    seq, held = pool.new_cached_sequence(ids, limit=5)
    assert held == 5 and pool.block_table(seq) == [0, 1, 2] and pool.refs[:3] == [1, 1, 1]
    K, _ = pool.gather(seq)
    np.testing.assert_array_equal(K[0, :, 0], np.arange(5.0))
    assert pool.cached_cost(ids, limit=7) == (6, 1)  # block 3 is gone and blocks 0-2 are in use: one new block
    assert pool.cached_cost(ids[:5], limit=3) == (3, 2)  # ends inside block 1, which seq uses: a copy and a block
    pool.free(seq)
    pool.free(b)
    assert pool.blocks_free == 4


def test_a_cached_block_its_only_user_writes_into_is_forgotten_first():
    """truncate back into a cached block, then write: the block no longer holds what its key names, so the cache
    must not hand it out under that key again."""
    pool = PagedKVCache(4, 2, 1, 1)
    a = pool.new_sequence()
    pool.sequence(a).append(np.ones((1, 4, 1)), np.ones((1, 4, 1)))
    pool.publish(a, [1, 2, 3, 4])
    pool.truncate(a, 3)
    pool.sequence(a).append(np.full((1, 1, 1), 9.0), np.full((1, 1, 1), 9.0))
    assert pool.lookup([1, 2, 3, 4]) == [0]


@st.composite
def pool_scripts(draw):
    ops = st.tuples(st.sampled_from(["new", "cached", "append", "append", "publish", "fork", "free", "swap"]),
                    st.integers(0, 99), st.integers(0, 6))
    return dict(n_blocks=draw(st.integers(1, 12)), block_size=draw(st.integers(1, 4)),
                ops=draw(st.lists(ops, min_size=4, max_size=40)), seed=draw(st.integers(0, 99)))


@given(pool_scripts())
def test_the_pool_with_caching_and_swapping_equals_a_kvcache_per_sequence(c):
    """Any interleaving of new and cached sequences, appends, publishing, forks, frees and swaps out and back: every
    sequence holds exactly what a KVCache given the same appends holds, and the accounts balance after each call.
    Each sequence's token ids are the positions' values, so a cached block's key names exactly what it holds."""
    pool = PagedKVCache(c["n_blocks"], c["block_size"], 1, 1)
    rng, ref = np.random.default_rng(c["seed"]), {}  # sequence id -> (its token ids, its own KVCache)
    texts = [rng.integers(0, 3, 40).tolist() for _ in range(2)]  # two texts, so prefixes repeat and diverge
    for op, i, T in c["ops"]:
        live = sorted(ref)
        if op in ("new", "cached") or not live:
            text = texts[i % 2]
            if op == "cached":
                seq, held = pool.new_cached_sequence(text)
            else:
                seq, held = pool.new_sequence(), 0
            ref[seq] = (text, KVCache(1, 1))
            values = np.array(text[:held], float).reshape(1, -1, 1)
            ref[seq][1].append(values, values)
        else:
            seq = live[i % len(live)]
            text, cache = ref[seq]
            if op == "append":
                L = len(cache)
                values = np.array(text[L : L + T], float).reshape(1, -1, 1)
                try:
                    pool.sequence(seq).append(values, values)
                except ValueError as e:
                    assert "out of blocks" in str(e)
                    continue
                cache.append(values, values)
            elif op == "publish":
                pool.publish(seq, text)
            elif op == "fork":
                child = pool.fork(seq)
                ref[child] = (text, KVCache(1, 1))
                ref[child][1].append(cache.k, cache.v)
            elif op == "free":
                pool.free(seq)
                del ref[seq]
            else:
                out = pool.swap_out(seq)
                assert seq not in pool.sequences and out.nbytes == 2 * out.k.shape[1] * c["block_size"] * 8
                del ref[seq]
                try:
                    ref[pool.swap_in(out)] = (text, cache)
                except ValueError as e:  # blocks it shared stayed with the others: the copy needs fresh ones
                    assert "out of blocks" in str(e)
        accounts(pool)
        for seq, (_, cache) in ref.items():
            K, V = pool.gather(seq)
            assert np.array_equal(K, cache.k) and np.array_equal(V, cache.v), f"sequence {seq} differs"
    for seq in list(ref):
        pool.free(seq)
    assert pool.blocks_free == pool.n_blocks and pool.refs == [0] * pool.n_blocks


def test_swapping_in_refuses_what_does_not_fit_and_changes_nothing():
    pool = PagedKVCache(3, 2, 1, 1)
    a = pool.new_sequence()
    pool.sequence(a).append(np.ones((1, 5, 1)), np.ones((1, 5, 1)))  # 3 blocks
    out = pool.swap_out(a)
    b = pool.new_sequence()
    pool.sequence(b).append(np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    before = (pool.blocks_free, pool.refs[:], pool.block_table(b))
    with pytest.raises(ValueError, match="out of blocks: swapping in needs 3, and 2 of 3 are free"):
        pool.swap_in(out)
    assert (pool.blocks_free, pool.refs, pool.block_table(b)) == before
    with pytest.raises(TypeError, match="swapped must be what swap_out returned"):
        pool.swap_in((out.k, out.v))
    with pytest.raises(ValueError, match="this pool holds"):
        PagedKVCache(3, 4, 1, 1).swap_in(out)
    with pytest.raises(ValueError, match="publish: ids has 0 token ids; sequence 1 holds 1 positions"):
        pool.publish(b, [])
    pool.free(b)
    assert isinstance(out, SwappedSequence) and pool.length(pool.swap_in(out)) == 5


# ---- scheduling, by hand


def test_the_budget_goes_to_decodes_first_then_prefills_in_order():
    assert engine.split_budget(3, [10, 5, 2], 16) == [10, 3, 0]
    assert engine.split_budget(0, [4], 16) == [4]
    assert engine.split_budget(16, [4], 16) == [0]
    assert engine.split_budget(2, [], 8) == []
    with pytest.raises(ValueError, match="17 decodes do not fit a budget of 16"):
        engine.split_budget(17, [], 16)
    with pytest.raises(ValueError, match="budget must be at least 1"):
        engine.split_budget(0, [], 0)


def test_a_long_prompt_is_chunked_and_the_decodes_keep_their_tokens():
    model = tiny_model()
    eng = Engine(model, 64, 4, max_batch_tokens=8, prefix_caching=False)
    short = eng.submit([1, 2, 3], 12)
    eng.step()
    long = eng.submit(list(range(40)), 3)
    while not eng.done:
        eng.step()
    log = eng.log
    assert max(e["tokens"] for e in log) <= 8
    assert all(short in e["decoded"] for e in log[1:12])  # every step until it is done
    assert eng.stats["requests"][long]["ttft_steps"] == math.ceil(40 / 7)  # 7 tokens a step beside the decode
    out = eng.run()
    assert out[short] == generate_alone(model, [1, 2, 3], 12) and out[long] == generate_alone(model, list(range(40)), 3)


@pytest.mark.parametrize("mode", engine.PREEMPTION)
def test_a_pool_that_runs_dry_preempts_the_newest_and_changes_no_token(mode):
    """Two requests whose prompts fit, whose answers do not: the newer one is preempted, comes back, and both get
    the tokens they would get alone. Swap moves its blocks out and back; recompute moves nothing and prefills
    again what it had (its prompt's full blocks come back from the cache)."""
    model = tiny_model()
    eng = Engine(model, 6, 4, preemption=mode)
    prompts = [list(range(1, 9)), list(range(20, 28))]  # 2 blocks each; 12 new tokens take 3 more each
    rids = [eng.submit(p, 12) for p in prompts]
    out = eng.run()
    st_ = eng.stats
    assert st_["preemptions"] >= 1 and st_["requests"][rids[0]]["preemptions"] == 0
    assert [out[r] for r in rids] == [generate_alone(model, p, 12) for p in prompts]
    block = 2 * 4 * ENGINE_TINY.n_layers * ENGINE_TINY.Hkv * ENGINE_TINY.d * 8  # bytes of one block, K and V, float64
    if mode == "swap":
        assert st_["swap_bytes"] > 0 and st_["swap_bytes"] % (2 * block) == 0 and st_["recomputed_tokens"] == 0
    else:
        assert st_["swap_bytes"] == 0 and st_["recomputed_tokens"] > 0
        assert st_["prefix_hit_tokens"] > 0  # the cache evicts the tail of its blocks first, so its head survived


def test_stats_count_steps_and_latencies():
    model = tiny_model()
    eng = Engine(model, 16, 4, max_batch_tokens=4)
    a = eng.submit(list(range(10)), 3)
    b = eng.submit([5], 1)
    eng.run()
    st_ = eng.stats
    assert st_["steps"] == len(st_["step_tokens"]) == len(st_["step_seconds"]) == len(eng.log)
    assert sum(st_["step_tokens"]) == 10 + 2 + 1  # the prompt, two decodes, b's one token
    per = st_["requests"]
    assert per[a]["ttft_steps"] == 3 and per[a]["new"] == 3 and per[a]["tpot_s"] > 0 and per[a]["ttft_s"] > 0
    assert per[b]["ttft_steps"] == 3 and per[b]["tpot_s"] is None  # admitted once a's prompt left room
    assert eng.step() == [] and eng.stats["steps"] == st_["steps"]  # nothing to do: no forward pass


def test_a_stop_id_ends_a_request_and_is_included():
    model = tiny_model()
    free_run = generate_alone(model, [3, 1, 4], 10)
    stop = free_run[4]
    eng = Engine(model, 8, 4)
    rid = eng.submit([3, 1, 4], 10, stop_ids=[stop])
    assert eng.run()[rid] == free_run[: free_run.index(stop) + 1]


def test_float32_in_float32_out_and_float64_stays_float64():
    for dtype in (np.float32, np.float64):
        eng = Engine(tiny_model(dtype=dtype), 8, 4)
        assert eng.pool.dtype == dtype
        seen = []

        def spy(*args, run=forward.run, seen=seen):
            seen.append(run(*args))
            return seen[-1]

        eng.submit([1, 2, 3], 3)
        with mock.patch.object(engine, "run", spy):
            eng.run()
        assert {logits.dtype for logits in seen} == {np.dtype(dtype)}
    assert TopLevelEngine is Engine


@pytest.mark.parametrize("call, error, words", [
    (lambda e: e.submit([], 3), ValueError, "ids is empty"),
    (lambda e: e.submit([1, 256], 3), ValueError, r"ids must lie in \[0, 256\)"),
    (lambda e: e.submit([1, -1], 3), ValueError, r"ids must lie in \[0, 256\)"),
    (lambda e: e.submit([1.5], 3), TypeError, "ids must hold integer token ids"),
    (lambda e: e.submit([1, 2], 0), ValueError, "max_new_tokens must be at least 1"),
    (lambda e: e.submit([1, 2], 2.0), TypeError, "max_new_tokens must be an integer"),
    (lambda e: e.submit([1, 2], 3, stop_ids=[999]), ValueError, r"stop_ids must lie in \[0, 256\)"),
    (lambda e: e.submit([1, 2], 3, stop_ids=2), TypeError, "stop_ids must be a sequence of token ids; got int"),
    (lambda e: e.submit([1, 2], 3, stop_ids=None), TypeError, "stop_ids must be a sequence of token ids"),
    (lambda e: e.submit(list(range(14)), 4), ValueError, "needs 5 blocks of 4 even alone; the pool has n_blocks=4"),
    (lambda e: e.submit([1] * 120, 9), ValueError, "exceed the context of 128 positions"),
])
def test_bad_requests_are_refused_before_anything_is_queued(call, error, words):
    eng = Engine(tiny_model(), 4, 4)
    with pytest.raises(error, match=words):
        call(eng)
    assert eng.done and eng.requests == {} and eng.pool.blocks_free == 4


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(preemption="drop"), ValueError, r"preemption must be one of \('recompute', 'swap'\); got preemption='drop'"),
    (dict(max_seqs=0), ValueError, "max_seqs must be at least 1"),
    (dict(max_seqs=32), ValueError, "max_seqs=32 sequences cannot all decode in a step of max_batch_tokens=16"),
    (dict(max_batch_tokens=0), ValueError, "max_batch_tokens must be at least 1"),
    (dict(prefix_caching=1), TypeError, "prefix_caching must be True or False"),
    (dict(n_blocks=0), ValueError, "n_blocks must be at least 1"),
    (dict(block_size=1.5), TypeError, "block_size must be an integer"),
])
def test_bad_engines_are_refused(kwargs, error, words):
    args = dict(n_blocks=4, block_size=4, max_batch_tokens=16, max_seqs=4) | kwargs
    with pytest.raises(error, match=words):
        Engine(tiny_model(), **args)
    with pytest.raises(TypeError, match="model must have .config and .weights"):
        Engine("SmolLM2", 4)


# ---- a trace, replayed


def test_replay_measures_the_engine_and_lesson_09s_batcher_on_one_trace():
    model = tiny_model(dtype=np.float32)
    arrivals = trace.poisson_arrivals(0.5, 6, seed=1)
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) > 0)
    assert np.array_equal(arrivals, trace.poisson_arrivals(0.5, 6, seed=1))
    rng = np.random.default_rng(0)
    requests = [(t, rng.integers(0, ENGINE_TINY.vocab, int(rng.integers(3, 20))).tolist(), 5) for t in arrivals]
    results = [trace.replay(Engine(model, 24, 4, max_batch_tokens=16), requests),
               trace.replay(batch.Batcher(ENGINE_TINY, model.weights, n_blocks=24, block_size=4), requests)]
    want = {i: generate_alone(model, ids, n) for i, (_, ids, n) in enumerate(requests)}
    for got in results:
        assert got.outputs == want and got.new.tolist() == [5] * 6
        assert np.all(got.submitted >= np.ceil(arrivals))  # at the first step boundary after the arrival
        assert np.all(got.first_step >= got.submitted) and np.all(got.last_step >= got.first_step)
        s = got.summary()
        assert 1 <= s["ttft_steps"][0] <= s["ttft_steps"][1] and s["tokens_per_step"] > 0
        assert s["wait_tokens"][1] <= got.wait_tokens.max() and np.all(got.ttft_s > 0)
        ran = ~np.isnan(got.step_tokens)
        assert np.nansum(got.step_tokens) == sum(len(ids) for _, ids, _ in requests) + 6 * 4  # prompts, then 4 decodes
        assert np.all(got.step_seconds[~ran] == 0)
    assert np.nanmax(results[0].step_tokens) <= 16 < np.nanmax(results[1].step_tokens)  # chunked vs whole prompts
    assert results[0].submitted.tolist() == np.ceil(arrivals).astype(int).tolist()  # one pass a step: no delay
    assert results[0].preemptions == 0 and results[1].preemptions is None
    assert len(results[1].step_tokens) > len(results[1].step_seconds[results[1].step_seconds > 0])  # two-pass steps
    timed = trace.replay(Engine(model, 24, 4, max_batch_tokens=16), [(t / 1e3, ids, n) for t, ids, n in requests],
                          clock="seconds")  # arrivals a millisecond apart: the clock jumps over idle gaps
    assert timed.outputs == want and np.all(~np.isnan(timed.step_tokens)) and np.all(timed.ttft_s > 0)
    with pytest.raises(ValueError, match="clock must be 'steps' or 'seconds'"):
        trace.replay(Engine(model, 24, 4), requests, clock="hours")


@pytest.mark.parametrize("bad, error, words", [
    ([], ValueError, "trace must be a non-empty list"),
    ("abc", ValueError, "trace must be a non-empty list"),
    ([(0, [1, 2], 3), (1, [1, 2])], ValueError, r"trace\[1\] must be \(arrival, prompt ids, max_new_tokens\)"),
    ([(0, [1, 2], 3), (float("nan"), [1, 2], 3)], ValueError, r"trace\[1\] arrival must be finite"),
    ([(0, [1, 2], 3), (1, [1, 999], 3)], ValueError, r"trace\[1\] ids must lie in \[0, 256\)"),
    ([(0, [1, 2], 3), (1, [1, 2], 0)], ValueError, "max_new_tokens must be at least 1"),
    ([(0, [1, 2], 3), (1, list(range(60)), 3)], ValueError, r"trace\[1\] ids: a prompt of 60 tokens"),
])
def test_replay_checks_every_request_before_the_first_runs(bad, error, words):
    """Issue 33: a bad request late in a trace was refused only after the earlier ones had run."""
    eng = Engine(tiny_model(), 12, 4)
    with pytest.raises(error, match=words):
        trace.replay(eng, bad)
    assert eng.requests == {} and eng.stats["steps"] == 0


# ---- SmolLM2, float32


@pytest.fixture(scope="module")
def chats(model):
    """Four chat prompts that share a system prompt of the shipped text (68 tokens in common), the end-of-turn id,
    and what generate gives each alone, cut after that id."""
    tok = model.tokenizer
    system = tok.decode(tok.encode(long_text())[:60])
    questions = ["Why do we sleep?", "What is a ferry?", "Say hello.", "Name a river."]
    prompts = [tok.encode(model.chat_prompt(q, system=system)) for q in questions]
    stops = tok.encode("<|im_end|>")
    want = [generate_alone(model, p, 8, stops) for p in prompts]
    return prompts, stops, want


@pytest.mark.parametrize("mode", engine.PREEMPTION)
def test_smollm2_through_the_engine_equals_generate_token_for_token(model, chats, mode):
    """Chunked prefill (a budget of 48 tokens), a shared system prompt found in the cache, a pool so small that
    requests are preempted, and a stop at <|im_end|>: every request gets exactly what generate gives it alone."""
    prompts, stops, want = chats
    longest = max(math.ceil((len(p) + 8 - 1) / 16) for p in prompts)
    eng = Engine(model, longest + 2, 16, max_batch_tokens=48, max_seqs=4, preemption=mode)
    rids = [eng.submit(p, 8, stop_ids=stops) for p in prompts]
    out = eng.run()
    st_ = eng.stats
    assert st_["preemptions"] >= 1 and st_["prefix_hit_tokens"] >= 3 * 48 and max(st_["step_tokens"]) <= 48
    assert [out[r] for r in rids] == want
    assert eng.pool.blocks_free == eng.pool.n_blocks and eng.pool.dtype == np.float32


@pytest.mark.slow
def test_the_engine_benchmark_runs_and_prints_its_table(model, monkeypatch, capsys):
    """`python scripts/bench_engine.py` in its smallest form: one rate, two requests of two tokens, one round."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_engine

    bench_engine.main(["--rates", "4", "--requests", "2", "--new", "2", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "gave every request the same tokens" in out and out.count("| 4 | (") == 4 and "| (a) lesson 09 |" in out
    sys.modules.pop("bench_engine", None)


# ---- aborts (lesson 16): between steps, any request, any state; the pool ends whole


@settings(max_examples=60)
@given(traces(), st.lists(st.tuples(st.integers(0, 12), st.integers(0, 5)), max_size=5))
def test_any_mix_of_aborts_leaves_the_pool_whole_and_the_rest_equal_alone(c, aborts):
    """Abort requests at random steps (waiting, prefilling, decoding, preempted, swapped out, done already): every
    other request still equals generate alone, an aborted one keeps a prefix of it, and every block comes back."""
    model = tiny_model(c["seed"])
    eng = Engine(model, c["n_blocks"], c["block_size"], c["budget"], c["max_seqs"], c["prefix_caching"],
                 c["preemption"])
    rids = [eng.submit(r["prompt"], r["new"]) for r in c["requests"]]
    when = {}
    for step, k in aborts:
        when.setdefault(step, []).append(rids[k % len(rids)])
    step = 0
    while not eng.done or step <= max(when, default=0):
        for rid in when.get(step, []):
            was_done = eng.requests[rid].done
            assert eng.abort(rid) == (not was_done)
            assert eng.abort(rid) is False  # twice: nothing more to do
            accounts(eng.pool)
        eng.step()
        step += 1
    aborted = {rid for rid in rids if eng.requests[rid].aborted}
    for rid, r in zip(rids, c["requests"], strict=True):
        want = generate_alone(model, r["prompt"], r["new"])
        got = eng.requests[rid].tokens
        assert got == want[: len(got)] if rid in aborted else got == want
    assert eng.pool.refs == [0] * eng.pool.n_blocks and eng.pool.blocks_free == eng.pool.n_blocks
    assert eng.stats["aborts"] == len(aborted)


def test_an_abort_of_an_unknown_rid_is_refused_by_name():
    eng = Engine(tiny_model(), 8, 4)
    with pytest.raises(ValueError, match="rid=3 was never submitted"):
        eng.abort(3)
    with pytest.raises(TypeError, match="rid must be an integer"):
        eng.abort("0")


def test_an_abort_returns_only_the_blocks_nobody_else_holds():
    """Two requests share a cached 8-token prefix (two blocks of 4): aborting one frees its own blocks only, and the
    other still equals generate alone."""
    model = tiny_model()
    eng = Engine(model, 16, 4)
    prefix = [7, 1, 8, 2, 8, 1, 8, 2]
    a = eng.submit(prefix + [3, 3], 6)
    eng.step()  # a's prompt is in, its two full prefix blocks published
    b = eng.submit(prefix + [4], 6)
    eng.step()
    held = {r: set(eng.pool.block_table(eng.requests[r].seq)) for r in (a, b)}
    assert len(held[a] & held[b]) == 2
    free = eng.pool.blocks_free
    assert eng.abort(a)
    assert eng.pool.blocks_free == free + len(held[a] - held[b])
    assert eng.run()[b] == generate_alone(model, prefix + [4], 6)


class LeakyAbort(Engine):
    """The bug: an abort that forgets the request's blocks (it leaves the queue, its sequence stays in the pool)."""

    def abort(self, rid):
        r = self.requests[rid]
        if r.done:
            return False
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        r.aborted = True
        return True


def test_an_abort_that_keeps_the_blocks_is_caught():
    c = dict(requests=[dict(prompt=[1, 2, 3, 4, 5], new=6), dict(prompt=[6, 7], new=6)], block_size=2, n_blocks=9,
             budget=8, max_seqs=2, preemption="recompute", prefix_caching=True, seed=0)
    with mock.patch.object(sys.modules[__name__], "Engine", LeakyAbort), pytest.raises(AssertionError):
        test_any_mix_of_aborts_leaves_the_pool_whole_and_the_rest_equal_alone.hypothesis.inner_test(c, [(2, 0)])
