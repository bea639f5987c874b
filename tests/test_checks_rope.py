"""The lesson 06 checkers pass kvlesson's own answers and name each typical mistake."""
import numpy as np
import pytest

from kvlesson import apply_rope
from kvlesson.checks import check_decode_positions, check_rope, check_to_interleaved


def rope_with(pairs="half", sign=1, exponent=lambda m, d: -2 * m / d, table_dtype=None, local=False,
              base_override=None, in_place=False):
    """A half-split RoPE with one knob per classic mistake."""
    def rope(x, positions, base):
        d = x.shape[-1]
        T = x.shape[-2]
        pos = np.arange(T) if local else np.asarray(positions)
        b = base if base_override is None else base_override
        theta = pos[:, None] * b ** exponent(np.arange(d // 2), d)  # [T, d/2] float64
        dt = table_dtype or x.dtype
        cos, sin = np.cos(theta).astype(dt), np.sin(theta).astype(dt)
        idx1, idx2 = (np.arange(0, d, 2), np.arange(1, d, 2)) if pairs == "interleaved" else (
            np.arange(d // 2), np.arange(d // 2, d))
        x1, x2 = x[..., idx1], x[..., idx2]
        out = x if in_place else np.empty(x.shape, np.result_type(x, cos))
        out[..., idx1], out[..., idx2] = x1 * cos - sign * x2 * sin, sign * x1 * sin + x2 * cos
        return out
    return rope


def test_rope_checker_passes_the_package_and_a_hand_written_answer():
    assert check_rope(lambda x, p, b: apply_rope(x, p, b))
    assert check_rope(rope_with())


@pytest.mark.parametrize("wrong, hint", [
    (rope_with(pairs="interleaved"), "interleaved convention"),
    (rope_with(sign=-1), "sign error"),
    (rope_with(exponent=lambda m, d: -m / d), "frequency ladder"),
    (rope_with(exponent=lambda m, d: 2 * m / d), "frequency ladder"),
    (rope_with(table_dtype=np.float64), "cast the tables to x.dtype"),
    (rope_with(local=True), "local index"),
    (rope_with(base_override=10000.0), "base 10000 where the caller passed"),
    (rope_with(in_place=True), "changed x in place"),
    (lambda x, p, b: x.copy(), "nothing was rotated"),
    (lambda x, p, b: None, "returned None"),
    (lambda x, p, b: x[..., :2], "has shape"),
    (lambda x, p, b: 1 / 0, "ZeroDivisionError"),
])
def test_rope_checker_names_the_mistake(wrong, hint):
    verdict = check_rope(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_decode_positions_checker():
    assert check_decode_positions(lambda n, T: np.arange(n, n + T))
    cases = [
        (lambda n, T: np.arange(T), "local indices"),
        (lambda n, T: np.arange(n - T, n), "last T cached tokens"),
        (lambda n, T: np.arange(n + 1, n + T + 1), "off by one"),
        (lambda n, T: np.arange(n + T), "the T new tokens only"),
        (lambda n, T: np.arange(n, n + T, dtype=float), "integer"),
        (lambda n, T: np.arange(n, n + T) * 2, "len_cache, len_cache + 1"),
    ]
    for wrong, hint in cases:
        verdict = check_decode_positions(wrong)
        assert not verdict and hint in repr(verdict), repr(verdict)


def to_interleaved(W, n_heads):
    D, width = W.shape
    d = width // n_heads
    return W.reshape(D, n_heads, 2, d // 2).swapaxes(2, 3).reshape(D, width)


def test_to_interleaved_checker():
    assert check_to_interleaved(to_interleaved)

    def inverse(W, n_heads):
        D, width = W.shape
        d = width // n_heads
        return W.reshape(D, n_heads, d // 2, 2).swapaxes(2, 3).reshape(D, width)

    def rows(W, n_heads):
        return to_interleaved(W.T, n_heads).T

    cases = [
        (lambda W, n: W.copy(), "columns are unchanged"),
        (inverse, "the other way"),
        (lambda W, n: to_interleaved(W, 1), "all heads as one wide head"),
        (rows, "reordered the rows"),
        (lambda W, n: to_interleaved(W, n).astype(np.float64), "same dtype"),
    ]
    for wrong, hint in cases:
        verdict = check_to_interleaved(wrong)
        assert not verdict and hint in repr(verdict), repr(verdict)


def test_a_student_copy_gets_a_friendly_nudge():
    def untouched(*args):
        raise NotImplementedError("your turn")

    for checker in (check_rope, check_decode_positions, check_to_interleaved):
        verdict = checker(untouched)
        assert not verdict and "still raises NotImplementedError" in repr(verdict), repr(verdict)
