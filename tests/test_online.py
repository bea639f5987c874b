"""online_attention and split_kv_attention equal kvlesson.attention, and never hold more than one block of scores;
finish and merge_partials give every row an answer; attention_backward gives the gradients.

The shapes cover GQA, windows, T = 0, T = S, blocks of 1, blocks longer than S or not dividing it, and more
splits than keys. The mutants at the end swap in the classic bugs of lesson 10 and watch these comparisons fail.
"""
import tracemalloc
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlesson.online
from kvlesson import attention, online_attention, split_kv_attention
from kvlesson.online import attention_backward, finish, merge_partials, online_update, partial_attention


@st.composite
def shapes(draw):
    Hkv, G = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    S = draw(st.integers(0, 40))
    T = draw(st.one_of(st.just(0), st.just(S), st.just(min(1, S)), st.integers(0, S)))
    return dict(H=Hkv * G, Hkv=Hkv, T=T, S=S, d=draw(st.sampled_from([1, 4, 8])),
                window=draw(st.one_of(st.none(), st.integers(1, S + 3))), seed=draw(st.integers(0, 2**32 - 1)))


def qkv(c, dtype=np.float64, scale=1.0):
    rng = np.random.default_rng(c["seed"])
    q = rng.standard_normal((c["H"], c["T"], c["d"])) * scale  # [H, T, d]
    k, v = rng.standard_normal((2, c["Hkv"], c["S"], c["d"]))  # [Hkv, S, d] each
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def blocks(S):
    """Block sizes that matter: 1, a few that do not divide S, exactly S, and longer than S."""
    return st.one_of(st.just(1), st.integers(2, max(2, S)), st.just(max(S, 1)), st.integers(S + 1, S + 50))


@given(shapes(), st.data())
def test_online_attention_equals_attention(c, data):
    block = data.draw(blocks(c["S"]))
    q, k, v = qkv(c)
    got = online_attention(q, k, v, block=block, window=c["window"])
    assert got.shape == q.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, attention(q, k, v, window=c["window"]), rtol=0, atol=1e-12)


@given(shapes(), st.data())
def test_split_kv_attention_equals_attention(c, data):
    splits = data.draw(st.one_of(st.integers(1, 6), st.integers(c["S"], c["S"] + 9).filter(lambda n: n > 0)))
    q, k, v = qkv(c)
    got = split_kv_attention(q, k, v, splits=splits, window=c["window"])
    assert got.shape == q.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, attention(q, k, v, window=c["window"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("fn, kw", [(online_attention, dict(block=5)), (split_kv_attention, dict(splits=3))])
def test_decode_over_a_long_cache(fn, kw):
    """One query (T = 1) over 1,000 keys with 4 query heads on 2 KV heads: the flash-decoding shape."""
    c = dict(H=4, Hkv=2, T=1, S=1000, d=16, window=None, seed=3)
    q, k, v = qkv(c)
    np.testing.assert_allclose(fn(q, k, v, **kw), attention(q, k, v), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fn(q, k, v, window=100, **kw), attention(q, k, v, window=100), rtol=0, atol=1e-12)


@given(shapes(), st.integers(1, 9))
def test_float32_stays_float32_and_finite_at_logits_of_1e4(c, n):
    """Queries scaled so that scores reach about 1e4: without the running max, exp would overflow at once.

    float32 carries about 7 digits. A score of 1e4 is known to within about 1e-3, and the softmax turns an
    error of e in the scores into a relative error of about e in the weights; against attention's own float32
    result the outputs (values of size ~1) agree to 1e-2, while any rescaling bug moves them by order 1."""
    c = {**c, "d": 8}
    q, k, v = qkv(c, np.float32, scale=1e4)  # scores q . k / sqrt(8) of about 1e4
    want = attention(q, k, v, window=c["window"])
    for got in (online_attention(q, k, v, block=n, window=c["window"]),
                split_kv_attention(q, k, v, splits=n, window=c["window"])):
        assert got.dtype == np.float32 and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)


@given(shapes(), st.integers(1, 9))
def test_float16_is_summed_in_float32_and_given_back_as_float16(c, n):
    """float16 scores overflow at 65,504 and its sums lose terms below 1/2048 of the total. Summing in float32
    and rounding once at the end, the result is the float64 one rounded to float16: within 2e-3 (about two
    float16 steps for values of size 1, plus the rounding of the inputs, carried through the weights)."""
    q, k, v = qkv(c, np.float16)
    want = attention(*(a.astype(np.float64) for a in (q, k, v)), window=c["window"])
    for got in (online_attention(q, k, v, block=n, window=c["window"]),
                split_kv_attention(q, k, v, splits=n, window=c["window"])):
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3, atol=1e-6)


def test_float16_inputs_whose_scores_overflow_float16_still_work():
    """q . k = 64 x 40 x 40 = 102,400 is beyond float16's 65,504; in float32 it is an ordinary number."""
    q, k, v = np.full((1, 1, 64), 40, np.float16), np.full((1, 3, 64), 40, np.float16), np.ones((1, 3, 64), np.float16)
    for got in (online_attention(q, k, v, block=2), split_kv_attention(q, k, v, splits=2)):
        assert got.dtype == np.float16 and np.array_equal(got, np.ones((1, 1, 64), np.float16))


# ---------------------------------------------------------------------------------- one block of scores at most

def test_online_attention_never_scores_more_than_one_block():
    seen = []

    def spy(m, l, o, s, v, **kw):
        seen.append(s.shape)
        return online_update(m, l, o, s, v, **kw)

    c = dict(H=4, Hkv=2, T=3, S=50, d=4, window=None, seed=0)
    with mock.patch.object(kvlesson.online, "online_update", spy):
        online_attention(*qkv(c), block=8)
    assert seen == [(2, 6, 8)] * 6 + [(2, 6, 2)]  # [Hkv, G*T, block], the last block the remainder


def test_a_window_skips_the_blocks_no_query_reaches():
    seen = []

    def spy(m, l, o, s, v, **kw):
        seen.append(s.shape[-1])
        return online_update(m, l, o, s, v, **kw)

    c = dict(H=2, Hkv=1, T=2, S=100, d=4, window=10, seed=0)
    with mock.patch.object(kvlesson.online, "online_update", spy):
        online_attention(*qkv(c), block=4, window=10)
    assert sum(seen) == 11  # the first query (at 98) sees 89..98, the second 90..99: keys 89..99


def test_split_kv_scores_one_split_at_a_time():
    seen = []

    def spy(m, l, o, s, v, **kw):
        seen.append(s.shape[-1])
        return online_update(m, l, o, s, v, **kw)

    c = dict(H=2, Hkv=1, T=1, S=10, d=4, window=None, seed=0)
    with mock.patch.object(kvlesson.online, "online_update", spy):
        split_kv_attention(*qkv(c), splits=4)
        split_kv_attention(*qkv(c), splits=25)  # 15 of the 25 splits are empty and skipped
    assert seen == [2, 3, 2, 3] + [1] * 10


def peak_bytes(fn, *args, **kwargs):
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_online_peak_memory_does_not_grow_with_S():
    """attention builds the [H, T, S] scores (here 4 x 8 x 8,192 float32 = 1 MiB, more with its temporaries);
    online_attention's peak is a few blocks of 64 keys, the same at 8,192 keys as at 1,024."""
    rng = np.random.default_rng(0)
    peaks = {}
    for S in (1024, 8192):
        q = rng.standard_normal((4, 8, 32)).astype(np.float32)
        k, v = rng.standard_normal((2, 2, S, 32)).astype(np.float32)
        peaks[S] = peak_bytes(online_attention, q, k, v, block=64), peak_bytes(attention, q, k, v)
    assert peaks[8192][1] > 4 * 8 * 8192 * 4  # attention holds the whole score array
    assert peaks[8192][0] < 4 * 8 * 8192 * 4 / 8
    assert abs(peaks[8192][0] - peaks[1024][0]) < 4096


# ------------------------------------------------------------------------------------------------ arguments

@pytest.mark.parametrize("fn, name", [(online_attention, "block"), (split_kv_attention, "splits")])
@pytest.mark.parametrize("value, error, words", [
    (0, ValueError, "must be at least 1; got {name}=0"),
    (2.5, TypeError, "{name} must be an integer; got {name}=2.5"),
    (True, TypeError, "{name} must be an integer, not a bool"),
    (None, TypeError, "{name} must be an integer"),
])
def test_block_and_splits_must_be_positive_integers(fn, name, value, error, words):
    q, k, v = qkv(dict(H=2, Hkv=1, T=2, S=5, d=4, seed=0))
    with pytest.raises(error, match=words.format(name=name)):
        fn(q, k, v, **{name: value})


@pytest.mark.parametrize("fn", [online_attention, split_kv_attention])
def test_the_checks_of_attention_apply(fn):
    q, k, v = qkv(dict(H=2, Hkv=1, T=2, S=5, d=4, seed=0))
    with pytest.raises(ValueError, match="more queries than keys"):
        fn(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="H=2 query heads must be a multiple of Hkv=3"):
        fn(q, np.zeros((3, 5, 4)), np.zeros((3, 5, 4)))
    with pytest.raises(ValueError, match="need one dtype"):
        fn(q.astype(np.float32), k, v)
    with pytest.raises(TypeError, match="window must be an integer"):
        fn(q, k, v, window=1.5)
    with pytest.raises(TypeError, match="k must hold floating-point numbers"):
        fn(q, k.astype(int), v)


@pytest.mark.parametrize("fn", [online_attention, split_kv_attention])
def test_inputs_are_left_alone(fn):
    q, k, v = qkv(dict(H=4, Hkv=2, T=3, S=9, d=4, seed=1))
    before = q.copy(), k.copy(), v.copy()
    fn(q, k, v)
    assert all(np.array_equal(a, b) for a, b in zip(before, (q, k, v), strict=True))


# ------------------------------------------------------------------------------------------------ the mutants

CASE = dict(H=4, Hkv=2, T=3, S=40, d=4, window=None, seed=5)


def differs(fn, **kw):
    """True when fn disagrees with attention on a case whose running max moves from block to block."""
    q, k, v = qkv(CASE)
    q = q * 3  # sharper scores, so that blocks differ in their max
    return not np.allclose(fn(q, k, v, **kw), attention(q, k, v), rtol=0, atol=1e-12)


def test_the_unmutated_functions_pass():
    assert not differs(online_attention, block=7)
    assert not differs(split_kv_attention, splits=5)


def no_rescale(m, l, o, s, v, visible=None):
    """Bug: the accumulator is never rescaled when the max moves."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    p = np.exp(s - np.where(np.isneginf(m_new), 0, m_new))
    return m_new, l + p.sum(axis=-1, keepdims=True), o + p @ v


def rescale_sum_only(m, l, o, s, v, visible=None):
    """Bug: the running sum l is rescaled, the output accumulator o is not."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isneginf(m_new), 0, m_new)
    p = np.exp(s - shift)
    return m_new, np.exp(m - shift) * l + p.sum(axis=-1, keepdims=True), o + p @ v


@pytest.mark.parametrize("bug", [no_rescale, rescale_sum_only])
def test_online_softmax_bugs_are_caught(bug):
    with mock.patch.object(kvlesson.online, "online_update", bug):
        assert differs(online_attention, block=7)


def test_the_rescaling_bugs_hide_when_the_first_block_holds_every_max():
    """Why the property test needs scores that rise along the keys: when no later block beats the first
    block's max, alpha is always 1 and the bugs compute the right answer."""
    q, k, v = np.ones((1, 1, 4)), np.linspace(1, 0, 12)[None, :, None] * np.ones((1, 12, 4)), qkv(CASE)[2][:1, :12]
    for bug in (no_rescale, rescale_sum_only):
        with mock.patch.object(kvlesson.online, "online_update", bug):
            np.testing.assert_allclose(online_attention(q, k, v, block=4), attention(q, k, v), rtol=0, atol=1e-12)


def test_averaging_the_splits_is_caught():
    def average(outs, lses):
        """Bug: each split's output counts the same, whatever share of the weight its keys hold."""
        return outs.mean(axis=0)

    with mock.patch.object(kvlesson.online, "merge_partials", lambda outs, lses: (average(outs, lses), lses.max(0))):
        assert differs(split_kv_attention, splits=5)


def test_merging_without_the_max_shift_overflows():
    outs, lses = np.ones((2, 1, 3)), np.array([[1000.0], [999.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(lses)[..., None]
        unshifted = (w * outs).sum(0) / w.sum(0)
    assert np.isnan(unshifted).all()
    out, lse = merge_partials(outs, lses)
    np.testing.assert_array_equal(out, np.ones((1, 3)))
    np.testing.assert_allclose(lse, [1000 + np.log1p(np.exp(-1.0))], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------ finishing, merging, rows that saw nothing

def visible_scores(q, k, window):
    """The whole [H, T, S] score array, -inf where masked."""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    s = np.einsum("htd,hsd->hts", q, k[np.arange(H) // (H // Hkv)]) / np.sqrt(d)  # [H, T, S]
    return np.where(kvlesson.causal_mask(T, S, window), s, -np.inf)


def lse_of_scores(q, k, window):
    """The log-sum-exp of each query row's visible scores: [H, T]."""
    s = visible_scores(q, k, window)
    top = s.max(axis=-1, keepdims=True)
    return top[..., 0] + np.log(np.exp(s - top).sum(axis=-1))


@given(shapes(), st.data())
def test_return_lse_is_the_log_sum_exp_of_the_visible_scores(c, data):
    block = data.draw(blocks(c["S"]))
    q, k, v = qkv(c)
    out, lse = online_attention(q, k, v, block=block, window=c["window"], return_lse=True)
    assert lse.shape == (c["H"], c["T"]) and lse.dtype == np.float64
    np.testing.assert_allclose(out, attention(q, k, v, window=c["window"]), rtol=0, atol=1e-12)
    if c["T"]:
        np.testing.assert_allclose(lse, lse_of_scores(q, k, c["window"]), rtol=0, atol=1e-12)


def test_finish_gives_a_row_that_saw_nothing_zero_and_minus_inf():
    m, l, o = np.array([[-np.inf], [2.0]]), np.array([[0.0], [4.0]]), np.array([[0.0, 0.0], [2.0, 6.0]])
    with np.errstate(all="raise"):  # no 0/0 and no log(0) on the way
        out, lse = finish(m, l, o)
    np.testing.assert_array_equal(out, [[0.0, 0.0], [0.5, 1.5]])
    np.testing.assert_array_equal(lse, [-np.inf, 2.0 + np.log(4.0)])
    out32, lse32 = finish(*(a.astype(np.float32) for a in (m, l, o)))
    assert out32.dtype == lse32.dtype == np.float32


def slices(c, bounds):
    """Each slice of the keys finished on its own -> (outs [n, Hkv, G*T, d], lses [n, Hkv, G*T]), and the whole."""
    q, k, v = qkv(c)
    G, T, S = c["H"] // c["Hkv"], c["T"], c["S"]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if a == b:  # an empty slice: the merge's identity
            parts.append((np.zeros((c["Hkv"], G * T, c["d"])), np.full((c["Hkv"], G * T), -np.inf)))
            continue
        out, lse = partial_attention(q, k[:, a:b], v[:, a:b], np.arange(S - T, S), np.arange(a, b), window=c["window"])
        parts.append((out.reshape(c["Hkv"], G * T, c["d"]), lse.reshape(c["Hkv"], G * T)))
    whole = attention(q, k, v, window=c["window"]).reshape(c["Hkv"], G * T, c["d"])
    return [o for o, _ in parts], [lse for _, lse in parts], whole


def tree(outs, lses, draw):
    """Merge the slices pairwise in a random tree (any neighbouring pair first), as a GPU reduction might."""
    items = list(zip(outs, lses, strict=True))
    while len(items) > 1:
        i = draw(st.integers(0, len(items) - 2))
        (o1, l1), (o2, l2) = items[i], items[i + 1]
        items[i : i + 2] = [merge_partials(np.stack([o1, o2]), np.stack([l1, l2]))]
    return items[0]


@given(shapes().filter(lambda c: c["T"] > 0), st.data())
def test_any_tree_of_pairwise_merges_equals_one_merge_and_attention(c, data):
    """Windows leave some rows with no key in one slice, or in several slices in a row: those slices are (0, -inf),
    the merge's identity, wherever the tree meets them."""
    cuts = sorted(data.draw(st.lists(st.integers(0, c["S"]), min_size=1, max_size=6)))
    outs, lses, whole = slices(c, [0, *cuts, c["S"]])
    with np.errstate(all="raise"):
        out, lse = tree(outs, lses, data.draw)
        once, lse_once = merge_partials(np.stack(outs), np.stack(lses))
    np.testing.assert_allclose(out, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(once, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, lse_once, rtol=0, atol=1e-12)


def test_a_row_that_no_slice_saw_merges_to_zero_and_minus_inf():
    outs = np.zeros((3, 2, 4))
    outs[:, 1] = np.arange(12.0).reshape(3, 4)
    lses = np.array([[-np.inf, 0.0], [-np.inf, 1.0], [-np.inf, -2.0]])  # row 0 saw nothing in any of 3 slices
    with np.errstate(all="raise"):
        out, lse = merge_partials(outs, lses)
    np.testing.assert_array_equal(out[0], np.zeros(4))
    assert lse[0] == -np.inf and np.isfinite(out).all()
    np.testing.assert_allclose(lse[1], np.log(np.exp(lses[:, 1]).sum()), rtol=0, atol=1e-12)
    assert merge_partials(outs.astype(np.float32), lses.astype(np.float32))[0].dtype == np.float32


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fn, kw", [(online_attention, dict(block=4)), (split_kv_attention, dict(splits=3))])
def test_a_masked_key_whose_value_is_not_finite_reaches_no_output(fn, kw, poison):
    """Bug caught: p @ v multiplies a masked key's weight 0 by its value, and 0 * inf is nan. Key 5's value is
    poisoned; a window of 3 hides it from every query past position 7, and the causal mask from those before 5,
    yet each block of keys that holds it also serves queries that see it."""
    c = dict(H=2, Hkv=1, T=8, S=12, d=4, seed=9)
    q, k, v = qkv(c)
    bad_k, bad_v = k.copy(), v.copy()
    bad_v[:, 5], bad_k[:, 5] = poison, poison
    want = attention(q, k, v, window=3)
    with np.errstate(invalid="ignore", over="ignore"):
        got = fn(q, bad_k, bad_v, window=3, **kw)
    sees = [i for i in range(8) if 12 - 8 + i - 3 < 5 <= 12 - 8 + i]  # the queries whose window holds key 5
    hidden = [i for i in range(8) if i not in sees]
    assert sees and hidden
    np.testing.assert_allclose(got[:, hidden], want[:, hidden], rtol=0, atol=1e-12)



@st.composite
def poisoned(draw):
    """q, k, v of random shapes, float64 or float32, with NaN, inf or -inf planted in a few numbers of each (keys
    some queries see and keys they do not), and a window."""
    c = draw(shapes().filter(lambda c: c["T"] > 0))
    q, k, v = qkv(c, draw(st.sampled_from([np.float64, np.float32])))
    for a in (q, k, v):
        for _ in range(draw(st.integers(0, 3))):
            a[tuple(draw(st.integers(0, n - 1)) for n in a.shape)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return c, q, k, v


def assert_same_ieee(got, want, atol):
    """Equal where attention is finite; nan, inf and -inf exactly where attention has them."""
    for kind in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(kind(got), kind(want), err_msg=kind.__name__)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=atol)


@given(poisoned(), st.data())
def test_nan_and_inf_give_what_attention_gives(case, data):
    """Bug caught: finish tested l > 0, which is False for nan, so a row whose query or seen key held nan came out 0
    where attention gives nan; merge_partials took a nan lse for a slice that saw nothing; and a row whose every
    score was -inf came out 0 where attention's softmax is 0 / 0. A key a query does not see still never reaches it."""
    c, q, k, v = case
    want = attention(q, k, v, window=c["window"])
    block = data.draw(blocks(c["S"]))
    splits = data.draw(st.integers(1, c["S"] + 2))
    atol = 1e-12 if q.dtype == np.float64 else 1e-5
    for got in (online_attention(q, k, v, block=block, window=c["window"]),
                split_kv_attention(q, k, v, splits=splits, window=c["window"])):
        assert got.dtype == q.dtype
        assert_same_ieee(got, want, atol)


def test_a_nan_query_or_seen_key_is_nan_not_zero():
    """The issue's reproduction: row 1's query holds nan; then key 1, which queries 1 and 2 see, holds nan."""
    c = dict(H=2, Hkv=1, T=3, S=5, d=4, seed=0)
    q, k, v = qkv(c)
    q[0, 1, 0] = np.nan
    for fn, kw in ((online_attention, dict(block=2)), (split_kv_attention, dict(splits=2))):
        assert np.isnan(fn(q, k, v, **kw)[0, 1]).all() and np.isfinite(fn(q, k, v, **kw)[:, [0, 2]]).all()
    q[0, 1, 0], k[0, 1, 2] = 0.0, np.nan
    for fn, kw in ((online_attention, dict(block=2)), (split_kv_attention, dict(splits=2))):
        assert np.isnan(fn(q, k, v, **kw)).all()  # every query sits at position 2 or later and sees key 1

# ----------------------------------------------------------------------------------------- the backward pass

def loss_and_grads(c, block):
    q, k, v = qkv(c)
    w = np.random.default_rng(c["seed"] + 1).standard_normal(q.shape)  # loss = sum(w * out): d_out = w

    def loss(q, k, v):
        return float((w * attention(q, k, v, window=c["window"])).sum())

    out, lse = online_attention(q, k, v, block=block, window=c["window"], return_lse=True)
    return (q, k, v), loss, attention_backward(q, k, v, out, lse, w, block=block, window=c["window"])


def numeric_grad(loss, arrays, i, eps=1e-6):
    """Central differences of loss with respect to arrays[i], one entry at a time."""
    g = np.zeros_like(arrays[i])
    for idx in np.ndindex(g.shape):
        up, down = [a.copy() for a in arrays], [a.copy() for a in arrays]
        up[i][idx] += eps
        down[i][idx] -= eps
        g[idx] = (loss(*up) - loss(*down)) / (2 * eps)
    return g


@pytest.mark.parametrize("c, block", [
    (dict(H=4, Hkv=2, T=3, S=7, d=4, window=None, seed=1), 3),
    (dict(H=2, Hkv=2, T=5, S=5, d=2, window=2, seed=2), 2),
    (dict(H=3, Hkv=1, T=1, S=6, d=3, window=None, seed=3), 10),
])
def test_the_backward_pass_equals_finite_differences(c, block):
    arrays, loss, grads = loss_and_grads(c, block)
    for i, g in enumerate(grads):
        assert g.shape == arrays[i].shape
        np.testing.assert_allclose(g, numeric_grad(loss, arrays, i), rtol=0, atol=1e-7)


@given(shapes(), st.data())
def test_the_backward_pass_does_not_depend_on_the_block(c, data):
    """Each block recomputes its own weights from the lse; none needs another block's."""
    _, _, one = loss_and_grads(c, max(c["S"], 1))
    _, _, many = loss_and_grads(c, data.draw(blocks(c["S"])))
    for a, b in zip(one, many, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_the_backward_pass_keeps_float32():
    c = dict(H=2, Hkv=1, T=4, S=6, d=4, window=None, seed=4)
    q, k, v = qkv(c, np.float32)
    out, lse = online_attention(q, k, v, return_lse=True)
    assert lse.dtype == np.float32
    grads = attention_backward(q, k, v, out, lse, np.ones_like(out))
    assert all(g.dtype == np.float32 for g in grads)


def test_the_backward_pass_needs_the_lse_not_the_max():
    """The failure the lse avoids: weights recomputed as exp(score - m) alone are l times too large."""
    c = dict(H=1, Hkv=1, T=3, S=5, d=4, window=None, seed=5)
    q, k, v = qkv(c)
    out, lse = online_attention(q, k, v, return_lse=True)
    right = attention_backward(q, k, v, out, lse, np.ones_like(out))
    m = visible_scores(q, k, None).max(axis=-1)  # [H, T]: the running max at the end, without log(l)
    wrong = attention_backward(q, k, v, out, m, np.ones_like(out))
    assert not np.allclose(wrong[2], right[2], rtol=0, atol=1e-3)


@pytest.mark.parametrize("name, shape", [("out", (2, 4, 3)), ("lse", (2, 4, 1)), ("d_out", (1, 4, 4))])
def test_the_backward_pass_checks_its_shapes(name, shape):
    c = dict(H=2, Hkv=1, T=4, S=6, d=4, window=None, seed=6)
    q, k, v = qkv(c)
    out, lse = online_attention(q, k, v, return_lse=True)
    args = dict(out=out, lse=lse, d_out=np.ones_like(out))
    args[name] = np.zeros(shape)
    with pytest.raises(ValueError, match=r"need out and d_out like q"):
        attention_backward(q, k, v, args["out"], args["lse"], args["d_out"])


@given(shapes().filter(lambda c: c["T"] > 0), st.data())
def test_partial_attention_over_shuffled_blocks_merges_to_attention(c, data):
    """Queries and keys at positions in any order, the keys cut into blocks: each block's partial, merged, is attention
    over all the keys. The mask comes from the positions, not from T and S: a block far from the first keys still
    masks by where its keys sit."""
    q, k, v = qkv(c)
    T, S = c["T"], c["S"]
    order = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).permutation(S)  # keys in any order
    cuts = sorted(data.draw(st.lists(st.integers(1, S), max_size=4))) if S > 1 else []
    blocks = [b for b in np.split(order, cuts) if len(b)]
    pos_q = np.arange(S - T, S)
    parts = [partial_attention(q, k[:, b], v[:, b], pos_q, b, window=c["window"]) for b in blocks]
    out, _ = merge_partials(np.stack([o for o, _ in parts]), np.stack([lse for _, lse in parts]))
    np.testing.assert_allclose(out, attention(q, k, v, window=c["window"]), atol=1e-12)


def test_partial_attention_masks_by_position_not_by_index():
    """The ring's bug in one block: keys 4..7 against queries 4..7 by position is lesson 04's diagonal block; by index
    from 0 it would be the same here, but keys 0..3 against queries 4..7 are all visible, and keys 8..11 none."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 4, 8)), rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 4, 8))
    pos_q = np.arange(4, 8)
    _, lse_past = partial_attention(q, k, v, pos_q, np.arange(0, 4))
    _, lse_future = partial_attention(q, k, v, pos_q, np.arange(8, 12))
    assert np.isfinite(lse_past).all() and np.isneginf(lse_future).all()
    out, _ = partial_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), pos_q, pos_q)
    assert out.dtype == np.float32


@pytest.mark.parametrize("pos_q, pos_k, words", [
    (np.arange(3), np.arange(4), "pos_q must be 4 integer positions"),
    (np.arange(4), np.arange(3.0), "pos_k must be 4 integer positions"),
    (np.arange(4), np.arange(-1, 3), "at least 0"),
])
def test_partial_attention_refuses_positions_that_do_not_fit(pos_q, pos_k, words):
    q, k = np.zeros((2, 4, 8)), np.zeros((1, 4, 8))
    with pytest.raises(ValueError, match=words):
        partial_attention(q, k, k, pos_q, pos_k)
