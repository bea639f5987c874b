"""Checkers for lesson 03: a growing KV cache, and `step`, the one function for prefill and decode.

check_kv_cache drives the learner's class by hand first (append, len, nbytes, T = 0, float32, bad input that
must raise ValueError and change nothing), where each classic slip has a clear symptom, then runs it under
kvlesson.step with RoPE against one full pass. check_step runs the learner's step against kvlesson's on a
prefill, decode, chunks and T = 0, with every kind of cache (growing, preallocated, and one that keeps its
arrays private), and recognises the slips that only show with T > 1 or with a preallocated cache. Each checker
carries its reference answer as `.reference` (kvlesson.KVCache, kvlesson.step).
"""
import math

import numpy as np

from kvlesson import KVCache, StaticKVCache, attention, step
from kvlesson.teaching.verdict import (
    STUB_HINT,
    STUB_PROBLEM,
    Reject,
    Verdict,
    as_array,
    as_number,
    attribute,
    checker,
    passed,
    reject,
    run,
)

__all__ = ["check_kv_cache", "check_step"]


# ------------------------------------------------------------------------------------------- KV cache

@checker
def check_kv_cache(cls):
    """cls(Hkv, d, dtype=np.float64) -> a cache with attributes Hkv, d, dtype, append(k_new, v_new) -> (K, V)
    with K, V [Hkv, S, d] oldest first, len() = tokens seen, nbytes = bytes held; a block that is not
    [Hkv, T, d] in the cache's dtype (keys and values alike) raises ValueError and changes nothing."""
    if not callable(cls):
        reject(f"expected your class itself; got {_kind(cls)}",
               "pass the class by name, without creating a cache: check_kv_cache(MyKVCache)")
    _protocol(cls)
    _empty_append(cls)
    _float32(cls)
    _bad_input(cls)
    _against_full_pass(cls)
    return passed("your cache appends along the positions axis, counts tokens, keeps its dtype, takes T = 0, refuses "
                  "bad blocks (shapes and dtypes of keys and values) without changing, and prefill + chunks + decode "
                  "match one full pass")


check_kv_cache.reference = KVCache


def _kind(x):
    return "an instance of " + type(x).__name__ if not callable(x) else f"{getattr(x, '__name__', x)!r}"


def _blocks(T, Hkv=2, d=4, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((Hkv, T, d)).astype(dtype) for _ in range(2))  # [Hkv, T, d] each


def _new(cls, *args, **kwargs):
    shown = ", ".join([*map(str, args), *(f"dtype=np.{np.dtype(v).name}" for v in kwargs.values())])
    case = f"creating {getattr(cls, '__name__', 'your cache')}({shown})"
    return run(cls, *args, case=case, crash_hint=lambda e: "the constructor is cls(Hkv, d, dtype=np.float64)",
               **kwargs)


def _length(cache, when):
    n = run(len, cache, case=f"len(cache) {when}",
            crash_hint=lambda e: "define __len__(self) to return the number of tokens seen so far, an int")
    return n


def _append(cache, k, v, when, crash_hint=None):
    try:
        method = cache.append
    except Exception as e:  # a cache without append, or one whose attribute lookup itself fails
        reject(f"{when}: your cache has no append method ({type(e).__name__})",
               "define append(self, k_new, v_new) returning (K, V)")
    got = run(method, k, v, case=when, crash_hint=crash_hint)
    if not isinstance(got, tuple) or len(got) != 2:
        what = f"a {type(got).__name__}" + (f" of {len(got)} items" if isinstance(got, (list, tuple)) else "")
        reject(f"{when}: append returned {what}; expected the tuple (K, V)",
               "return self.k, self.v: the keys and values the new queries attend over")
    for name, a in zip("KV", got, strict=True):
        if isinstance(a, (list, tuple)):
            reject(f"{when}: append returned {name} as a {type(a).__name__}; expected a numpy array",
                   _NOT_A_LIST)
    return tuple(np.array(as_array(a, when, "append")) for a in got)  # copies: a later append may write into views


_NOT_A_LIST = ("return the numpy array itself: a list (what .tolist() gives) has no dtype and no shape of its own, so "
               "float32 in could not come out float32, and an empty one forgets its columns")


def _nbytes(cache, when):
    case = f"a cache {when}"
    value = attribute(cache, "nbytes", case)
    if value is None:
        reject(f"{when} cache.nbytes is None", "nbytes is the bytes held by K and V together: self.k.nbytes + "
                                               "self.v.nbytes, as a property")
    return as_number(value, case, "cache.nbytes", integer=True)


def _protocol(cls):
    """Two appends by hand: shapes, order, length and bytes."""
    a, b = _blocks(3, seed=1), _blocks(2, seed=2)
    cache = _new(cls, 2, 4)
    n = _length(cache, "of a new cache")
    if n != 0:
        reject(f"a new cache Hkv=2, d=4 has len {n}; expected 0",
               "len counts the tokens seen, and a new cache has seen none: count positions (axis 1 of K), not heads "
               "or head dims")
    for name, want in (("Hkv", 2), ("d", 4)):
        value = _stored(cache, name, "a new cache Hkv=2, d=4",
                        "step reads cache.Hkv and cache.d to check the layer fits: store them in __init__")
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value != want:
            reject(f"cache.{name} is {value!r}; expected {want}",
                   "step reads cache.Hkv and cache.d to check the layer fits: store them in __init__")
    _dtype(cache, np.float64, "a cache made without a dtype")
    first = _append(cache, *a, "appending 3 tokens to an empty cache")
    _block_problem(first, a, "after appending 3 tokens [Hkv=2, T=3, d=4] to an empty cache", 3)
    second = _append(cache, *b, "appending 2 more tokens")
    want = tuple(np.concatenate([x, y], axis=1) for x, y in zip(a, b, strict=True))
    _second_block_problem(second, want, a, b)
    _count_problem(cache, 5, "after 3 + 2 tokens", want)


def _stored(cache, name, when, hint):
    """cache.name, where a missing attribute gets `hint` (an attribute that raises otherwise gets attribute's)."""
    try:
        getattr(cache, name)
    except AttributeError:
        reject(f"for {when} your cache has no attribute {name}", hint)
    except Exception:  # attribute() below reports it
        pass
    return attribute(cache, name, when)


def _dtype(cache, want, when):
    value = _stored(cache, "dtype", when, "store the dtype in __init__ (self.dtype = np.dtype(dtype)): step reads "
                                          "it to check x fits the cache")
    try:
        same = np.dtype(value) == np.dtype(want)
    except Exception:  # not something numpy reads as a dtype
        same = False
    if not same:
        reject(f"for {when} cache.dtype is {value!r}; expected {np.dtype(want).name}",
               "store the dtype in __init__ (self.dtype = np.dtype(dtype)): step reads it to check x fits the cache")


def _block_problem(got, want, when, S):
    for name, g, w in zip("KV", got, want, strict=True):
        if g.shape == (w.shape[1], w.shape[0], w.shape[2]) and g.shape != w.shape:
            reject(f"{when}, {name} has shape {g.shape}; expected {w.shape} = [Hkv, S, d]",
                   "keep the positions on axis 1: start from np.zeros((Hkv, 0, d)) and concatenate with axis=1, the "
                   "layout attention reads")
        if g.ndim == 3 and g.shape[1] == 0 and w.shape[1] > 0:
            reject(f"{when}, {name} is empty; expected {w.shape} = [Hkv, S={S}, d]",
                   "np.concatenate returns a new array: store it back on self before returning it")
        if g.shape != w.shape:
            reject(f"{when}, {name} has shape {g.shape}; expected {w.shape} = [Hkv, S={S}, d]",
                   "K and V hold every position seen so far, on axis 1")
        if not np.array_equal(g, w):
            hint = ("append k_new to the keys and v_new to the values, unchanged"
                    if g.dtype == w.dtype else f"keep the cache's dtype: {w.dtype} in, {w.dtype} out")
            reject(f"{when}, {name} does not hold the appended values", hint)


def _second_block_problem(got, want, a, b):
    when = "after appending 3 tokens and then 2"
    for name, g, w, old, new in zip("KV", got, want, a, b, strict=True):
        if g.shape == new.shape and np.array_equal(g, new):
            reject(f"{when}, {name} holds only the 2 new tokens; expected all 5",
                   "the new queries attend over the whole past: concatenate the new block onto the stored one "
                   "(self.k = np.concatenate([self.k, k_new], axis=1)) and return the result")
        if g.shape == old.shape and np.array_equal(g, old):
            reject(f"{when}, {name} still holds only the first 3 tokens",
                   "store the concatenated array back on self: np.concatenate returns a new array")
        if g.shape == w.shape and np.array_equal(g, np.concatenate([new, old], axis=1)):
            reject(f"{when}, {name} has the new tokens first",
                   "oldest first: np.concatenate([self.k, k_new], axis=1), so position p sits at index p")
    _block_problem(got, want, when, 5)


def _count_problem(cache, n_want, when, want):
    n = _length(cache, when)
    if n != n_want:
        hint = ("len must count tokens (positions, axis 1), not blocks or heads" if n in (2, 3, 10)
                else "advance the count by T, the number of new positions, on every append")
        if n == 0:
            hint = "the count never moved: add T = k_new.shape[1] on every append (RoPE and the mask need it)"
        reject(f"{when} len(cache) is {n}; expected {n_want}", hint)
    nbytes = _nbytes(cache, when)
    expected = sum(a.nbytes for a in want)
    held = []
    for name in ("k", "v"):
        try:
            held.append(getattr(cache, name))
        except Exception:  # a cache may keep its arrays under other names
            held.append(None)
    if all(isinstance(a, np.ndarray) for a in held):  # a preallocated buffer holds more than it has filled
        expected = max(expected, sum(a.nbytes for a in held))
    if nbytes != expected:
        reject(f"{when} cache.nbytes is {nbytes}; expected {expected} (K and V, {want[0].shape} each, "
               f"{want[0].dtype})",
               "nbytes is the bytes held by K and V together: self.k.nbytes + self.v.nbytes (a property)")


def _empty_append(cls):
    """T = 0 is a legal step (an empty chunk): it returns what is there and changes nothing."""
    a = _blocks(3, seed=3)
    cache = _new(cls, 2, 4)
    _append(cache, *a, "appending 3 tokens")
    got = _append(cache, *_blocks(0), "appending an empty block [Hkv=2, T=0, d=4] onto 3 tokens",
                  crash_hint=lambda e: "T = 0 is a legal step (an empty chunk of a prefill): concatenating nothing "
                                       "is fine, so do not reject it")
    _block_problem(got, a, "after an empty append onto 3 tokens", 3)
    _count_problem(cache, 3, "after an empty append onto 3 tokens", a)


def _float32(cls):
    cache = _new(cls, 2, 4, dtype=np.float32)
    _dtype(cache, np.float32, "a cache made with dtype=np.float32")
    for n, blk in enumerate((_blocks(2, dtype=np.float32, seed=4), _blocks(1, dtype=np.float32, seed=5))):
        got = _append(cache, *blk, "appending float32 blocks to a float32 cache")
        if got[0].dtype != np.float32 or got[1].dtype != np.float32:
            reject(f"a float32 cache hands back {got[0].dtype} keys and {got[1].dtype} values after {n + 1} "
                   "append(s)",
                   "np.zeros((Hkv, 0, d)) is float64 unless told otherwise, and concatenating float32 onto float64 "
                   "upcasts: create the empty arrays with dtype=dtype")
    _count_problem(cache, 3, "after 2 + 1 float32 tokens", (np.zeros((2, 3, 4), np.float32),) * 2)


_SHAPES = ("check the block before touching any state: k_new and v_new must both be [Hkv, T, d] for this cache's "
           "Hkv and d, with the same T; raise ValueError naming the shapes otherwise")
_DTYPES = ("check k_new.dtype and v_new.dtype, both, against self.dtype and raise ValueError when either differs. "
           "Do not cast: a silent cast hides the caller's mistake, and concatenating would upcast the whole cache")


def _bad_blocks():
    k1, v1 = _blocks(1, seed=7)
    f32, f64 = np.float32, np.float64
    return [  # (what, k_new, v_new, the cache's dtype, hint if it is accepted); integers may also get a TypeError
        ("keys [2, 1, 4] with values [2, 1, 5] (d differs)", k1, np.zeros((2, 1, 5)), f64, _SHAPES),
        ("keys [2, 1, 4] with values [2, 2, 4] (T differs)", k1, np.zeros((2, 2, 4)), f64, _SHAPES),
        ("keys and values [3, 1, 4] (3 KV heads for a 2-head cache)", np.zeros((3, 1, 4)), np.zeros((3, 1, 4)), f64,
         _SHAPES),
        ("keys and values [1, 2, 4] laid out [T, Hkv, d]", np.zeros((1, 2, 4)), np.zeros((1, 2, 4)), f64, _SHAPES),
        ("keys and values [2, 4] (no positions axis)", np.zeros((2, 4)), np.zeros((2, 4)), f64, _SHAPES),
        ("float64 keys and values into a float32 cache", k1, v1, f32, _DTYPES),
        ("float32 keys with float64 values into a float32 cache", k1.astype(f32), v1, f32, _DTYPES),
        ("float64 keys with float32 values into a float32 cache", k1, v1.astype(f32), f32, _DTYPES),
        ("float32 keys and values into a float64 cache", k1.astype(f32), v1.astype(f32), f64, _DTYPES),
        ("integer keys and values into a float64 cache", np.ones((2, 1, 4), np.int64), np.ones((2, 1, 4), np.int64),
         f64, _DTYPES),
    ]


def _bad_input(cls):
    """A rejected block must raise ValueError and leave the cache exactly as it was."""
    for what, k_bad, v_bad, dtype, hint in _bad_blocks():
        cache = _new(cls, 2, 4, dtype=dtype)
        before, probe = _blocks(2, dtype=dtype, seed=6), _blocks(1, dtype=dtype, seed=10)
        _append(cache, *before, "appending 2 tokens")
        error = _raises(cache, k_bad, v_bad)
        if error is None:
            reject(f"appending {what} did not raise", hint)
        allowed = (ValueError, TypeError) if k_bad.dtype.kind in "iub" else ValueError
        if not isinstance(error, allowed):
            reject(f"appending {what} raised {type(error).__name__}; expected a ValueError",
                   "check the shapes and dtypes yourself and raise ValueError with a message that names them (an "
                   "assert can be switched off, and an error from deep inside numpy does not say what was wrong)")
        _unchanged_after(cache, what, before, probe)


def _raises(cache, k, v):
    """The exception the learner's append raises on (k, v), or None when it accepted them.

    The one place the learner's code is called without `run`: here the exception itself is the answer.
    """
    try:
        method = cache.append
    except Exception:
        return None
    try:
        method(k.copy(), v.copy())
    except NotImplementedError:
        raise Reject(Verdict(False, problem=STUB_PROBLEM, hint=STUB_HINT, stub=True)) from None
    except Exception as e:  # the learner's code may raise anything; which exception is the answer here
        return e
    return None


def _unchanged_after(cache, what, before, probe):
    """The cache must carry on exactly as if the bad block never came: one more good block makes 3 positions."""
    got = _append(cache, *probe, f"appending a good block after rejecting {what}")
    want = tuple(np.concatenate([x, y], axis=1) for x, y in zip(before, probe, strict=True))
    n = _length(cache, f"after rejecting {what} and appending one good token")
    same = n == 3 and all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    if not same:
        reject(f"appending {what} raised, but the cache changed anyway: after one more good token it holds "
               f"K {got[0].shape}, V {got[1].shape} and len {n}; expected {want[0].shape} each and len 3",
               "validate both blocks before the first assignment: concatenating the keys and then failing on the "
               "values leaves K one block longer than V")


def _against_full_pass(cls):
    """Under kvlesson.step, with RoPE and H != Hkv: prefill + chunks + decode + T = 0 against one pass."""
    rng = np.random.default_rng(8)
    H, Hkv, d, D = 4, 2, 4, 8
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):  # float32: a few rounding steps of values near 1
        Wq, Wk, Wv = ((rng.standard_normal((D, n * d)) / math.sqrt(D)).astype(dtype) for n in (H, Hkv, Hkv))
        x = rng.standard_normal((11, D)).astype(dtype)
        full = step(x, Wq, Wk, Wv, KVCache(Hkv, d, dtype), H, Hkv, rope_base=10000.0)
        cache = _new(cls, Hkv, d, dtype=dtype)
        parts, start = [], 0
        for T in (4, 0, 1, 3, 1, 0, 1, 1):  # a prefill, an empty chunk, decode steps and a chunk
            case = f"kvlesson.step with your {np.dtype(dtype).name} cache at tokens {start}..{start + T}"
            parts.append(run(step, x[start:start + T], Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0, case=case))
            start += T
        err = float(np.abs(np.concatenate(parts).astype(np.float64) - full).max())
        if not err <= tol:
            reject(f"with your cache, prefill + chunks + decode differ from one full pass by {err:.3g} "
                   f"({np.dtype(dtype).name})", "compare len(cache) and the returned K after each append with what "
                                                "you expect: step rotates keys at len(cache) + i")


# ----------------------------------------------------------------------------------------------- step

class _PrivateCache:
    """A cache that follows the protocol and nothing more: its arrays are private, so there is no cache.k."""

    def __init__(self, Hkv, d, dtype):
        self.Hkv, self.d, self.dtype = Hkv, d, np.dtype(dtype)
        self._kv = KVCache(Hkv, d, dtype)

    def __len__(self):
        return len(self._kv)

    def append(self, k_new, v_new):
        return self._kv.append(k_new, v_new)

    @property
    def nbytes(self):
        return self._kv.nbytes


_CACHES = [  # every kind of cache a step must work with, by what it returns from append
    ("a KVCache", lambda Hkv, d, dtype, n: KVCache(Hkv, d, dtype)),
    ("a StaticKVCache (preallocated)", lambda Hkv, d, dtype, n: StaticKVCache(Hkv, d, n + 3, dtype)),
    ("a cache with no .k attribute", lambda Hkv, d, dtype, n: _PrivateCache(Hkv, d, dtype)),
]


@checker
def check_step(fn):
    """fn(x, Wq, Wk, Wv, cache, H, Hkv) -> [T, H*d]: project the T new tokens, append k and v to the cache,
    attend the new queries over every key append returns. No RoPE here (lesson 06 adds it)."""
    for case, H, Hkv, d, D, chunks, dtype in _step_cases():
        for kind, make in _CACHES:
            _step_run(fn, f"{case}, with {kind}", H, Hkv, d, D, chunks, dtype, make)
    return passed("one step for everything: prefill, decode, chunks onto a full cache, T = 0, MHA, GQA and MQA, "
                  "float32, with growing, preallocated and private caches alike")


check_step.reference = step


def _step_cases():
    return [
        ("a prefill of 6 tokens then decode (H=4, Hkv=2, d=4)", 4, 2, 4, 8, (6, 1, 1, 1), np.float64),
        ("chunks of 3, 2 and 4 (H=4, Hkv=2, d=4)", 4, 2, 4, 8, (3, 2, 4), np.float64),
        ("T = 0 after a prefill of 3 (H=4, Hkv=2, d=4)", 4, 2, 4, 8, (3, 0, 1), np.float64),
        ("T = 0 on an empty cache", 4, 2, 4, 8, (0, 2), np.float64),
        ("plain multi-head attention (H = Hkv = 3, d=2)", 3, 3, 2, 6, (4, 1, 2), np.float64),
        ("multi-query attention (H=4, Hkv=1, d=4)", 4, 1, 4, 8, (2, 1, 3), np.float64),
        ("float32 (H=4, Hkv=2, d=4)", 4, 2, 4, 8, (5, 1, 2), np.float32),
    ]


def _step_run(fn, case, H, Hkv, d, D, chunks, dtype, make):
    rng = np.random.default_rng(9)
    Wq, Wk, Wv = ((rng.standard_normal((D, n * d)) / math.sqrt(D)).astype(dtype) for n in (H, Hkv, Hkv))
    x = rng.standard_normal((sum(chunks), D)).astype(dtype)
    mine, ref = make(Hkv, d, dtype, sum(chunks)), KVCache(Hkv, d, dtype)
    start = 0
    for T in chunks:
        xs = x[start:start + T]
        where = f"{case}, tokens {start}..{start + T - 1}" if T else f"{case}, the empty step at {start}"
        past = tuple(a.copy() for a in (ref.k, ref.v))
        inputs = (xs.copy(), Wq.copy(), Wk.copy(), Wv.copy())
        got = run(fn, *inputs, mine, H, Hkv, case=where, crash_hint=lambda e, T=T: _step_crash_hint(e, T))
        for name, before, after in zip(("x", "Wq", "Wk", "Wv"), (xs, Wq, Wk, Wv), inputs, strict=True):
            if not np.array_equal(before, after):
                reject(f"for {where} your step changed {name} in place",
                       f"{name} belongs to the caller (the next layer or step still needs it); build new arrays")
        want = step(xs, Wq, Wk, Wv, ref, H, Hkv)
        _step_problem(got, want, where, mine, ref, xs, (Wq, Wk, Wv), past, H, Hkv)
        start += T


def _step_crash_hint(e, T):
    text = str(e)
    if isinstance(e, AttributeError) and ("'k'" in text or "'v'" in text):
        return ("attend over the K, V that cache.append returns: a cache need not have a .k attribute, and when it "
                "has one it may hold more than the keys seen so far (a preallocated buffer)")
    if T == 0:
        return ("T = 0 must work: reshape(0, H, d) is fine and kvlesson.attention returns an empty [H, 0, d]; avoid "
                "anything that needs at least one token (x[-1], a max over nothing)")
    return ("q is [H, T, d], the cache takes k, v [Hkv, T, d]: (x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2), and "
            "d = Wq.shape[1] // H")


def _step_problem(got, want, where, mine, ref, xs, W, past, H, Hkv):
    T = xs.shape[0]
    d = W[0].shape[1] // H
    n_mine = _length(mine, f"after {where}")
    if n_mine != len(ref):
        n = n_mine - (len(ref) - T)
        hint = ("append the new k and v to the cache (cache.append(k, v)) and attend over what it returns"
                if n == 0 else f"you appended {n} positions for T={T} new tokens: append the new block exactly once")
        reject(f"for {where} the cache holds {n_mine} tokens after the step; expected {len(ref)}", hint)
    if isinstance(got, (list, tuple)):
        reject(f"for {where} your step returned a {type(got).__name__}; expected a numpy array [T, H*d]", _NOT_A_LIST)
    got = as_array(got, where, "your step")
    if got.shape == (H, T, d) and got.shape != want.shape:
        reject(f"for {where} the output has shape {got.shape}; expected {want.shape} = [T, H*d]",
               "the layer hands the next projection one row per token: out.transpose(1, 0, 2).reshape(T, H*d)")
    if got.shape != want.shape:
        reject(f"for {where} the output has shape {got.shape}; expected {want.shape} = [T, H*d]",
               "return a numpy array with one row per new token: attention(...).transpose(1, 0, 2).reshape(T, H * d)")
    if got.dtype != want.dtype:
        reject(f"for {where} the output is {got.dtype}; expected {want.dtype}",
               "something upcast: float32 in, float32 out (np.sqrt(d) of a Python int is a float64 scalar)")
    tol = dict(rtol=1e-4, atol=1e-5) if want.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    if np.allclose(got, want, **tol):
        return
    for mutant, hint in _step_mutants(xs, W, past, H, Hkv, mine):
        if mutant is not None and mutant.shape == got.shape and np.allclose(got, mutant, **tol):
            reject(f"for {where} the output differs from kvlesson.step", hint)
    err = float(np.abs(got.astype(np.float64) - want).max())
    reject(f"for {where} the output differs from kvlesson.step (max abs error {err:.3g})",
           "project x with Wq, Wk, Wv, append k and v, then attention(q, K, V) over what append returned")


def _step_mutants(xs, W, past, H, Hkv, mine):
    """Wrong outputs that come from classic slips, given the cache as it was before the step."""
    Wq, Wk, Wv = W
    T, d = xs.shape[0], Wq.shape[1] // H
    heads = lambda y, n: y.reshape(T, n, d).transpose(1, 0, 2)  # noqa: E731  [n, T, d]
    flat = lambda o: o.transpose(1, 0, 2).reshape(T, H * d)  # noqa: E731
    q, k, v = heads(xs @ Wq, H), heads(xs @ Wk, Hkv), heads(xs @ Wv, Hkv)
    K, V = (np.concatenate([p, n], axis=1) for p, n in zip(past, (k, v), strict=True))
    out = []
    if isinstance(mine, StaticKVCache):  # attending over the whole preallocated buffer, zeros included
        out.append((flat(attention(q, mine.k, mine.v)),
                    "you attended over cache.k and cache.v; a preallocated cache's arrays hold all its capacity, "
                    "unused zeros included. Attend over the K, V that cache.append returns"))
    if T > 1:
        mixed = lambda y, n: y.reshape(n, T, d)  # noqa: E731  tokens and heads interleaved
        qm, km, vm = mixed(xs @ Wq, H), mixed(xs @ Wk, Hkv), mixed(xs @ Wv, Hkv)
        Km, Vm = (np.concatenate([p, n], axis=1) for p, n in zip(past, (km, vm), strict=True))
        out.append((flat(attention(qm, Km, Vm)),
                    "x @ Wq is [T, H*d]; reshape(H, T, d) interleaves tokens and heads. Reshape to [T, H, d] first, "
                    "then transpose(1, 0, 2). (Decode with T = 1 cannot show it: the test needs a prefill)"))
        out.append((attention(q, K, V).reshape(T, H * d),
                    "[H, T, d].reshape(T, H*d) interleaves heads and tokens: transpose(1, 0, 2) to [T, H, d] first"))
        out.append((flat(_top_left_attention(q, K, V)),
                    "your mask is anchored top-left (np.tril of a [T, S] array): new query i sits at S - T + i. Use "
                    "kvlesson.attention, which places it there (lesson 04 derives the mask)"))
    if past[0].shape[1]:
        out.append((flat(attention(q, k, v)),
                    "the new queries attended over the new keys only: use the K, V that cache.append returns, which "
                    "hold every cached position"))
    return out


def _top_left_attention(q, K, V):
    """Attention with np.tril(np.ones((T, S))): query i sees keys 0..i, whatever S is."""
    H, T, d = q.shape
    Hkv, S, _ = K.shape
    G = H // Hkv
    s = np.repeat(K, G, axis=0)  # [H, S, d]
    s = q @ s.transpose(0, 2, 1) / math.sqrt(d)
    s = np.where(np.tril(np.ones((T, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ np.repeat(V, G, axis=0)
