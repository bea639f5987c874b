"""Checkers for lesson 06: rotary position embedding at absolute positions.

check_rope runs the learner's rope on toy shapes, a chunk after a cache, T = 0, two leading axes, and
float32 far out (positions near 50,000, where angles computed in float32 are off by a few thousandths of
a radian). check_decode_positions and check_to_interleaved check the positions of new tokens and the GGUF
converter's reordering. Any answer that differs from the reference is rejected; the hint comes from the
slip that explains it on every case that went wrong.
"""
import numpy as np

from kvlesson.rope import apply_rope, inv_freq
from kvlesson.teaching.verdict import Slip, as_array, checker, first_slip, passed, reject, run

__all__ = ["check_rope", "check_decode_positions", "check_to_interleaved"]


def _slip_for_all(slips, answers, same):
    """The first slip whose wrong answer equals the learner's on every (inputs, answer) pair; None if none."""
    return next((s for s in slips if all(first_slip(got, [s], inputs, same) for inputs, got in answers)), None)


# ---------------------------------------------------------------------------------------------- rope

def _rope_cases():
    """(description, x, positions, base), float32 far out last: the trap lesson 06 section 10 shows."""
    rng = np.random.default_rng(6)
    f32 = np.float32
    return [
        ("x [T=6, d=4] at positions 0..5", rng.standard_normal((6, 4)), np.arange(6), 10000.0),
        ("x [H=2, T=3, d=8] at positions 7, 8, 9 (a chunk after 7 cached tokens)", rng.standard_normal((2, 3, 8)),
         np.arange(7, 10), 10000.0),
        ("x [H=3, T=1, d=16] at position 41, base 100000", rng.standard_normal((3, 1, 16)), np.array([41]), 1e5),
        ("x [B=2, H=2, T=3, d=8] (two leading axes) at positions 3, 4, 5", rng.standard_normal((2, 2, 3, 8)),
         np.arange(3, 6), 10000.0),
        ("x [H=2, T=0, d=8] (no tokens)", np.zeros((2, 0, 8)), np.arange(0), 10000.0),
        ("float32 x [H=2, T=5, d=16] at positions 100..104", rng.standard_normal((2, 5, 16)).astype(f32),
         np.arange(100, 105), 10000.0),
        ("float32 x [H=2, T=3, d=64] at positions 50,000..50,002", rng.standard_normal((2, 3, 64)).astype(f32),
         np.arange(50_000, 50_003), 10000.0),
    ]


def _halves(x, positions, base):
    """(x1, x2, cos, sin) of the reference, all float64: pair m is (x[m], x[m + d/2])."""
    d = x.shape[-1]
    theta = np.asarray(positions, np.float64)[:, None] * inv_freq(d, base)  # [T, d/2]
    x = x.astype(np.float64)
    return x[..., : d // 2], x[..., d // 2 :], np.cos(theta), np.sin(theta)


def _swapped_halves(x, positions, base):
    x1, x2, c, s = _halves(x, positions, base)
    return np.concatenate([x1 * s + x2 * c, x1 * c - x2 * s], axis=-1)


def _first_half_only(x, positions, base):
    x1, x2, c, s = _halves(x, positions, base)
    return np.concatenate([x1 * c - x2 * s, x2], axis=-1)


def _float32_angles(x, positions, base):
    """The trap: frequencies and angles rounded to float32 before cos and sin."""
    f = inv_freq(x.shape[-1], base).astype(np.float32)
    theta = np.asarray(positions).astype(np.float32)[:, None] * f  # [T, d/2] float32
    x1, x2, _, _ = _halves(x, positions, base)
    c, s = np.cos(theta).astype(np.float64), np.sin(theta).astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


_FLOAT32_ANGLES = ("far from position 0 the angles are large: at position 50,000 pair 0 has turned 50,000 rad, "
                   "and float32 numbers there are about 0.004 apart, so angles (or frequencies) kept in float32 "
                   "are off by thousandths of a radian. Compute the angles in float64, then cast cos and sin to "
                   "x.dtype once")

_ROPE_SLIPS = [
    Slip("nothing rotated", lambda x, p, b: x, "", "your output equals the input: nothing was rotated"),
    Slip("interleaved", lambda x, p, b: apply_rope(x, p, b, interleaved=True), "",
         "you paired dimensions (2m, 2m+1), the interleaved convention of GGUF files; this exercise asks for the "
         "half-split pairs (m, m + d/2) of Hugging Face"),
    Slip("sign", lambda x, p, b: apply_rope(x, -np.asarray(p), b), "",
         "every pair turns the wrong way (a sign error): x1' = x1 cos - x2 sin and x2' = x1 sin + x2 cos"),
    Slip("local positions", lambda x, p, b: apply_rope(x, np.arange(len(p)), b), "",
         "you rotated by the local index 0..T-1; rotate by the absolute positions you were given"),
    Slip("one position late", lambda x, p, b: apply_rope(x, np.asarray(p) + 1, b), "",
         "every token is rotated one position too far: the angle is position * frequency, positions as given"),
    Slip("rotated twice", lambda x, p, b: apply_rope(x, 2 * np.asarray(p), b), "",
         "every angle is doubled: each pair turns by position * base**(-2m/d) once"),
    Slip("base ignored", lambda x, p, b: apply_rope(x, p, 10000.0) if b != 10000.0 else None, "",
         "you used base 10000 where the caller passed another base; use the base argument"),
    Slip("halves swapped", _swapped_halves, "",
         "the two halves come back swapped: the first d/2 outputs are x1 cos - x2 sin, the last d/2 are "
         "x1 sin + x2 cos"),
    Slip("second half not rotated", _first_half_only, "",
         "only the first half was rotated: each pair has two outputs, x1' = x1 cos - x2 sin in the first half "
         "and x2' = x1 sin + x2 cos in the second"),
    Slip("float32 angles", lambda x, p, b: _float32_angles(x, p, b) if x.dtype == np.float32 else None, "",
         _FLOAT32_ANGLES),
]


def _tol(x):
    """float32 output carries float32 rounding (about 1e-7 of |x|); float64 agrees with the reference to ~1e-15."""
    return dict(rtol=1e-5, atol=1e-5) if x.dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


@checker
def check_rope(fn):
    """fn(x [..., T, d], positions [T], base) -> [..., T, d]: half-split pairs (m, m + d/2), in the dtype of x."""
    cases = _rope_cases()
    for case, x, positions, base in cases:
        _rope_case(fn, case, x, positions, base, cases)
    return passed("half-split RoPE at absolute positions: float64, float32 at position 50,000, any leading axes, "
                  "T = 0 and T = 1")


def _rope_case(fn, case, x, positions, base, cases):
    given = x.copy()
    got = as_array(run(fn, given, positions.copy(), base, case=case, crash_hint=_rope_crash_hint), case)
    if not np.array_equal(given, x):
        reject(f"for {case} your function changed x in place",
               "write the rotated pairs into a new array (np.empty_like(x) or np.concatenate); the caller's x "
               "is the unrotated key, still needed")
    want = apply_rope(x, positions, base)
    if got.shape != want.shape:
        reject(f"for {case} the result has shape {got.shape}; expected {want.shape}",
               "RoPE turns each pair in place: the output has the shape of x")
    close = np.allclose(got.astype(np.float64), want, **_tol(x))
    if got.dtype != want.dtype:
        hint = ("your cos/sin tables are float64, and float32 * float64 gives float64: cast the tables to x.dtype "
                "once" if close and x.dtype == np.float32 else "keep the input dtype end to end")
        reject(f"for {case} the result is {got.dtype}; expected {want.dtype}", hint)
    if close:
        return
    err = np.abs(got.astype(np.float64) - want).max()
    slip = _rope_slip(fn, cases, (x, positions, base), got)
    reject(f"for {case} the values differ from the reference (max abs error {err:.3g})",
           slip.hint if slip else _rope_hint(got, want, x, err))


def _rope_crash_hint(e):
    text = str(e)
    if "broadcast" in text:
        return ("the angles are [T, d/2]: positions[:, None] * frequencies[None, :]; they broadcast against "
                "x[..., :d//2], which is [..., T, d/2], for any number of leading axes")
    if "too many indices" in text or ("index" in text and "out of bounds" in text):
        return "slice the last axis with x[..., :d//2] and x[..., d//2:] so any number of leading axes works"
    return None


def _explains(slip, inputs, got):
    """True when the slip's answer is far closer to the learner's than the reference is.

    A tolerance alone would not do: where a slip coincides with the reference (local positions at positions
    0..T-1), a nearly right answer would match it.
    """
    try:
        wrong = slip.wrong(*inputs)
    except Exception:
        return False
    if wrong is None or np.shape(wrong) != np.shape(got):
        return False
    got = np.asarray(got, np.float64)
    off_slip = np.abs(got - np.asarray(wrong, np.float64)).max(initial=0)
    off_ref = np.abs(got - apply_rope(*inputs)).max(initial=0)
    return off_slip < 1e-3 * max(1.0, np.abs(got).max(initial=0)) and off_slip < off_ref / 10


def _rope_slip(fn, cases, inputs, got):
    answers = [(inputs, got)]
    for _, x, positions, base in cases:
        if x is inputs[0]:
            continue
        try:
            other = np.asarray(fn(x.copy(), positions.copy(), base))
        except Exception:
            continue
        if other.shape == x.shape and other.dtype.kind == "f" and not np.allclose(
                other.astype(np.float64), apply_rope(x, positions, base), **_tol(x)):
            answers.append(((x, positions, base), other))
    for candidates in (answers, answers[:1]):  # every wrong case first, then this case alone
        slip = next((s for s in _ROPE_SLIPS if all(_explains(s, i, g) for i, g in candidates)), None)
        if slip:
            return slip
    return None


def _rope_hint(got, want, x, err):
    d = x.shape[-1]
    if x.dtype == np.float32 and err < 0.05:
        return _FLOAT32_ANGLES
    if err < 1e-4:
        return ("close, but not float64-exact: something rounds to float32 along the way (the frequencies, the "
                "angles or the tables); keep them float64 and cast only cos and sin to x.dtype")
    pair0 = [0, d // 2]  # pair 0 turns at frequency 1 whatever the exponent, so it isolates the ladder
    if np.allclose(got[..., pair0], want[..., pair0], **_tol(x)):
        return ("pair 0 is right but later pairs are not: check the frequency ladder base**(-2m/d) for "
                "m = 0 .. d/2 - 1 (the exponent is 2m/d, with a minus sign)")
    return "rotate pair m = (x[m], x[m + d/2]) by the angle position * base**(-2m/d)"


# ---------------------------------------------------------------------------------------------- positions

_POSITION_CASES = [(0, 6), (5, 1), (5, 3), (12, 0), (1, 4), (7, 2)]  # (len_cache, T)

_POSITION_SLIPS = [
    Slip("local indices", lambda n, T: np.arange(T), "",
         "these are local indices 0..T-1: the new tokens continue after the cached ones, so the first of them "
         "sits at len_cache (the RoPE version of lesson 04's top-left mask)"),
    Slip("last cached", lambda n, T: np.arange(n - T, n), "",
         "these are the positions of the last T cached tokens; after the append S = len_cache + T, so "
         "S - T + i = len_cache + i"),
    Slip("one late", lambda n, T: np.arange(n + 1, n + T + 1), "",
         "off by one: positions count from 0, so the first new token sits at exactly len_cache"),
    Slip("T as the start", lambda n, T: np.arange(T, 2 * T), "",
         "the new tokens start at len_cache, the number of tokens already cached, not at T"),
]


@checker
def check_decode_positions(fn):
    """fn(len_cache, T) -> int [T]: the absolute positions of T new tokens arriving after len_cache cached ones."""
    for n, T in _POSITION_CASES:
        case = f"len_cache={n}, T={T}"
        got = as_array(run(fn, n, T, case=case), case)
        want = np.arange(n, n + T)
        if got.shape != want.shape:
            hint = ("return positions for the T new tokens only" if got.size == n + T
                    else "one position per new token: an array [T], even when T = 1")
            reject(f"for {case} you returned shape {got.shape}; expected {want.shape}", hint)
        if got.size and got.dtype.kind not in "iu":
            reject(f"for {case} you returned {got.dtype} positions", "positions are integer indices (np.arange)")
        if not np.array_equal(got, want):
            slip = _positions_slip(fn, (n, T), got)
            reject(f"for {case} you returned {got.tolist()}; expected {want.tolist()}",
                   slip.hint if slip else "the T new tokens sit at len_cache, len_cache + 1, ..., len_cache + T - 1")
    return passed("new tokens sit at len(cache) + i: prefill, decode, chunks and T = 0")


def _positions_slip(fn, inputs, got):
    same = lambda a, b: np.shape(a) == np.shape(b) and np.array_equal(a, b)  # noqa: E731
    answers = [(inputs, got)]
    for n, T in _POSITION_CASES:
        try:
            other = np.asarray(fn(n, T))
        except Exception:
            continue
        if (n, T) != inputs and other.shape == (T,) and not np.array_equal(other, np.arange(n, n + T)):
            answers.append(((n, T), other))
    return _slip_for_all(_POSITION_SLIPS, answers, same) or first_slip(got, _POSITION_SLIPS, inputs, same)


# ---------------------------------------------------------------------------------------------- converter


def _to_interleaved_order(n_heads, d):
    """Column order: in each head, column 2m + a of the result is column m + a*d/2 of the input."""
    head = np.arange(d).reshape(2, d // 2).T.reshape(d)  # [0, d/2, 1, d/2 + 1, ...]
    return (np.arange(n_heads)[:, None] * d + head[None, :]).reshape(-1)


def _pairs_swapped(n_heads, d):
    """Column 2m takes m + d/2 and column 2m + 1 takes m: each pair written second half first."""
    head = np.arange(d).reshape(2, d // 2)[::-1].T.reshape(d)
    return (np.arange(n_heads)[:, None] * d + head[None, :]).reshape(-1)


def _square_rows(W, n):
    return W[_to_interleaved_order(n, W.shape[1] // n)] if W.shape[0] == W.shape[1] else None


_CONVERTER_SLIPS = [
    Slip("unchanged", lambda W, n: W, "",
         "the columns are unchanged: in each head, column 2m + a must come from column m + a*d/2"),
    Slip("the other way", lambda W, n: W[:, np.argsort(_to_interleaved_order(n, W.shape[1] // n))], "",
         "you moved the columns the other way (interleaved -> half-split): column 2m + a of the result comes "
         "from column m + a*d/2 of W"),
    Slip("one wide head", lambda W, n: W[:, _to_interleaved_order(1, W.shape[1])] if n > 1 else None, "",
         "you treated all heads as one wide head: reorder within each block of d columns"),
    Slip("pairs swapped", lambda W, n: W[:, _pairs_swapped(n, W.shape[1] // n)], "",
         "each pair comes out second half first: column 2m takes column m, column 2m + 1 takes column m + d/2"),
    Slip("rows", _square_rows, "",
         "you reordered the rows; W is [D, n_heads*d] and the head dims are its columns"),
]


@checker
def check_to_interleaved(fn):
    """fn(W [D, n_heads*d], n_heads) -> W with each head's columns reordered, so that interleaved RoPE on
    x @ result equals half-split RoPE on x @ W (what the GGUF converter does to Llama's Q and K weights)."""
    rng = np.random.default_rng(8)
    cases = [("W [8, 2 heads x d=4]", rng.standard_normal((8, 8)), 2),
             ("W [5, 3 heads x d=8]", rng.standard_normal((5, 24)), 3),
             ("float32 W [6, 1 head x d=6]", rng.standard_normal((6, 6)).astype(np.float32), 1),
             ("W [4, 4 heads x d=2] (one pair per head)", rng.standard_normal((4, 8)), 4)]
    for case, W, n_heads in cases:
        _converter_case(fn, case, W, n_heads, cases, rng)
    return passed("interleaved RoPE on your reordered weights equals half-split RoPE on the originals")


def _converter_case(fn, case, W, n_heads, cases, rng):
    given = W.copy()
    got = as_array(run(fn, given, n_heads, case=case), case)
    if not np.array_equal(given, W):
        reject(f"for {case} your function changed W in place",
               "return a reordered copy (fancy indexing W[:, order] makes one); W[:] = ... overwrites the "
               "caller's weights")
    d = W.shape[1] // n_heads
    want = W[:, _to_interleaved_order(n_heads, d)]
    if got.shape != want.shape or got.dtype != want.dtype:
        reject(f"for {case} you returned {got.dtype} {got.shape}; expected {want.dtype} {want.shape}",
               "only reorder the columns: same shape, same dtype")
    if not np.array_equal(got, want):
        same = lambda a, b: np.shape(a) == np.shape(b) and np.array_equal(a, b)  # noqa: E731
        answers = [((W, n_heads), got)]
        for _, W2, n2 in cases:
            try:
                other = np.asarray(fn(W2.copy(), n2))
            except Exception:
                continue
            if W2 is not W and not same(other, W2[:, _to_interleaved_order(n2, W2.shape[1] // n2)]):
                answers.append(((W2, n2), other))
        slip = _slip_for_all(_CONVERTER_SLIPS, answers, same) or first_slip(got, _CONVERTER_SLIPS, (W, n_heads), same)
        reject(f"for {case} the columns are not in the converter's order",
               slip.hint if slip else "in each head of d columns, column 2m + a of the result is column m + a*d/2 "
                                      "of W (a = 0 or 1)")
    x = rng.standard_normal((4, W.shape[0])).astype(W.dtype)  # 4 tokens
    pos = np.arange(3, 7)
    a = apply_rope((x @ W).reshape(4, n_heads, d).transpose(1, 0, 2), pos)
    b = apply_rope((x @ got).reshape(4, n_heads, d).transpose(1, 0, 2), pos, interleaved=True)
    if not np.allclose(a[..., _to_interleaved_order(1, d)], b, atol=1e-5):  # proof, not just bookkeeping
        reject(f"for {case} interleaved RoPE on your weights does not match half-split RoPE on W")
