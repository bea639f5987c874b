"""Checkers for lesson 06: rotary position embedding at absolute positions."""
import numpy as np

from kvlesson.checks._verdict import call, failed, passed
from kvlesson.rope import apply_rope

__all__ = ["check_rope", "check_decode_positions", "check_to_interleaved"]


def _rope_cases():
    """(description, x, positions, base): toy, decode chunk, T = 1, T = 0, float32 at large positions."""
    rng = np.random.default_rng(6)
    yield "x [T=6, d=4] at positions 0..5", rng.standard_normal((6, 4)), np.arange(6), 10000.0
    yield ("x [H=2, T=3, d=8] at positions 7, 8, 9 (a chunk after 7 cached tokens)",
           rng.standard_normal((2, 3, 8)), np.arange(7, 10), 10000.0)
    yield "x [H=3, T=1, d=16] at position 41, base 100000", rng.standard_normal((3, 1, 16)), np.array([41]), 1e5
    yield "x [H=2, T=0, d=8] (no tokens)", np.zeros((2, 0, 8)), np.arange(0), 10000.0
    yield ("float32 x [H=2, T=5, d=16] at positions 100..104", rng.standard_normal((2, 5, 16)).astype(np.float32),
           np.arange(100, 105), 10000.0)


def _rope_suspects(x, positions, base):
    """Typical wrong answers, each with what it means."""
    T, d = x.shape[-2:]
    yield x, "your output equals the input: nothing was rotated"
    yield (apply_rope(x, positions, base, interleaved=True),
           "you paired dimensions (2m, 2m+1), the interleaved convention of GGUF files; this exercise asks for "
           "the half-split pairs (m, m + d/2) of Hugging Face")
    yield (apply_rope(x, -np.asarray(positions), base),
           "every pair turns the wrong way (a sign error): x1' = x1 cos - x2 sin and x2' = x1 sin + x2 cos")
    yield (apply_rope(x, np.arange(T), base),
           "you rotated by the local index 0..T-1; rotate by the absolute positions you were given")
    yield (apply_rope(x, positions, 10000.0), f"you used base 10000 where the caller passed base={base:g}")


def check_rope(fn):
    """fn(x [..., T, d], positions [T], base) -> [..., T, d], half-split pairs (m, m + d/2), dtype of x."""
    for case, x, positions, base in _rope_cases():
        x_before = x.copy()
        got, err = call(fn, x, positions.copy(), base)
        if err is not None:
            return err
        want = apply_rope(x, positions, base)
        problem = _rope_problem(got, want, x, x_before, positions, base, case)
        if problem is not None:
            return problem
    return passed("half-split RoPE at absolute positions, float64 and float32, T = 0 and T = 1 included")


def _rope_problem(got, want, x, x_before, positions, base, case):
    if not np.array_equal(x, x_before):
        return failed(f"for {case} your function changed x in place", "write the rotated pairs into a new array")
    if got is None:
        return failed(f"for {case} your function returned None", "did you forget the return?")
    got = np.asarray(got)
    if got.shape != want.shape:
        return failed(f"for {case} the result has shape {got.shape}; expected {want.shape}",
                      "RoPE rotates each pair in place: the output has the shape of x")
    tol = 1e-5 if x.dtype == np.float32 else 1e-10
    close = np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    if got.dtype != want.dtype:
        hint = ("your cos/sin tables are float64 and float32 * float64 gives float64: cast the tables to x.dtype "
                "once" if close and x.dtype == np.float32 else "keep the input dtype end to end")
        return failed(f"for {case} the result is {got.dtype}; expected {want.dtype}", hint)
    if close:
        return None
    err = np.abs(got.astype(np.float64) - want).max()
    problem = f"for {case} the values differ from the reference (max abs error {err:.3g})"
    for wrong, meaning in _rope_suspects(x, positions, base):
        if np.allclose(got, wrong, rtol=tol, atol=tol):
            return failed(problem, meaning)
    d = x.shape[-1]
    pair0 = [0, d // 2]  # pair 0 turns at frequency 1 whatever the exponent, so it isolates the ladder
    if np.allclose(got[..., pair0], want[..., pair0], rtol=tol, atol=tol):
        return failed(problem, "pair 0 is right but later pairs are not: check the frequency ladder "
                               "base**(-2m/d) for m = 0 .. d/2 - 1 (the exponent is 2m/d, with a minus sign)")
    return failed(problem, "rotate pair m = (x[m], x[m + d/2]) by the angle position * base**(-2m/d)")


def check_decode_positions(fn):
    """fn(len_cache, T) -> int [T]: the absolute positions of T new tokens arriving after len_cache cached ones."""
    for len_cache, T in ((0, 6), (5, 1), (5, 3), (12, 0), (1, 4)):
        got, err = call(fn, len_cache, T)
        if err is not None:
            return err
        want = np.arange(len_cache, len_cache + T)
        case = f"len_cache={len_cache}, T={T}"
        got = np.asarray(got)
        if got.shape != want.shape:
            hint = ("return positions for the T new tokens only" if got.size == len_cache + T
                    else "one position per new token")
            return failed(f"for {case} you returned shape {got.shape}; expected {want.shape}", hint)
        if got.size and not np.issubdtype(got.dtype, np.integer):
            return failed(f"for {case} you returned {got.dtype} positions", "positions are integer indices")
        if not np.array_equal(got, want):
            return failed(f"for {case} you returned {got.tolist()}; expected {want.tolist()}",
                          _positions_hint(got, len_cache, T))
    return passed("new tokens sit at len(cache) + i, prefill, decode, chunks and T = 0 included")


def _positions_hint(got, len_cache, T):
    if np.array_equal(got, np.arange(T)):
        return ("these are local indices 0..T-1: the new tokens continue after the cached ones, so the first of "
                "them sits at len_cache (the decode-only version of the offset-mask bug)")
    if np.array_equal(got, np.arange(len_cache - T, len_cache)):
        return ("these are the positions of the last T cached tokens; before the append S = len_cache + T, so "
                "S - T + i = len_cache + i")
    if np.array_equal(got, np.arange(len_cache + 1, len_cache + T + 1)):
        return "off by one: positions count from 0, so the first new token sits at exactly len_cache"
    return "the T new tokens sit at len_cache, len_cache + 1, ..., len_cache + T - 1"


def _to_interleaved_order(n_heads, d):
    """Column order: in each head, column 2m + a of the result is column m + a*d/2 of the input."""
    head = np.arange(d).reshape(2, d // 2).T.reshape(d)  # [0, d/2, 1, d/2 + 1, ...]
    return (np.arange(n_heads)[:, None] * d + head[None, :]).reshape(-1)


def check_to_interleaved(fn):
    """fn(W [D, n_heads*d], n_heads) -> W with its columns reordered head by head, so that interleaved RoPE on
    x @ result equals half-split RoPE on x @ W (what the GGUF converter does to Llama's Q and K weights)."""
    rng = np.random.default_rng(8)
    cases = (("W [8, 2 heads x d=4]", rng.standard_normal((8, 8)), 2),
             ("W [5, 3 heads x d=8]", rng.standard_normal((5, 24)), 3),
             ("float32 W [6, 1 head x d=6]", rng.standard_normal((6, 6)).astype(np.float32), 1))
    for case, W, n_heads in cases:
        got, err = call(fn, W.copy(), n_heads)
        if err is not None:
            return err
        got = np.asarray(got)
        d = W.shape[1] // n_heads
        want = W[:, _to_interleaved_order(n_heads, d)]
        if got.shape != want.shape or got.dtype != want.dtype:
            return failed(f"for {case} you returned {got.dtype} {got.shape}; expected {want.dtype} {want.shape}",
                          "only reorder the columns: same shape, same dtype")
        if not np.array_equal(got, want):
            return failed(f"for {case} the columns are not in the converter's order",
                          _permute_hint(got, W, n_heads, d))
        x = rng.standard_normal((4, W.shape[0])).astype(W.dtype)  # 4 tokens
        pos = np.arange(3, 7)
        a = apply_rope((x @ W).reshape(4, n_heads, d).transpose(1, 0, 2), pos)
        b = apply_rope((x @ got).reshape(4, n_heads, d).transpose(1, 0, 2), pos, interleaved=True)
        if not np.allclose(a[..., _to_interleaved_order(1, d)], b, atol=1e-5):  # proof, not just bookkeeping
            return failed(f"for {case} interleaved RoPE on your weights does not match half-split RoPE on W")
    return passed("interleaved RoPE on your reordered weights equals half-split RoPE on the originals")


def _permute_hint(got, W, n_heads, d):
    if np.array_equal(got, W):
        return "the columns are unchanged: in each head, column 2m + a must come from column m + a*d/2"
    inverse = np.argsort(_to_interleaved_order(n_heads, d))
    if np.array_equal(got, W[:, inverse]):
        return ("you moved the columns the other way (interleaved -> half-split): column 2m + a of the result "
                "comes from column m + a*d/2 of W")
    if n_heads > 1 and np.array_equal(got, W[:, _to_interleaved_order(1, n_heads * d)]):
        return "you treated all heads as one wide head: reorder within each block of d columns"
    if W.shape[0] == W.shape[1] and np.array_equal(got, W[_to_interleaved_order(n_heads, d)]):
        return "you reordered the rows; W is [D, n_heads*d] and the head dims are its columns"
    return "in each head of d columns, column 2m + a of the result is column m + a*d/2 of W (a = 0 or 1)"
