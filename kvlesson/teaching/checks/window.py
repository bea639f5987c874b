"""Checkers for lesson 07: the sliding-window mask and a ring-buffer KV cache.

check_window_mask is the one checker for the window mask (lesson 04 previews the bound; lesson 07's exercise
writes it). It shares lesson 04's mask helpers: the first wrong case is named, and the hint comes from the
slip that explains the learner's mask on every case it got wrong.

check_window_cache streams blocks through the learner's class and through kvlesson's WindowKVCache side by
side, and after every append compares K and V (exactly: a cache copies numbers, it does not compute them),
len(cache), and nbytes against what a ring of W - 1 slots must hold.
"""
import numpy as np

from kvlesson.cache import WindowKVCache
from kvlesson.sdpa import causal_mask
from kvlesson.teaching.checks.mask import mask_case
from kvlesson.teaching.verdict import Slip, as_array, as_number, attribute, checker, passed, reject, run

__all__ = ["check_window_mask", "check_window_cache"]

# (T, S, W): the lesson's picture first; W = 1 (only itself), W >= S (plain causal), T = 0, decode, T = S
_MASK_CASES = [(3, 7, 3), (1, 9, 4), (6, 6, 2), (4, 8, 1), (5, 5, 10), (2, 9, 5), (3, 7, 2), (5, 12, 4),
               (3, 7, 50), (1, 1, 1), (0, 5, 2), (0, 0, 3)]


def _band(T, S, shift, low, high=0):
    """bool [T, S]: query i at p = shift + i sees key j when p - low < j <= p + high."""
    p, j = np.arange(shift, shift + T)[:, None], np.arange(S)[None, :]
    return (j <= p + high) & (j > p - low)


_WINDOW_SLIPS = [
    Slip("no window", lambda T, S, W: causal_mask(T, S), "",
         "the window is missing: besides j <= S - T + i, a window of W needs j > S - T + i - W"),
    Slip("top left", lambda T, S, W: _band(T, S, 0, W), "",
         "both bounds are anchored at the top left: query i sits at S - T + i, not at i, and both ends of its "
         "band move with that offset"),
    Slip("T as the offset", lambda T, S, W: _band(T, S, T, W), "",
         "the offset is S - T, the number of keys cached before this step, not T"),
    Slip("lower bound without the offset", lambda T, S, W: causal_mask(T, S) & _band(T, S, 0, W, high=S), "",
         "the lower bound misses the offset: it is j > S - T + i - W, as the causal bound is j <= S - T + i"),
    Slip("W + 1 keys", lambda T, S, W: _band(T, S, S - T, W + 1), "",
         "each query sees W + 1 keys: the lower bound is strict, j > S - T + i - W (>= lets one key too many in)"),
    Slip("W - 1 keys", lambda T, S, W: _band(T, S, S - T, W - 1), "",
         "each query sees W - 1 keys: the window counts the query's own key, so it spans S - T + i - W + 1 .. "
         "S - T + i"),
    Slip("no causal bound", lambda T, S, W: _band(T, S, S - T, W, high=S), "",
         "queries see keys after their own position: keep the causal bound j <= S - T + i"),
    Slip("strict causal bound", lambda T, S, W: _band(T, S, S - T, W, high=-1), "",
         "each query must also see its own key: use j <= S - T + i, not <"),
    Slip("one window for the whole chunk", lambda T, S, W: causal_mask(T, S) & (np.arange(S) >= S - W)[None, :], "",
         "each query has its own window, ending at its own position S - T + i; keeping the last W keys of the "
         "cache for every query is right only for the newest one"),
]


@checker
def check_window_mask(fn):
    """fn(T, S, window) -> bool [T, S]: query i (at S - T + i) sees key j when S - T + i - window < j <= S - T + i."""
    for T, S, W in _MASK_CASES:
        mask_case(fn, (T, S, W), causal_mask(T, S, W), _MASK_CASES, _WINDOW_SLIPS,
                  "query i sees key j exactly when S - T + i - W < j <= S - T + i")
    return passed(f"your window mask agrees with kvlesson.causal_mask(T, S, window=W) on {len(_MASK_CASES)} cases: "
                  "chunks, decode, W = 1, a window longer than the sequence and T = 0")


# ---------------------------------------------------------------------------------------------- ring cache

# (window, dtype, block sizes): decode, chunks longer than the window, T = 0, window = 1
_STREAMS = [(4, np.float32, (1, 1, 3, 0, 5, 1, 2, 6, 1)), (3, np.float64, (4, 1, 1, 2)),
            (1, np.float32, (2, 1, 0, 1))]


@checker
def check_window_cache(cls):
    """cls(Hkv, d, window, dtype=...) -> a cache: append(k_new, v_new) -> (K, V), len(cache), cache.nbytes.

    It must hand back the same K and V as kvlesson's WindowKVCache (the W - 1 positions held before the step,
    then the T new ones, oldest first), count every token seen, and hold no more than W - 1 positions.
    """
    for window, dtype, blocks in _STREAMS:
        _stream(cls, window, np.dtype(dtype), blocks)
    return passed("your ring buffer hands back the right keys and values, oldest first, in W - 1 slots (decode, "
                  "chunks longer than the window, T = 0, window = 1, float32 and float64)")


def _stream(cls, W, dtype, blocks, Hkv=2, d=3):
    rng = np.random.default_rng(7)
    ref = WindowKVCache(Hkv, d, W, dtype)
    start = f"{cls.__name__ if isinstance(cls, type) else 'your class'}({Hkv}, {d}, window={W}, dtype={dtype.name})"
    cache = run(cls, Hkv, d, W, dtype=dtype, case=start, crash_hint=_init_hint)
    append = _method(cache, "append", start)
    seen, history, memory = 0, [], None  # a memory problem waits until the answers themselves are right
    for n, T in enumerate(blocks):
        k, v = rng.standard_normal((2, Hkv, T, d)).astype(dtype)  # [Hkv, T, d] each
        want = ref.append(k, v)
        seen += T
        step = f"append {n + 1} (T={T}, {seen} token{'s' if seen != 1 else ''} seen, window={W}, {dtype.name})"
        got = run(append, k.copy(), v.copy(), case=step, crash_hint=lambda e, W=W: _append_hint(e, W))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            reject(f"{step}: append returned {_kind(got)}; expected the pair (K, V)", "return K, V")
        K, V = (as_array(g, step, f"append's {name}") for name, g in zip("KV", got, strict=True))
        if np.array_equal(K, want[1]) and np.array_equal(V, want[0]) and not np.array_equal(K, V):
            reject(f"{step}: K and V come back swapped", "return K, V in that order, keys first")
        for name, g, w in zip("KV", (K, V), want, strict=True):
            _block(g, w, name, step, W)
        _length(cache, seen, W, step)
        memory = memory or _nbytes(cache, W, Hkv, d, dtype, seen, history, step)
    if memory:
        reject(*memory)


def _init_hint(e):
    if isinstance(e, TypeError) and "dtype" in str(e):
        return "accept the dtype: def __init__(self, Hkv, d, window, dtype=np.float64)"
    return None


def _append_hint(e, W):
    if isinstance(e, ZeroDivisionError) and W == 1:
        return ("a window of 1 leaves W - 1 = 0 slots: each query sees only itself, nothing is kept between "
                "steps, and p % (W - 1) divides by zero; hand back just the new block")
    return None


def _method(obj, name, case):
    try:
        method = getattr(obj, name)
    except Exception as e:  # a missing attribute or a property that raises
        reject(f"{case}: your cache has no usable {name} ({type(e).__name__})",
               f"give the class a method `def {name}(self, k_new, v_new)`")
    if not callable(method):
        reject(f"{case}: your cache's {name} is not a method", f"define `def {name}(self, k_new, v_new)`")
    return method


def _kind(x):
    if isinstance(x, np.ndarray):
        return "one array"
    return "None" if x is None else f"a {type(x).__name__}"


def _block(got, want, name, step, W):
    """Reject unless got equals want exactly ([Hkv, n, d] in the cache's dtype); name the likely slip."""
    Hkv, n_want, d = want.shape
    if got.ndim != 3 or got.shape[0] != Hkv or got.shape[2] != d:
        reject(f"{step}: {name} has shape {got.shape}; expected {want.shape} ([Hkv, S, d])",
               "concatenate the held block and the new one along axis 1, the positions")
    if got.dtype != want.dtype:
        reject(f"{step}: {name} is {got.dtype}; expected {want.dtype}",
               "store and hand back the dtype the cache was made with (np.zeros(..., dtype))")
    n_got = got.shape[1]
    if n_got < n_want and np.array_equal(got, want[:, n_want - n_got:]):
        reject(f"{step}: {name} holds {_positions(n_got)}; the new queries need {n_want} (the {n_want - n_got} "
               f"oldest {'is' if n_want - n_got == 1 else 'are'} missing)",
               "evict after attending: assemble what the queries attend over (the held keys, then the new ones) "
               "before the new block overwrites old slots, or the first new query loses keys it may still see")
    if n_got > n_want and np.array_equal(got[:, n_got - n_want:], want):
        reject(f"{step}: {name} holds {_positions(n_got)}; only the last {n_want} can be seen by the new queries "
               "(W - 1 + T at most)",
               "drop keys older than the window, or memory grows with the context instead of staying bounded")
    if got.shape == want.shape and not np.array_equal(got, want):
        if np.array_equal(np.sort(got, axis=1), np.sort(want, axis=1)):
            reject(f"{step}: {name} has the right positions in the wrong order",
                   "hand them back oldest first: once the ring wraps, slot order is not time order (position p "
                   "lives in slot p % (W - 1)); decode with T = 1 sees every key handed back, so the order cannot "
                   "change its output, but chunks break")
    if got.shape != want.shape or not np.array_equal(got, want):
        reject(f"{step}: {name} differs from the reference (shape {got.shape}, expected {want.shape})",
               f"hand back the last W - 1 = {W - 1} positions seen before this step (fewer at the start), then "
               "the T new ones")


def _positions(n):
    return f"{n} position" if n == 1 else f"{n} positions"


def _length(cache, seen, W, step):
    n = as_number(run(len, cache, case=step), step, "len(cache)", integer=True)
    if n != seen:
        hint = ("len(cache) counts every token seen (the position of the next token), not the positions held"
                if n == min(seen, W - 1) else "len(cache) is the number of tokens appended so far")
        reject(f"{step}: len(cache) is {n}; expected {seen}", hint)


def _nbytes(cache, W, Hkv, d, dtype, seen, history, step):
    """None when nbytes fits a ring of W - 1 slots holding what the next step needs; else (problem, hint)."""
    nbytes = as_number(attribute(cache, "nbytes", step), step, "nbytes", integer=True)
    history.append((seen, nbytes))
    per_position = 2 * Hkv * d * dtype.itemsize  # K and V
    bound, need = per_position * (W - 1), per_position * min(seen, W - 1)
    if nbytes < need:
        return (f"{step}: nbytes is {nbytes}; the {_positions(min(seen, W - 1))} the next step needs take {need}",
                "nbytes is the bytes of K and V the cache holds (self.k.nbytes + self.v.nbytes)")
    if nbytes <= bound:
        return None
    (s0, b0), (s1, b1) = history[0], history[-1]
    if b1 > b0:
        return (f"{step}: nbytes grew from {b0} after {s0} tokens to {b1} after {s1} tokens",
                f"keep only the last W - 1 = {W - 1} positions: memory must stay bounded, at most {bound} bytes")
    return (f"{step}: your cache holds {nbytes} bytes; W - 1 = {W - 1} positions of K and V take {bound}",
            "between steps the next query needs only the W - 1 keys before it (its own key arrives with it)")
