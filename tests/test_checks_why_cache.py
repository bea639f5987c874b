"""The lesson 02 checkers pass right answers and name each classic wrong one."""
import numpy as np
import pytest

from kvlesson.checks import check_flop_ratio, check_past_kv_drift, check_recompute_flops
from kvlesson.flops import flop_ratio, recompute_flops

# ------------------------------------------------------------------------------------- recompute FLOPs


def recompute_loop(N, prompt, generated):
    return sum(2 * N * (prompt + k) for k in range(1, generated + 1))


def recompute_gauss(N, prompt, generated):
    lo, hi = prompt + 1, prompt + generated
    return N * (lo + hi) * generated  # 2N x (count x mean of the ends), as a float-free int


@pytest.mark.parametrize("fn", [recompute_flops, recompute_loop, recompute_gauss,
                                lambda N, P, G: float(recompute_flops(N, P, G)),
                                lambda N, P, G: np.int64(recompute_flops(N, P, G))])
def test_recompute_passes(fn):
    v = check_recompute_flops(fn)
    assert v, v


RECOMPUTE_SLIPS = {
    "P .. P+G-1": lambda N, P, G: 2 * N * sum(range(P, P + G)),
    "range(a, b) stops before b": lambda N, P, G: 2 * N * sum(range(P + 1, P + G)),
    "summed from 1": lambda N, P, G: 2 * N * sum(range(1, P + G + 1)),
    "added the prefill": lambda N, P, G: recompute_flops(N, P, G) + 2 * N * P,
    "factor 2": lambda N, P, G: N * sum(range(P + 1, P + G + 1)),
    "multiply it by N": lambda N, P, G: 2 * sum(range(P + 1, P + G + 1)),
    "that is the cached cost": lambda N, P, G: 2 * N * G,
    "one forward pass over the final sequence": lambda N, P, G: 2 * N * (P + G),
    "not the final length": lambda N, P, G: 2 * N * G * (P + G),
}


@pytest.mark.parametrize("hint", list(RECOMPUTE_SLIPS))
def test_recompute_names_the_slip(hint):
    v = check_recompute_flops(RECOMPUTE_SLIPS[hint])
    assert not v
    assert hint in repr(v), repr(v)


def test_recompute_edge_cases_and_types():
    v = check_recompute_flops(lambda N, P, G: max(recompute_flops(N, P, G), 2 * N))  # wrong only when G = 0
    assert not v and "no decode steps" in repr(v)
    v = check_recompute_flops(lambda N, P, G: [recompute_flops(N, P, G)])
    assert not v and "one number" in repr(v)
    v = check_recompute_flops(lambda N, P, G: 1 / 0)
    assert not v and "ZeroDivisionError" in repr(v)
    v = check_recompute_flops(lambda N, P, G: recompute_flops(N, P, G) + 1)
    assert not v and "tiny case" in repr(v)


# ------------------------------------------------------------------------------------------ FLOP ratio


@pytest.mark.parametrize("fn", [lambda P, G: flop_ratio(P, G), lambda P, G: P + (G + 1) / 2,
                                lambda P, G: sum(range(P + 1, P + G + 1)) / G,
                                lambda P, G: np.float32(1) * 0 + np.float64(P + (G + 1) / 2)])
def test_ratio_passes(fn):
    v = check_flop_ratio(fn)
    assert v, v


RATIO_SLIPS = {
    "in the cached cost only": lambda P, G: recompute_flops(1, P, G) / (2 * G + 2 * P),
    "on both sides": lambda P, G: (recompute_flops(1, P, G) + 2 * P) / (2 * G + 2 * P),
    "in the recompute cost only": lambda P, G: (recompute_flops(1, P, G) + 2 * P) / (2 * G),
    "upside down": lambda P, G: 1 / flop_ratio(P, G),
    "off by one": lambda P, G: sum(range(P, P + G)) / G,
    "stops one step short": lambda P, G: sum(range(P + 1, P + G)) / G,
    "last step alone": lambda P, G: P + G,
    "use / rather than //": lambda P, G: sum(range(P + 1, P + G + 1)) // G,
    "keep the + 1": lambda P, G: P + G / 2,
}


@pytest.mark.parametrize("hint", list(RATIO_SLIPS))
def test_ratio_names_the_slip(hint):
    v = check_flop_ratio(RATIO_SLIPS[hint])
    assert not v
    assert hint in repr(v), repr(v)


def test_ratio_rejects_non_numbers():
    v = check_flop_ratio(lambda P, G: "1500.5")
    assert not v and "one number" in repr(v)


# ------------------------------------------------------------------------------------- past K/V drift


def drift_right(run, ids, n, layer=0):
    K1, V1 = run(ids[:n])[layer]
    K2, V2 = run(ids)[layer]
    return max(np.abs(K1 - K2[:, :n]).max(), np.abs(V1 - V2[:, :n]).max())


def drift_static_style(run, ids, n, layer=0):
    """Same experiment, written with a loop over both arrays."""
    short, long = run(ids[:n])[layer], run(ids)[layer]
    return float(max(np.max(np.abs(a - b[:, :n])) for a, b in zip(short, long, strict=True)))


@pytest.mark.parametrize("fn", [drift_right, drift_static_style])
def test_drift_passes(fn):
    v = check_past_kv_drift(fn)
    assert v, v


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


@pytest.mark.parametrize("fn, hint", [
    (drift_keys_only, "compare V as well"),
    (drift_values_only, "compare the keys as well"),
    (drift_signed, "absolute difference"),
    (drift_layer0, "whatever `layer` said"),
    (drift_mean, "not the mean"),
    (drift_wrong_axis, "axis 1"),
    (drift_bool, "not a bool"),
    (drift_always_zero, "sees no change"),
    (drift_whole_long_run, "sees no change"),
])
def test_drift_names_the_slip(fn, hint):
    v = check_past_kv_drift(fn)
    assert not v
    assert hint in repr(v), repr(v)


def stub(*args):
    raise NotImplementedError("your turn")


@pytest.mark.parametrize("checker", [check_recompute_flops, check_flop_ratio, check_past_kv_drift])
def test_student_copy_gets_the_plain_message(checker):
    v = checker(stub)
    assert not v
    assert "still raises NotImplementedError" in repr(v) and "replace the" in repr(v), repr(v)
