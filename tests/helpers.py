"""Helpers the test files share: the random layers every cache path is checked on, the paged-pool referee, a buggy
reserve. One place for each, so that no test file calls into another's tests."""
import numpy as np
from hypothesis import strategies as st

from kvlesson import KVCache, StaticKVCache, WindowKVCache, step
from kvlesson import model as kvmodel
from kvlesson.serving import batch
from kvlesson.serving.padding import pad_left, padded_step
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


def run_chunks(c, cache, dtype=np.float64):
    x, Wq, Wk, Wv = weights(c, dtype)
    out, start = [], 0
    for T in c["chunks"]:
        out.append(step(x[start:start + T], Wq, Wk, Wv, cache, c["H"], c["Hkv"], window=c["window"],
                        rope_base=c["rope_base"], interleaved=c["interleaved"]))
        start += T
    assert len(cache) == c["N"]
    return np.concatenate(out)  # [N, H*d]


def reference(c):
    x, Wq, Wk, Wv = weights(c)
    return full_pass(x, Wq, Wk, Wv, c["H"], c["Hkv"], c["window"], c["rope_base"], c["interleaved"])


def caches(c, dtype=np.float64):
    yield KVCache(c["Hkv"], c["d"], dtype)
    yield StaticKVCache(c["Hkv"], c["d"], c["N"] + 3, dtype)
    if c["window"] is not None:
        yield WindowKVCache(c["Hkv"], c["d"], c["window"], dtype)


# ---- the paged pool against one KVCache per sequence (test_paged, and the mutants it must catch)


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


# ---- batched serving against each sequence alone (test_batch, and the mutants it must catch)

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
    pool = batch.model_pool(TINY, 64, c["block_size"], np.float64)
    alone = {}  # sequence -> its own KVCache list, fed the same tokens through model.forward
    seqs, tokens = [], []
    for p in c["prompts"]:
        s = pool.new_sequence()
        mine = batch.prefill_step(TINY, w, pool, [s], [p])[0]
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
    logits = batch.decode_step(TINY, w, pool, seqs, tokens)  # [B, vocab]
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
    pool = batch.model_pool(TINY, 200, c["block_size"], np.float64)
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
        got = batch.run(TINY, w, pool, seqs, new)  # [B', vocab]: sequences that brought tokens, in order
        want = [kvmodel.forward(TINY, w, ids, alone[s])[-1] for s, ids in zip(seqs, new, strict=True) if ids]
        assert got.shape == (len(want), TINY.vocab)
        for row, ref in zip(got, want, strict=True):
            np.testing.assert_allclose(row, ref, rtol=0, atol=1e-12)
        assert [pool.length(s) for s in seqs] == [len(alone[s][0]) for s in seqs]


# ---- a left-padded batch against each sequence alone (test_padding, and its mutants)


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
