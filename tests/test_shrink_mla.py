"""Multi-head latent attention: absorbed equals naive to float64 rounding, and naive equals a plain loop.

Both are run over random sizes and chunkings (empty chunks included), with and without the RoPE part (dr = 0).
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlesson.rope import apply_rope
from kvlesson.shrink import mla
from tests.reference import rope_one


@st.composite
def layers(draw):
    cfg = mla.MLAConfig(D=draw(st.integers(1, 10)), H=draw(st.integers(1, 4)), r=draw(st.integers(1, 8)),
                        dn=draw(st.integers(1, 6)), dr=draw(st.sampled_from([0, 2, 4])), dv=draw(st.integers(1, 6)),
                        rope_base=draw(st.sampled_from([100.0, 10000.0])))
    N = draw(st.integers(0, 12))
    cuts = sorted(draw(st.lists(st.integers(0, N), max_size=5)))
    return cfg, N, np.diff([0, *cuts, N]).tolist(), draw(st.integers(0, 2**32 - 1))


def run(fn, w, cfg, x, chunks, dtype=np.float64):
    cache, out, start = mla.LatentCache(cfg.r, cfg.dr, dtype), [], 0
    for T in chunks:
        out.append(fn(x[start:start + T], w, cfg, cache))
        start += T
    assert len(cache) == x.shape[0]
    return np.concatenate(out) if out else np.zeros((0, cfg.D)), cache


def loop_reference(x, w, cfg):
    """One full pass, head by head and query by query; RoPE from tests/reference.py (half-split pairs)."""
    N, H = x.shape[0], cfg.H
    c, kr = x @ w["W_dkv"], x @ w["W_kr"]  # [N, r], [N, dr]
    out = np.zeros((N, H * cfg.dv))
    for h in range(H):
        q = x @ w["Wq"][:, h * cfg.dn:(h + 1) * cfg.dn]
        qr = x @ w["Wq_rope"][:, h * cfg.dr:(h + 1) * cfg.dr]
        k = c @ w["W_uk"][:, h * cfg.dn:(h + 1) * cfg.dn]
        v = c @ w["W_uv"][:, h * cfg.dv:(h + 1) * cfg.dv]
        for p in range(N):
            qp = np.concatenate([q[p], rope_one(qr[p], p, cfg.rope_base, False) if cfg.dr else qr[p]])
            scores = []
            for j in range(p + 1):
                kj = np.concatenate([k[j], rope_one(kr[j], j, cfg.rope_base, False) if cfg.dr else kr[j]])
                scores.append(float(qp @ kj) / math.sqrt(cfg.dn + cfg.dr))
            e = np.exp(np.array(scores) - max(scores))
            out[p, h * cfg.dv:(h + 1) * cfg.dv] = (e / e.sum()) @ v[:p + 1]
    return out @ w["Wo"]


@given(layers())
def test_naive_equals_a_plain_loop(case):
    cfg, N, chunks, seed = case
    w = mla.random_weights(cfg, seed)
    x = np.random.default_rng(seed).standard_normal((N, cfg.D))
    got, _ = run(mla.naive, w, cfg, x, chunks)
    np.testing.assert_allclose(got, loop_reference(x, w, cfg), rtol=0, atol=1e-12)


@given(layers())
def test_absorbed_equals_naive_with_and_without_the_rope_part(case):
    cfg, N, chunks, seed = case
    w = mla.random_weights(cfg, seed)
    x = np.random.default_rng(seed).standard_normal((N, cfg.D))
    naive, c1 = run(mla.naive, w, cfg, x, chunks)
    absorbed, c2 = run(mla.absorbed, mla.absorb(w, cfg), cfg, x, [N])  # another chunking, on purpose
    np.testing.assert_allclose(absorbed, naive, rtol=0, atol=1e-12)
    np.testing.assert_allclose(c1.c, c2.c, rtol=0, atol=1e-12)  # both cache the same latents, nothing per head


@given(layers(), st.sampled_from([np.nan, np.inf, -np.inf]), st.data())
def test_a_later_tokens_bad_latent_never_reaches_an_earlier_query(case, bad, data):
    """Bug caught: p @ v multiplied a later token's weight 0 by its NaN latent (0 * NaN is NaN), so one NaN in the
    last token of a prefill turned every earlier query's output into NaN, in both forms. The queries before it must
    give what they give without it; the token itself gets what IEEE arithmetic gives."""
    cfg, N, chunks, seed = case
    N = max(N, 1)
    x = np.random.default_rng(seed).standard_normal((N, cfg.D))
    j = data.draw(st.integers(0, N - 1), label="poisoned token")
    poisoned = x.copy()
    poisoned[j, data.draw(st.integers(0, cfg.D - 1), label="channel")] = bad
    w = mla.random_weights(cfg, seed)
    for fn, weights in ((mla.naive, w), (mla.absorbed, mla.absorb(w, cfg))):
        want, _ = run(fn, weights, cfg, x, [N])
        with np.errstate(invalid="ignore", over="ignore"):  # the poisoned token's own row computes with inf or NaN
            got, _ = run(fn, weights, cfg, poisoned, [N])
        np.testing.assert_allclose(got[:j], want[:j], rtol=0, atol=1e-12)

def test_the_cache_holds_one_latent_and_one_rope_key_per_token():
    cfg = mla.MLAConfig(D=12, H=4, r=6, dn=5, dr=4, dv=3)
    x = np.random.default_rng(0).standard_normal((7, 12)).astype(np.float32)
    _, cache = run(mla.naive, mla.random_weights(cfg, 0, np.float32), cfg, x, [3, 4], np.float32)
    assert cache.c.shape == (7, 6) and cache.k_rope.shape == (7, 4)
    assert cache.nbytes == 7 * (6 + 4) * 4


def test_float32_stays_float32():
    cfg = mla.MLAConfig(D=12, H=4, r=6, dn=5, dr=4, dv=3)
    w = mla.random_weights(cfg, 0, np.float32)
    x = np.random.default_rng(0).standard_normal((5, 12)).astype(np.float32)
    a, _ = run(mla.naive, w, cfg, x, [5], np.float32)
    b, _ = run(mla.absorbed, mla.absorb(w, cfg), cfg, x, [2, 3], np.float32)
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)  # float32 sums in another order: about 1e-7 apart


def test_deepseek_v3_bytes_per_token():
    # 61 layers x (512 + 64) x 2 bytes; with every head's K (128 + 64) and V (128) it would be 128 x 320 per layer
    assert mla.bytes_per_token(mla.DEEPSEEK_V3) == 61 * 576 * 2 == 70_272
    assert mla.mha_bytes_per_token(mla.DEEPSEEK_V3) == 61 * 128 * 320 * 2 == 4_997_120
    assert mla.mha_bytes_per_token(mla.DEEPSEEK_V3, kv_heads=8) == 61 * 8 * 320 * 2


def rope_inside_the_head(x, w, cfg):
    """The design MLA avoids: no shared RoPE key; RoPE rotates each head's expanded key c @ W_uk_h instead.

    Returns naive scores [H, N, N] and the best an absorbed layer can do: rotate the latent-space query, which
    is all it has, at the query's position.
    """
    N, H = x.shape[0], cfg.H
    pos = np.arange(N)
    q = apply_rope((x @ w["Wq"]).reshape(N, H, cfg.dn).transpose(1, 0, 2), pos, cfg.rope_base)  # [H, N, dn]
    k = apply_rope(((x @ w["W_dkv"]) @ w["W_uk"]).reshape(N, H, cfg.dn).transpose(1, 0, 2), pos, cfg.rope_base)
    naive = q @ k.transpose(0, 2, 1)
    W_uk = w["W_uk"].reshape(cfg.r, H, cfg.dn).transpose(1, 2, 0)  # [H, dn, r]
    absorbed = (q @ W_uk) @ (x @ w["W_dkv"]).T  # the rotation of k never reaches the latents
    return naive, absorbed


def test_rope_on_the_expanded_keys_cannot_be_absorbed():
    """Why MLA carries position on a separate key: with RoPE inside each head's key, folding fails."""
    cfg = mla.MLAConfig(D=16, H=2, r=8, dn=6, dr=0, dv=4, rope_base=100.0)
    w = mla.random_weights(cfg, 3)
    x = np.random.default_rng(3).standard_normal((6, 16))
    naive, absorbed = rope_inside_the_head(x, w, cfg)
    assert not np.allclose(np.tril(naive), np.tril(absorbed), atol=1e-3)


@pytest.mark.parametrize("bad, words", [
    (np.ones((3, 5)), r"x must be \[T, D=4\]"),
    (np.ones(4), r"x must be \[T, D=4\]"),
])
def test_bad_input_is_named(bad, words):
    cfg = mla.MLAConfig(D=4, H=2, r=3, dn=2, dr=2, dv=2)
    with pytest.raises(ValueError, match=words):
        mla.naive(bad, mla.random_weights(cfg), cfg, mla.LatentCache(3, 2))
    with pytest.raises(ValueError, match="need c_new"):
        mla.LatentCache(3, 2).append(np.ones((2, 3)), np.ones((3, 2)))


def test_bad_weights_config_or_cache_are_named_and_the_cache_does_not_move():
    cfg = mla.MLAConfig(D=4, H=2, r=3, dn=2, dr=2, dv=2)
    w, x, cache = mla.random_weights(cfg), np.ones((2, 4)), mla.LatentCache(3, 2)
    with pytest.raises(ValueError, match=r"Wo must be \[4, 4\]"):
        mla.naive(x, {**w, "Wo": np.ones((4, 5))}, cfg, cache)
    with pytest.raises(ValueError, match="absorb"):
        mla.absorbed(x, w, cfg, cache)
    with pytest.raises(ValueError, match=r"LatentCache\(r=3, dr=2\)"):
        mla.naive(x, w, cfg, mla.LatentCache(3, 4))
    with pytest.raises(ValueError, match="holds float32 but x is float64"):
        mla.naive(x, w, cfg, mla.LatentCache(3, 2, np.float32))
    assert len(cache) == 0
    with pytest.raises(ValueError, match="dr must be even"):
        mla.MLAConfig(D=4, H=2, r=3, dn=2, dr=3, dv=2)
    with pytest.raises(ValueError, match="no kv_lora_rank"):
        mla.bytes_per_token({"num_hidden_layers": 2, "qk_rope_head_dim": 4})
    with pytest.raises(TypeError, match="num_hidden_layers"):
        mla.bytes_per_token({**mla.DEEPSEEK_V3, "num_hidden_layers": 61.5})


@pytest.mark.parametrize("b, error, words", [
    (-2, ValueError, "bytes_per_element must be finite and above 0"),
    (0, ValueError, "bytes_per_element must be finite and above 0"),
    (float("nan"), ValueError, "bytes_per_element must be finite and above 0"),
    ("2", TypeError, "bytes_per_element must be a real number"),
    (True, TypeError, "bytes_per_element must be a real number"),
])
def test_bytes_per_element_is_checked(b, error, words):
    """Issue 19: -2 gave -70,272 bytes and '2' a 35,136-character string."""
    for price in (mla.bytes_per_token, mla.mha_bytes_per_token):
        with pytest.raises(error, match=words):
            price(mla.DEEPSEEK_V3, b)


def test_a_number_may_take_a_fraction_of_a_byte():
    assert mla.bytes_per_token(mla.DEEPSEEK_V3, 0.5) == 61 * 576 / 2 == 17_568
    assert isinstance(mla.bytes_per_token(mla.DEEPSEEK_V3, 0.5), int)  # whole counts come back as int
    odd = {**mla.DEEPSEEK_V3, "num_hidden_layers": 3, "kv_lora_rank": 45, "qk_rope_head_dim": 8}
    assert mla.bytes_per_token(odd, 0.5) == 79.5


def test_absorbed_decode_is_cheaper_than_re_expanding_every_step():
    """DeepSeek-V3 at S cached tokens, by hand: re-expanding costs S x 512 x 128 x (128 + 128) multiply-adds to build
    K and V, then the attention itself; absorbed attention is multi-query over one 576-wide head."""
    for S in (1, 4096, 32768):
        flops = mla.decode_flops(mla.DEEPSEEK_V3, S)
        assert flops["expand"] == 2 * (S * 512 * 128 * 256 + S * 128 * 192 + S * 128 * 128)
        assert flops["absorbed"] == 2 * (S * 128 * 576 + S * 128 * 512 + 128 * 128 * 512 + 128 * 512 * 128)
    big = mla.decode_flops(mla.DEEPSEEK_V3, 32768)
    assert big["expand"] > 100 * big["absorbed"]
    with pytest.raises(ValueError, match="S must be at least 0"):
        mla.decode_flops(mla.DEEPSEEK_V3, -1)
