"""Checkers for lesson 07: the sliding-window mask and a ring-buffer KV cache."""
import numpy as np

from kvlesson import causal_mask
from kvlesson.cache import WindowKVCache
from kvlesson.checks._verdict import call, failed, passed

__all__ = ["check_window_mask", "check_window_cache"]


_MASK_CASES = ((3, 7, 3), (1, 9, 4), (6, 6, 2), (4, 8, 1), (5, 5, 10), (2, 9, 5), (0, 5, 2))


def check_window_mask(fn):
    """fn(T, S, window) -> bool [T, S]: query i (at S - T + i) sees key j when S - T + i - window < j <= S - T + i."""
    for T, S, W in _MASK_CASES:
        case = f"T={T}, S={S}, window={W}"
        got, err = call(fn, T, S, W)
        if err is not None:
            return err
        if got is None:
            return failed(f"for {case} your function returned None", "did you forget the return?")
        got = np.asarray(got)
        want = causal_mask(T, S, W)
        if got.shape != want.shape:
            return failed(f"for {case} the mask has shape {got.shape}; expected {want.shape}",
                          "one row per new query, one column per visible key: [T, S]")
        if got.dtype != bool:
            return failed(f"for {case} the mask is {got.dtype}; expected bool",
                          "build it from comparisons (<=, >), which give True/False directly")
        if not np.array_equal(got, want):
            i = int(np.flatnonzero((got != want).any(axis=1))[0])
            seen, should = np.flatnonzero(got[i]).tolist(), np.flatnonzero(want[i]).tolist()
            return failed(f"for {case} query {i} (position {S - T + i}) sees keys {seen}; it should see {should}",
                          _mask_hint(fn))
    return passed("the window mask is right: offset diagonal, strict lower bound, T = 0 and window >= S included")


def _suspects(T, S, W):
    """Typical wrong masks for one case, each with what it means."""
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    p = i + S - T  # absolute positions of the queries
    yield causal_mask(T, S, W + 1), ("each query sees W + 1 keys: the lower bound is strict, j > S - T + i - W "
                                     "(>= lets one key too many through)")
    yield (causal_mask(T, S, W - 1) if W > 1 else (j <= p) & (j > p),
           "each query sees W - 1 keys: the window counts the query's own key, so it spans p - W + 1 .. p")
    yield ((j <= i) & (j > i - W), "both bounds are anchored at the top left: query i sits at absolute position "
                                   "S - T + i, so both need the offset S - T")
    yield (j <= p) & (j > i - W), "the lower bound misses the offset: it is j > S - T + i - W"
    yield causal_mask(T, S), "there is no lower bound: add j > S - T + i - W to the causal mask"
    yield j > p - W, "queries see keys after their own position: keep the causal bound j <= S - T + i"


def _mask_hint(fn):
    """The typical mistake that explains the learner's masks on every case, if there is one."""
    answers = [call(fn, T, S, W)[0] for T, S, W in _MASK_CASES]
    for n, (_, meaning) in enumerate(_suspects(1, 1, 1)):
        wrongs = [list(_suspects(T, S, W))[n][0] for T, S, W in _MASK_CASES]
        if all(a is not None and np.array_equal(np.asarray(a), w) for a, w in zip(answers, wrongs, strict=True)):
            return meaning
    return "query i sees key j exactly when S - T + i - W < j <= S - T + i"


def check_window_cache(cls):
    """cls(Hkv, d, window, dtype=...) -> a cache with append(k_new, v_new) -> (K, V), len() and nbytes,
    handing back the same keys and values as kvlesson's WindowKVCache while holding at most W - 1 positions."""
    for window, chunks in ((4, (1, 1, 3, 0, 5, 1, 2, 6, 1)), (3, (4, 1, 1)), (1, (2, 1, 0, 1))):
        problem = _stream(cls, window, chunks)
        if problem is not None:
            return problem
    return passed("your ring buffer hands back the right keys and values, oldest first, "
                  "in bounded memory (decode, chunks longer than the window, T = 0, window = 1)")


def _stream(cls, W, chunks, Hkv=2, d=3, dtype=np.float32):
    rng = np.random.default_rng(7)
    ref = WindowKVCache(Hkv, d, W, dtype)
    cache, err = call(cls, Hkv, d, W, dtype=dtype)
    if err is not None:
        return err
    seen, grew, memory = 0, [], None  # a memory problem is reported once the answers themselves are right
    for n, T in enumerate(chunks):
        k, v = rng.standard_normal((2, Hkv, T, d)).astype(dtype)  # [Hkv, T, d] each
        want = ref.append(k, v)
        got, err = call(cache.append, k.copy(), v.copy())
        if err is not None:
            return err
        seen += T
        step = f"append {n + 1} (T={T}, {seen} tokens seen, window={W})"
        if not isinstance(got, tuple) or len(got) != 2:
            return failed(f"{step}: append returned {type(got).__name__}; expected the tuple (K, V)")
        for name, g, w in zip("KV", got, want, strict=True):
            problem = _block_problem(np.asarray(g), w, name, step, W)
            if problem is not None:
                return problem
        problem = _len_problem(cache, seen, W, step)
        if problem is not None:
            return problem
        memory = memory or _bytes_problem(cache, W, Hkv, d, dtype, seen, grew, step)
    return memory


def _block_problem(got, want, name, step, W):
    if got.ndim != 3 or got.shape[0] != want.shape[0] or got.shape[2] != want.shape[2] or got.dtype != want.dtype:
        return failed(f"{step}: {name} is {got.dtype} {got.shape}; expected {want.dtype} {want.shape}",
                      "hand back [Hkv, S, d] in the cache's dtype")
    n_got, n_want = got.shape[1], want.shape[1]
    if n_got < n_want and np.array_equal(got, want[:, n_want - n_got:]):
        return failed(f"{step}: {name} holds {n_got} positions; the new queries need {n_want} (W - 1 = {W - 1} "
                      "older ones, fewer at the start, plus the T new ones); the oldest are missing",
                      "evict after attending: assemble what the queries attend over before the new block overwrites "
                      "old slots, or the first new query loses keys it may still see")
    if n_got > n_want and np.array_equal(got[:, n_got - n_want:], want):
        return failed(f"{step}: {name} holds {n_got} positions; only the last {n_want} can be seen by the new "
                      f"queries (W - 1 + T at most)", "drop keys older than the window, or memory grows with the "
                                                      "context instead of staying bounded")
    if got.shape == want.shape and not np.array_equal(got, want):
        order_g, order_w = np.argsort(got[0, :, 0]), np.argsort(want[0, :, 0])
        if np.array_equal(got[:, order_g], want[:, order_w]):
            return failed(f"{step}: {name} has the right positions in the wrong order",
                          "hand them back oldest first: once the ring wraps, slot order is not time order "
                          "(position p lives in slot p % (W - 1)); decode with T = 1 sees every key handed back, "
                          "so the order cannot change its output, but chunks break")
    if got.shape != want.shape or not np.array_equal(got, want):
        return failed(f"{step}: {name} differs from the reference (shape {got.shape}, expected {want.shape})",
                      "hand back the last W - 1 positions seen before this step, then the T new ones")
    return None


def _len_problem(cache, seen, W, step):
    n, err = call(len, cache)
    if err is not None:
        return err
    if n != seen:
        hint = ("len(cache) counts every token seen (the position of the next token), not the positions held"
                if n == min(seen, W - 1) else "len(cache) is the number of tokens appended so far")
        return failed(f"{step}: len(cache) is {n}; expected {seen}", hint)
    return None


def _bytes_problem(cache, W, Hkv, d, dtype, seen, grew, step):
    nbytes = getattr(cache, "nbytes", None)
    if nbytes is None:
        return failed(f"{step}: your cache has no nbytes", "add a property returning the bytes of what it holds")
    grew.append((seen, int(nbytes)))
    bound = 2 * Hkv * (W - 1) * d * np.dtype(dtype).itemsize  # K and V for W - 1 positions
    if nbytes <= bound:
        return None
    (s0, b0), (s1, b1) = grew[0], grew[-1]
    if b1 > b0:
        return failed(f"{step}: nbytes grew from {b0} after {s0} tokens to {b1} after {s1} tokens",
                      f"keep only the last W - 1 = {W - 1} positions: memory must stay bounded, at most {bound} bytes")
    return failed(f"{step}: your cache holds {nbytes} bytes; W - 1 = {W - 1} positions of K and V take {bound}",
                  "between steps the next query needs only the W - 1 keys before it (its own key arrives with it)")
