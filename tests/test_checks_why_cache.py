"""The lesson 02 checkers pass right answers and reject each wrong one, naming the slip where one explains it."""
import numpy as np
import pytest

from kvlesson.costs.flops import flop_ratio, recompute_flops
from kvlesson.teaching.checks import check_flop_ratio, check_past_kv_drift, check_recompute_flops

# ------------------------------------------------------------------------------------- recompute FLOPs


def recompute_loop(N, prompt, generated):
    return sum(2 * N * (prompt + k) for k in range(1, generated + 1))


def recompute_gauss(N, prompt, generated):
    lo, hi = prompt + 1, prompt + generated
    return N * (lo + hi) * generated  # 2N x (count x mean of the ends), as a float-free int


@pytest.mark.parametrize("fn", [recompute_flops, recompute_loop, recompute_gauss,
                                lambda N, P, G: float(recompute_flops(N, P, G)),
                                lambda N, P, G: 2.0 * N * (P + (G + 1) / 2) * G,
                                lambda N, P, G: np.int64(recompute_flops(N, P, G)),
                                lambda N, P, G: np.array(recompute_flops(N, P, G))])
def test_recompute_passes(fn):
    v = check_recompute_flops(fn)
    assert v, v


RECOMPUTE_WRONG = [  # (wrong answer, words its hint must contain)
    (lambda N, P, G: 2 * N * sum(range(P, P + G)), "P .. P+G-1"),
    (lambda N, P, G: 2 * N * sum(range(P + 1, P + G)), "range(a, b) stops before b"),
    (lambda N, P, G: 2 * N * sum(range(1, P + G + 1)), "summed from 1"),
    (lambda N, P, G: 2 * N * sum(range(1, G + 1)), "left the prompt out"),
    (lambda N, P, G: recompute_flops(N, P, G) + 2 * N * P, "added the prefill"),
    (lambda N, P, G: N * sum(range(P + 1, P + G + 1)), "factor 2"),
    (lambda N, P, G: 2 * sum(range(P + 1, P + G + 1)), "multiply it by N"),
    (lambda N, P, G: 2 * N * G, "that is the cached cost"),
    (lambda N, P, G: 2 * N * (P + G), "one forward pass over the final sequence"),
    (lambda N, P, G: 2 * N * G * (P + G), "not the final length"),
    (lambda N, P, G: np.float32(recompute_flops(N, P, G)), "float32"),  # right to 7 digits only
    (lambda N, P, G: max(recompute_flops(N, P, G), 2 * N), "no decode steps"),  # wrong only when G = 0
    (lambda N, P, G: recompute_flops(N, P, G) + 1, "tiny case"),
    (lambda N, P, G: [recompute_flops(N, P, G)], "expected a number"),
    (lambda N, P, G: f"{recompute_flops(N, P, G)}", "text that spells a number is not one"),
    (lambda N, P, G: 1 / 0, "ZeroDivisionError"),
    (lambda N, P, G: None, "return statement missing"),
]


@pytest.mark.parametrize("fn, words", RECOMPUTE_WRONG)
def test_recompute_rejects_each_wrong_answer_with_its_hint(fn, words):
    v = check_recompute_flops(fn)
    assert not v and not v.stub
    assert words in repr(v), repr(v)


# ------------------------------------------------------------------------------------------ FLOP ratio


def ratio_closed_form(prompt, generated, prefill=False):
    decode = prompt + (generated + 1) / 2  # the mean re-run length
    if not prefill:
        return decode
    return (prompt + generated * decode) / (prompt + generated)  # 2N x P more on both sides; N cancels


def ratio_from_sums(prompt, generated, prefill=False):
    extra = prompt if prefill else 0
    return (extra + sum(range(prompt + 1, prompt + generated + 1))) / (extra + generated)


@pytest.mark.parametrize("fn", [ratio_closed_form, ratio_from_sums,
                                lambda P, G, prefill=False: flop_ratio(P, G, prefill=prefill),
                                lambda P, G, prefill=False: np.float64(flop_ratio(P, G, prefill=prefill))])
def test_ratio_passes(fn):
    v = check_flop_ratio(fn)
    assert v, v


def _re(P, G, prefill=False):
    return recompute_flops(1, P, G, prefill=prefill)


def _ca(P, G, prefill=False):
    return 2 * G + (2 * P if prefill else 0)


def decode_only(P, G, prefill=False):
    return ratio_closed_form(P, G)


RATIO_WRONG = [  # (wrong answer, words its hint must contain)
    (lambda P, G, prefill=False: _re(P, G) / (_ca(P, G) + 2 * P), "with prefill=False to neither"),
    (lambda P, G, prefill=False: ratio_closed_form(P, G, True), "what prefill=True asks for"),
    (lambda P, G, prefill=False: (_re(P, G) + 2 * P) / _ca(P, G), "to both sides"),
    (lambda P, G, prefill=False: 1 / ratio_closed_form(P, G, prefill), "upside down"),
    (lambda P, G, prefill=False: sum(range(P, P + G)) / G, "so the lengths are P+1 .. P+G"),
    (lambda P, G, prefill=False: sum(range(P + 1, P + G)) / G, "stops one step short"),
    (lambda P, G, prefill=False: P + G, "last step alone"),
    (lambda P, G, prefill=False: sum(range(P + 1, P + G + 1)) // G, "use / rather than //"),
    (lambda P, G, prefill=False: P + G / 2, "keep the + 1"),
    (lambda P, G, prefill=False: (G + 1) / 2, "P + k tokens, not k"),
    (decode_only, "whatever prefill says"),
    (lambda P, G, prefill=False: _re(P, G) / _ca(P, G, prefill), "to both sides"),
    (lambda P, G, prefill=False: _re(P, G, prefill) / _ca(P, G), "to both sides"),
    (lambda P, G, prefill=False: (_re(P, G) + P * prefill) / (_ca(P, G) + P * prefill), "add 2P"),
    (lambda P, G: ratio_closed_form(P, G), "must be called prefill"),
    (lambda P, G, with_prefill=False: ratio_closed_form(P, G, with_prefill), "must be called prefill"),
    (lambda P, G, prefill: ratio_closed_form(P, G, prefill), "give prefill a default"),
    (lambda P, G, prefill=False: "1500.5", "text that spells a number is not one"),
    (lambda P, G, prefill=False: 1500.5, "expected 7.5"),  # the 1,000 + 1,000 answer, typed in
]


@pytest.mark.parametrize("fn, words", RATIO_WRONG)
def test_ratio_rejects_each_wrong_answer_with_its_hint(fn, words):
    v = check_flop_ratio(fn)
    assert not v and not v.stub
    assert words in repr(v), repr(v)


# ------------------------------------------------------------------------------------- past K/V drift


def drift_right(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:, :n]).max(), np.abs(V1 - V2[:, :n]).max())


def drift_loop(run, ids, n, layer=0):
    """Same experiment, written with a loop over both arrays."""
    short, long = run(ids[:n])[layer], run(ids)[layer]
    return float(max(np.max(np.abs(a - b[:, :n])) for a, b in zip(short, long, strict=True)))


def drift_long_first_float64(run, ids, n, layer=0):
    """The long run first, the differences in float64: rounding-level results may differ from the reference."""
    K2, V2 = (a.astype(np.float64) for a in run(ids)[layer])
    K1, V1 = (a.astype(np.float64) for a in run(ids[:n])[layer])
    return np.maximum(np.abs(K1 - K2[:, :n]).max(), np.abs(V1 - V2[:, :n]).max())


@pytest.mark.parametrize("fn", [drift_right, drift_loop, drift_long_first_float64])
def test_drift_passes(fn):
    v = check_past_kv_drift(fn)
    assert v, v


def test_drift_accepts_any_rounding_level_answer_for_the_causal_transformer():
    """A correct experiment whose float32 rounding differs from the reference's (6.9e-7, say) must pass."""
    def off_by_rounding(run, ids, n, layer=0):
        got = drift_right(run, ids, n, layer)
        return got if got > 1e-5 else 6.9e-7
    assert check_past_kv_drift(off_by_rounding)


def drift_keys_only(run, ids, n, layer=0):
    K1, _ = run(ids[:n])[layer]
    K2, _ = run(ids)[layer]
    return np.abs(K1 - K2[:, :n]).max()


def drift_values_only(run, ids, n, layer=0):
    _, V1 = run(ids[:n])[layer]
    _, V2 = run(ids)[layer]
    return np.abs(V1 - V2[:, :n]).max()


def drift_signed(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max((K1 - K2[:, :n]).max(), (V1 - V2[:, :n]).max())


def drift_layer0(run, ids, n, layer=0):
    return drift_right(run, ids, n, 0)


def drift_mean(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:, :n]).mean(), np.abs(V1 - V2[:, :n]).mean())


def drift_sum(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:, :n]).sum(), np.abs(V1 - V2[:, :n]).sum())


def drift_last_n(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:, -n:]).max(), np.abs(V1 - V2[:, -n:]).max())


def drift_wrong_axis(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:n]).max(), np.abs(V1 - V2[:n]).max())


def drift_bool(run, ids, n, layer=0):
    return bool(drift_right(run, ids, n, layer) == 0)


def drift_always_zero(run, ids, n, layer=0):
    return 0.0


def drift_whole_long_run(run, ids, n, layer=0):
    """Compares positions of the long run with themselves: can never see a change."""
    K2, V2 = run(ids)[layer]
    return max(np.abs(K2[:, :n] - K2[:, :n]).max(), np.abs(V2[:, :n] - V2[:, :n]).max())


def drift_no_layer_index(run, ids, n, layer=0):
    """Reads run(ids) as one (K, V) pair: K1 is then layer 0's pair, and indexing it like an array fails."""
    (K1, V1), (K2, V2) = run(ids[:n]), run(ids)
    return max(np.abs(K1 - K2[:, :n]).max(), np.abs(V1 - V2[:, :n]).max())


@pytest.mark.parametrize("fn, hint", [
    (drift_keys_only, "compare V as well"),
    (drift_values_only, "compare the keys as well"),
    (drift_signed, "absolute difference"),
    (drift_layer0, "whatever `layer` said"),
    (drift_mean, "not the mean"),
    (drift_sum, "not the sum"),
    (drift_last_n, "compare the first n positions"),
    (drift_wrong_axis, "axis 1"),
    (drift_bool, "not a bool"),
    (drift_always_zero, "sees no change"),
    (drift_whole_long_run, "sees no change"),
    (drift_no_layer_index, "one (K, V) pair per layer"),
    (lambda run, ids, n, layer=0: -drift_right(run, ids, n, layer), "never negative"),
    (lambda run, ids, n, layer=0: "0.0", "text that spells a number is not one"),
])
def test_drift_rejects_each_wrong_answer_with_its_hint(fn, hint):
    v = check_past_kv_drift(fn)
    assert not v and not v.stub
    assert hint in repr(v), repr(v)


def stub(*args, **kwargs):
    raise NotImplementedError("your turn")


@pytest.mark.parametrize("checker", [check_recompute_flops, check_flop_ratio, check_past_kv_drift])
def test_student_copy_gets_the_stub_verdict(checker):
    v = checker(stub)
    assert not v and v.stub
    assert "still raises NotImplementedError" in repr(v) and "replace the" in repr(v), repr(v)


@pytest.mark.parametrize("checker", [check_recompute_flops, check_flop_ratio, check_past_kv_drift])
def test_each_checker_passes_its_own_reference(checker):
    """Lessons fall back on `.reference` (through yours_or_ours) while an exercise is unsolved."""
    assert checker(checker.reference)
