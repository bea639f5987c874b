"""The lesson 06 checkers pass right answers and reject each wrong one with its own hint.

Junk answers (None, text, ragged lists, functions that raise) are fuzzed for every checker in
test_checks_junk.py.
"""
import numpy as np
import pytest

from kvlesson import apply_rope
from kvlesson.teaching.checks import check_decode_positions, check_rope, check_to_interleaved

# ---------------------------------------------------------------------------------------------- rope


def rope_with(pairs="half", sign=1, exponent=lambda m, d: -2 * m / d, table_dtype=None, local=False,
              base_override=None, in_place=False, angle_dtype=np.float64, shift=0, swap=False, only_first=False):
    """A half-split RoPE with one knob per classic mistake."""
    def rope(x, positions, base):
        d, T = x.shape[-1], x.shape[-2]
        pos = np.arange(T) if local else np.asarray(positions) + shift
        b = base if base_override is None else base_override
        at = x.dtype if angle_dtype == "x" else angle_dtype
        freq = (b ** exponent(np.arange(d // 2), d)).astype(at)  # [d/2]
        theta = pos.astype(at)[:, None] * freq  # [T, d/2]
        dt = table_dtype or x.dtype
        cos, sin = np.cos(theta).astype(dt), np.sin(theta).astype(dt)
        idx1, idx2 = (np.arange(0, d, 2), np.arange(1, d, 2)) if pairs == "interleaved" else (
            np.arange(d // 2), np.arange(d // 2, d))
        x1, x2 = x[..., idx1], x[..., idx2]
        out = x if in_place else np.empty(x.shape, np.result_type(x, cos))
        r1, r2 = x1 * cos - sign * x2 * sin, sign * x1 * sin + x2 * cos
        if swap:
            r1, r2 = r2, r1
        out[..., idx1] = r1
        out[..., idx2] = x2 if only_first else r2
        return out
    return rope


def rope_concatenate(x, positions, base):
    d = x.shape[-1]
    theta = np.asarray(positions, np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)  # [T, d/2]
    cos, sin = np.cos(theta).astype(x.dtype), np.sin(theta).astype(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def rope_three_axes_only(x, positions, base):
    """Indexes x[:, :, :d//2]: right for [H, T, d], a crash for [T, d]."""
    d = x.shape[-1]
    theta = np.asarray(positions, np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta).astype(x.dtype), np.sin(theta).astype(x.dtype)
    x1, x2 = x[:, :, : d // 2], x[:, :, d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def test_rope_passes_right_answers():
    for fn in (lambda x, p, b: apply_rope(x, p, b), rope_with(), rope_concatenate):
        verdict = check_rope(fn)
        assert verdict, verdict.message


ROPE_WRONG = [
    ("interleaved pairs", rope_with(pairs="interleaved"), ["interleaved convention"]),
    ("sign", rope_with(sign=-1), ["sign error"]),
    ("exponent m/d", rope_with(exponent=lambda m, d: -m / d), ["frequency ladder"]),
    ("exponent without minus", rope_with(exponent=lambda m, d: 2 * m / d), ["frequency ladder"]),
    ("float64 tables", rope_with(table_dtype=np.float64), ["at positions 100..104", "cast the tables"]),
    ("angles in x.dtype", rope_with(angle_dtype="x"), ["positions 50,000..50,002", "about 0.004 apart",
                                                        "angles in float64"]),
    ("angles always float32", rope_with(angle_dtype=np.float32), ["x [T=6, d=4]", "not float64-exact"]),
    ("local positions", rope_with(local=True), ["positions 7, 8, 9", "local index"]),
    ("one position late", rope_with(shift=1), ["one position too far"]),
    ("base ignored", rope_with(base_override=10000.0), ["base 100000", "use the base argument"]),
    ("halves swapped", rope_with(swap=True), ["halves come back swapped"]),
    ("second half kept", rope_with(only_first=True), ["only the first half was rotated"]),
    ("in place", rope_with(in_place=True), ["changed x in place"]),
    ("three axes only", rope_three_axes_only, ["x [T=6, d=4]", "raised IndexError", "x[..., :d//2]"]),
    ("nothing rotated", lambda x, p, b: x.copy(), ["nothing was rotated"]),
    ("no return", lambda x, p, b: None, ["returned None"]),
    ("wrong shape", lambda x, p, b: x[..., :2], ["has shape"]),
    ("crash", lambda x, p, b: 1 / 0, ["ZeroDivisionError"]),
]


@pytest.mark.parametrize("fn, words", [r[1:] for r in ROPE_WRONG], ids=[r[0] for r in ROPE_WRONG])
def test_rope_rejects_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_rope(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_float32_angles_are_wrong_by_thousandths_at_position_50000():
    """The trap the checker tests for, measured: float32 angles miss by far more than float32 rounding."""
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    p = np.arange(50_000, 50_003)
    err = np.abs(rope_with(angle_dtype="x")(x, p, 10000.0) - apply_rope(x, p)).max()
    assert 1e-3 < err < 0.05
    assert np.abs(rope_with()(x, p, 10000.0) - apply_rope(x, p)).max() < 1e-5


# ---------------------------------------------------------------------------------------------- positions


POSITIONS_WRONG = [
    ("local indices", lambda n, T: np.arange(T), ["len_cache=5, T=1", "local indices"]),
    ("last cached", lambda n, T: np.arange(n - T, n), ["last T cached tokens"]),
    ("one late", lambda n, T: np.arange(n + 1, n + T + 1), ["off by one"]),
    ("T as the start", lambda n, T: np.arange(T, 2 * T), ["len_cache=0, T=6", "not at T"]),
    ("every position", lambda n, T: np.arange(n + T), ["the T new tokens only"]),
    ("float", lambda n, T: np.arange(n, n + T, dtype=float), ["float64 positions", "integer"]),
    ("scalar for one token", lambda n, T: n if T == 1 else np.arange(n, n + T), ["shape ()", "even when T = 1"]),
    ("doubled", lambda n, T: np.arange(n, n + T) * 2, ["len_cache, len_cache + 1"]),
]


def test_decode_positions_passes_right_answers():
    for fn in (lambda n, T: np.arange(n, n + T), lambda n, T: [n + i for i in range(T)],
               lambda n, T: range(n, n + T)):
        assert check_decode_positions(fn)


@pytest.mark.parametrize("fn, words", [r[1:] for r in POSITIONS_WRONG], ids=[r[0] for r in POSITIONS_WRONG])
def test_decode_positions_rejects_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_decode_positions(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


# ---------------------------------------------------------------------------------------------- converter


def to_interleaved(W, n_heads):
    D, width = W.shape
    d = width // n_heads
    return W.reshape(D, n_heads, 2, d // 2).swapaxes(2, 3).reshape(D, width)


def inverse(W, n_heads):
    D, width = W.shape
    d = width // n_heads
    return W.reshape(D, n_heads, d // 2, 2).swapaxes(2, 3).reshape(D, width)


def pairs_swapped(W, n_heads):
    D, width = W.shape
    d = width // n_heads
    return W.reshape(D, n_heads, 2, d // 2)[:, :, ::-1].swapaxes(2, 3).reshape(D, width)


def in_place(W, n_heads):
    W[:] = to_interleaved(W, n_heads)
    return W


CONVERTER_WRONG = [
    ("unchanged", lambda W, n: W.copy(), ["columns are unchanged"]),
    ("inverse", inverse, ["the other way"]),
    ("one wide head", lambda W, n: to_interleaved(W, 1), ["all heads as one wide head"]),
    ("rows", lambda W, n: to_interleaved(W.T, n).T, ["reordered the rows"]),
    ("pairs swapped", pairs_swapped, ["second half first"]),
    ("float64", lambda W, n: to_interleaved(W, n).astype(np.float64), ["float32 W", "same dtype"]),
    ("in place", in_place, ["changed W in place"]),
]


def test_to_interleaved_passes_the_right_answer():
    assert check_to_interleaved(to_interleaved)


@pytest.mark.parametrize("fn, words", [r[1:] for r in CONVERTER_WRONG], ids=[r[0] for r in CONVERTER_WRONG])
def test_to_interleaved_rejects_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_to_interleaved(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_a_student_copy_gets_the_stub_verdict():
    def untouched(*args):
        raise NotImplementedError("your turn")

    for checker in (check_rope, check_decode_positions, check_to_interleaved):
        verdict = checker(untouched)
        assert not verdict and verdict.stub, verdict.message
