"""H2O and SnapKV caches through kvlesson.step (layer.attend hands them the queries) equal one full pass that
applies their rule.

The reference is a loop over positions, heads and keys with its own RoPE and softmax (tests/reference.py): it
decides evictions token by token from the attention each key has received, so a chunked prefill that decided
otherwise (a whole chunk at once, or keys evicted before the queries that still see them) fails it.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson import StaticKVCache
from kvlesson.shrink.evict import H2OKVCache, ScoredKVCache, SnapKVCache
from tests import helpers
from tests.reference import attend_one, projections


def h2o_pass(x, Wq, Wk, Wv, H, Hkv, heavy, recent, rope_base=None, interleaved=False):
    """x [N, D] -> [N, H*d]: token by token, query p attends over the held keys and itself, every key it saw adds
    its weights (all heads) to what it has received, and then, over budget, the least-received leaves among all but
    the `recent` newest (of equals, the oldest)."""
    q, k, v = projections(x, Wq, Wk, Wv, H, Hkv, rope_base, interleaved)
    N, G = x.shape[0], H // Hkv
    held, received, out = [], {}, np.zeros((N, H * q.shape[2]))
    for p in range(N):
        seen = held + [p]
        received[p] = 0.0
        o, w = attend_one(q[:, p], k, v, seen, G)
        out[p] = o.reshape(-1)
        for column, j in enumerate(seen):
            received[j] += w[:, column].sum()
        held = seen
        if len(held) > heavy + recent:
            candidates = [j for j in held if j <= p - recent]
            gone = min(candidates, key=lambda j: (received[j], j))
            held = [j for j in held if j != gone]
    return out


def snapkv_pass(x, Wq, Wk, Wv, H, Hkv, prompt, keep, voters, pool, rope_base=None, interleaved=False):
    """x [N, D] -> [N, H*d]: the first `prompt` tokens attend causally; if there are more than `keep`, the last
    `voters` of them vote (weights summed over heads), the votes are averaged over `pool` neighbours (the edge value
    repeated past the ends), and the keep - voters best earlier positions stay with the window; later tokens attend
    over what stayed and every later token."""
    q, k, v = projections(x, Wq, Wk, Wv, H, Hkv, rope_base, interleaved)
    N, G = x.shape[0], H // Hkv
    out = np.zeros((N, H * q.shape[2]))
    votes = np.zeros(prompt)
    for p in range(prompt):  # the prompt: causal, and its last `voters` queries vote
        o, w = attend_one(q[:, p], k, v, list(range(p + 1)), G)
        out[p] = o.reshape(-1)
        if p >= prompt - voters:
            votes[: p + 1] += w.sum(axis=0)
    kept = list(range(prompt))
    if prompt > keep:
        early, half = votes[: prompt - voters], pool // 2
        smooth = [np.mean([early[min(max(i + o, 0), early.size - 1)] for o in range(-half, half + 1)])
                  for i in range(early.size)]
        best = sorted(range(early.size), key=lambda i: (-smooth[i], i))[: keep - voters]
        kept = sorted(best) + list(range(prompt - voters, prompt))
    for p in range(prompt, N):  # after it: what stayed, and every later token
        out[p] = attend_one(q[:, p], k, v, kept + list(range(prompt, p + 1)), G)[0].reshape(-1)
    return out


@st.composite
def cases(draw):
    Hkv, G, N = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(0, 18))
    cuts = sorted(draw(st.lists(st.integers(0, N), max_size=6)))
    return dict(H=Hkv * G, Hkv=Hkv, d=draw(st.sampled_from([2, 4])), D=draw(st.integers(1, 6)), N=N,
                chunks=np.diff([0, *cuts, N]).tolist(), heavy=draw(st.integers(0, 4)), recent=draw(st.integers(0, 4)),
                rope_base=draw(st.sampled_from([None, 100.0])), interleaved=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


def weights(c, dtype=np.float64):
    rng = np.random.default_rng(c["seed"])
    x = rng.standard_normal((c["N"], c["D"])) * 2  # larger scores: attention far from uniform, rankings clear
    W = [rng.standard_normal((c["D"], n * c["d"])) / np.sqrt(c["D"]) for n in (c["H"], c["Hkv"], c["Hkv"])]
    return [a.astype(dtype) for a in (x, *W)]


def run_chunks(c, cache, chunks=None, dtype=np.float64):
    return helpers.run_chunks(c, cache, dtype, weights=weights, chunks=chunks)


@given(cases())
def test_h2o_through_step_equals_one_pass_that_evicts_token_by_token(c):
    if c["heavy"] + c["recent"] == 0:
        c["recent"] = 1
    cache = H2OKVCache(c["Hkv"], c["d"], c["heavy"], c["recent"])
    got = run_chunks(c, cache)
    want = h2o_pass(*weights(c), c["H"], c["Hkv"], c["heavy"], c["recent"], c["rope_base"], c["interleaved"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert cache.held.size == min(c["N"], c["heavy"] + c["recent"])  # the budget, once the text exceeds it
    assert cache.nbytes == 2 * c["Hkv"] * cache.held.size * c["d"] * 8


@given(cases(), st.integers(1, 8), st.integers(1, 4), st.sampled_from([1, 3, 5]))
def test_snapkv_through_step_equals_one_pass_that_compresses_the_prompt(c, keep, voters, pool):
    voters = min(voters, keep)
    prompt = c["chunks"][0] if c["chunks"] else 0
    if prompt == 0:  # the first append that brings tokens is the prompt
        c["chunks"] = [c["N"]]
        prompt = c["N"]
    cache = SnapKVCache(c["Hkv"], c["d"], keep, voters, pool)
    got = run_chunks(c, cache)
    want = snapkv_pass(*weights(c), c["H"], c["Hkv"], prompt, keep, voters, pool, c["rope_base"], c["interleaved"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert cache.held.size == (min(prompt, keep) + c["N"] - prompt if prompt else 0)


def test_a_cache_that_keeps_everything_is_full_attention_and_records_the_weights():
    c = dict(H=4, Hkv=2, d=4, D=6, N=9, chunks=[4, 0, 5], heavy=0, recent=0, rope_base=100.0, interleaved=True,
             seed=1)
    cache = ScoredKVCache(2, 4)
    got = run_chunks(c, cache)
    np.testing.assert_allclose(got, h2o_pass(*weights(c), 4, 2, 9, 0, 100.0, True), rtol=0, atol=1e-12)
    assert cache.weights.shape == (4, 5, 9)  # the last append: 5 queries over the 9 keys it handed back
    np.testing.assert_allclose(cache.weights.sum(axis=-1), 1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache.received.sum(), 4 * 9, rtol=1e-12)  # every query hands out one unit per head


def test_float32_stays_float32_and_agrees():
    """In float32 the ranking could in principle flip on a near tie; this case has none (checked in float64), and
    float32 carries about 7 digits, so 1e-5 still flags any real bug."""
    c = dict(H=4, Hkv=2, d=4, D=6, N=14, chunks=[5, 9], heavy=2, recent=3, rope_base=100.0, interleaved=False,
             seed=4)
    for make in (lambda dtype: H2OKVCache(2, 4, 2, 3, dtype), lambda dtype: SnapKVCache(2, 4, 4, 2, 3, dtype)):
        a = run_chunks(c, make(np.float64))
        b = run_chunks(c, make(np.float32), dtype=np.float32)
        assert b.dtype == np.float32 and a.dtype == np.float64
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_h2o_keeps_what_attention_used_and_a_window_would_have_dropped():
    """One key that every query attends to (all its weight) stays in a cache of heavy=1, recent=2 for ever."""
    d = 2
    k = np.zeros((1, 10, d))
    k[0, 0] = [10.0, 0.0]  # every query q = (1, 0) scores it 10/sqrt(2): nearly all its weight
    q = np.tile(np.array([1.0, 0.0]), (1, 10, 1))
    v = np.arange(10.0)[None, :, None].repeat(d, axis=2)
    cache = H2OKVCache(1, d, heavy=1, recent=2)
    for p in range(10):
        cache.observe(q[:, p:p + 1])
        cache.append(k[:, p:p + 1], v[:, p:p + 1])
    assert cache.held.tolist() == [0, 8, 9]


def test_without_queries_an_append_is_refused_by_name_and_changes_nothing():
    cache = H2OKVCache(1, 2, 1, 1)
    with pytest.raises(ValueError, match="call observe"):
        cache.append(np.ones((1, 2, 2)), np.ones((1, 2, 2)))
    cache.observe(np.ones((2, 3, 2)))
    with pytest.raises(ValueError, match="queries of T=3 tokens"):
        cache.append(np.ones((1, 2, 2)), np.ones((1, 2, 2)))
    assert len(cache) == 0 and cache.held.size == 0
    for q, words in [(np.ones((3, 1, 2)), "multiple of Hkv"), (np.ones((2, 1, 3)), "d=2"),
                     (np.ones((1, 1, 2), np.float32), "cast explicitly"), (np.ones((1, 2), int), "floating")]:
        with pytest.raises((ValueError, TypeError), match=words):
            ScoredKVCache(2, 2).observe(q) if words == "multiple of Hkv" else cache.observe(q)


@pytest.mark.parametrize("make, error, words", [
    (lambda: H2OKVCache(1, 2, 0, 0), ValueError, "at least one position"),
    (lambda: H2OKVCache(1, 2, -1, 2), ValueError, "heavy must be at least 0"),
    (lambda: H2OKVCache(1, 2, 1.5, 2), TypeError, "heavy must be an integer"),
    (lambda: SnapKVCache(1, 2, 4, voters=5), ValueError, "voters <= keep"),
    (lambda: SnapKVCache(1, 2, 4, voters=2, pool=4), ValueError, "must be odd"),
    (lambda: SnapKVCache(1, 2, 0), ValueError, "keep must be at least 1"),
])
def test_bad_arguments_are_named(make, error, words):
    with pytest.raises(error, match=words):
        make()


def feed(cache, k, v, q, chunks, start=0):
    out = []
    for T in chunks:
        cache.observe(q[:, start:start + T])
        K, V = cache.append(k[:, start:start + T], v[:, start:start + T])
        out.append((K.copy(), V.copy(), cache.mask(T).copy()))
        start += T
    return out


@pytest.mark.parametrize("make", [lambda: ScoredKVCache(2, 4), lambda: H2OKVCache(2, 4, 3, 2),
                                  lambda: SnapKVCache(2, 4, 5, 2, 3)])
@given(st.integers(1, 8), st.integers(0, 12), st.integers(0, 6), st.lists(st.integers(0, 4), min_size=1, max_size=3),
       st.integers(0, 100))
def test_a_truncated_cache_equals_one_that_held_only_those_positions(make, first, more, back, after, seed):
    """Fed a prompt of `first` tokens and `more` after it in one append, then rolled back by `back`: either refused by
    name, or afterwards it hands back what a cache fed only the kept positions does (same prompt, same appends)."""
    N = first + more + sum(after)
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, 2, N, 4)) * 2
    q = rng.standard_normal((4, N, 4)) * 2
    cache = make()
    feed(cache, k, v, q, [first, more])
    n = max(first + more - back, 0)
    try:
        cache.truncate(n)
    except ValueError as e:
        assert "roll back only to position" in str(e) and len(cache) == first + more
        return
    fresh = make()
    feed(fresh, k, v, q, [min(first, n), n - min(first, n)])
    for (K, V, m), (K2, V2, m2) in zip(feed(cache, k, v, q, after, n), feed(fresh, k, v, q, after, n), strict=True):
        np.testing.assert_array_equal(K, K2)
        np.testing.assert_array_equal(V, V2)
        np.testing.assert_array_equal(m, m2)
    np.testing.assert_allclose(cache.received, fresh.received, rtol=0, atol=1e-12)


def test_a_compressed_prompt_cannot_be_rolled_back_into():
    cache = SnapKVCache(1, 2, 3, 1, 1)
    rng = np.random.default_rng(0)
    cache.observe(rng.standard_normal((1, 6, 2)))
    cache.append(*rng.standard_normal((2, 1, 6, 2)))
    assert cache.held.size == 3 and cache.votes.shape == (5,)
    with pytest.raises(ValueError, match="roll back only to position 6"):
        cache.truncate(5)


def test_every_cache_may_be_shown_the_queries_and_only_an_evicting_one_keeps_them():
    """observe(q) is part of the protocol: a plain cache ignores it (nothing moves), a scored one needs it."""
    q = np.ones((2, 3, 4))
    plain = StaticKVCache(1, 4, 8, np.float64)
    assert plain.observe(q) is None and len(plain) == 0
    scored = ScoredKVCache(1, 4)
    scored.observe(q)
    K, _ = scored.append(np.ones((1, 3, 4)), np.ones((1, 3, 4)))
    assert K.shape == (1, 3, 4) and scored.weights.shape == (2, 3, 3)
