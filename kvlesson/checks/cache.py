"""Checkers for lesson 03: a growing KV cache, and `step`, the one function for prefill and decode.

check_kv_cache drives the learner's class by hand first (append, len, nbytes, T = 0, float32,
bad input), where each classic slip has a clear symptom, then runs it under kvlesson.step with
RoPE against one full pass. check_step runs the learner's step against kvlesson's on a prefill,
decode, chunks and T = 0, and recognises the reshapes that only go wrong when T > 1.
"""
import numpy as np

from kvlesson import KVCache, attention, step
from kvlesson.checks._verdict import call, failed, passed

__all__ = ["check_kv_cache", "check_step"]


# ------------------------------------------------------------------------------------------- KV cache

def check_kv_cache(cls):
    """cls(Hkv, d, dtype=np.float64) -> a cache with attributes Hkv, d, dtype, append(k_new, v_new) -> (K, V)
    with K, V [Hkv, S, d] oldest first, len() = tokens seen, nbytes = bytes held; bad input raises ValueError
    and changes nothing."""
    for probe in (_protocol, _empty_append, _float32, _bad_input, _against_full_pass):
        problem = probe(cls)
        if problem is not None:
            return problem
    return passed("your cache appends along the positions axis, counts tokens, keeps its dtype, ignores T = 0, "
                  "refuses bad blocks without changing, and prefill + chunks + decode match one full pass")


def _blocks(T, Hkv=2, d=4, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((Hkv, T, d)).astype(dtype) for _ in range(2))  # [Hkv, T, d] each


def _stub(bad):
    """True for the Verdict `call` makes when a student copy still raises NotImplementedError: pass it on as is."""
    return bad is not None and "NotImplementedError" in bad.message


def _raised(bad):
    """'ValueError: ...' from the failed Verdict that `call` makes of an exception (its hint dropped)."""
    return bad.message.split("\n")[0].split("raised ", 1)[-1]


def _new(cls, *args, **kwargs):
    cache, bad = call(cls, *args, **kwargs)
    if _stub(bad):
        return None, bad
    if bad is not None:
        return None, failed(f"creating your cache as {cls.__name__}{args} raised {_raised(bad)}",
                            "the constructor is cls(Hkv, d, dtype=np.float64)")
    return cache, None


def _length(cache):
    n, bad = call(len, cache)
    if _stub(bad):
        return None, bad
    return (None, failed("len(cache) raised " + _raised(bad),
                         "define __len__ to return the number of tokens seen so far")) if bad is not None else (n, None)


def _append(cache, k, v, what):
    got, bad = call(cache.append, k, v)
    if _stub(bad):
        return None, bad
    if bad is not None:
        return None, failed(f"{what}: append raised {_raised(bad)}")
    if not isinstance(got, tuple) or len(got) != 2:
        return None, failed(f"{what}: append returned {type(got).__name__}; expected the tuple (K, V)",
                            "return self.k, self.v: the keys and values the new queries attend over")
    return tuple(np.asarray(a) for a in got), None


def _protocol(cls):
    """Two appends by hand: shapes, order, length and bytes."""
    a, b = _blocks(3, seed=1), _blocks(2, seed=2)
    cache, bad = _new(cls, 2, 4)
    if bad is not None:
        return bad
    n, bad = _length(cache)
    if bad is not None:
        return bad
    if n != 0:
        return failed(f"a new cache has len {n}; expected 0", "nothing has been seen yet")
    for name in ("Hkv", "d"):
        if getattr(cache, name, None) != {"Hkv": 2, "d": 4}[name]:
            return failed(f"cache.{name} is {getattr(cache, name, 'missing')!r}; expected {2 if name == 'Hkv' else 4}",
                          "step reads cache.Hkv and cache.d to check the layer fits: store them in __init__")
    first, bad = _append(cache, *a, "appending 3 tokens to an empty cache")
    if bad is not None:
        return bad
    problem = _block_problem(first, a, "after appending 3 tokens [Hkv=2, T=3, d=4] to an empty cache", 3)
    if problem is not None:
        return problem
    second, bad = _append(cache, *b, "appending 2 more tokens")
    if bad is not None:
        return bad
    want = tuple(np.concatenate([x, y], axis=1) for x, y in zip(a, b, strict=True))
    problem = _second_block_problem(second, want, a, b)
    if problem is not None:
        return problem
    return _count_problem(cache, 5, "after 3 + 2 tokens", want)


def _block_problem(got, want, when, S):
    for name, g, w in zip("KV", got, want, strict=True):
        if g.shape == (w.shape[1], w.shape[0], w.shape[2]) and g.shape != w.shape:
            return failed(f"{when}, {name} has shape {g.shape}; expected {w.shape} = [Hkv, S, d]",
                          "keep the positions on axis 1: start from np.zeros((Hkv, 0, d)) and concatenate with "
                          "axis=1, the layout attention reads")
        if g.ndim == 3 and g.shape[1] == 0 and w.shape[1] > 0:
            return failed(f"{when}, {name} is empty; expected {w.shape} = [Hkv, S={S}, d]",
                          "np.concatenate returns a new array: store it back on self before returning it")
        if g.shape != w.shape:
            return failed(f"{when}, {name} has shape {g.shape}; expected {w.shape} = [Hkv, S={S}, d]",
                          "K and V hold every position seen so far, on axis 1")
        if not np.array_equal(g, w):
            return failed(f"{when}, {name} does not hold the appended values",
                          "append k_new to the keys and v_new to the values, unchanged")
    return None


def _second_block_problem(got, want, a, b):
    when = "after appending 3 tokens and then 2"
    for name, g, w, old, new in zip("KV", got, want, a, b, strict=True):
        if g.shape == new.shape and np.array_equal(g, new):
            return failed(f"{when}, {name} holds only the 2 new tokens; expected all 5",
                          "the new queries attend over the whole past: concatenate the new block onto the stored "
                          "one (self.k = np.concatenate([self.k, k_new], axis=1)) and return the result")
        if g.shape == old.shape and np.array_equal(g, old):
            return failed(f"{when}, {name} still holds only the first 3 tokens",
                          "store the concatenated array back on self: np.concatenate returns a new array")
        if g.shape == w.shape and np.array_equal(g, np.concatenate([new, old], axis=1)):
            return failed(f"{when}, {name} has the new tokens first",
                          "oldest first: np.concatenate([self.k, k_new], axis=1), so position p sits at index p")
    return _block_problem(got, want, when, 5)


def _count_problem(cache, n_want, when, want):
    n, bad = _length(cache)
    if bad is not None:
        return bad
    if n != n_want:
        hint = ("len must count tokens (positions, axis 1), not blocks or heads" if n in (2, 3, 10)
                else "advance the count by T, the number of new positions, on every append")
        if n == 0:
            hint = "the count never moved: add T = k_new.shape[1] on every append (RoPE and the mask need it)"
        return failed(f"{when} len(cache) is {n}; expected {n_want}", hint)
    nbytes = getattr(cache, "nbytes", None)
    if callable(nbytes):
        return failed("cache.nbytes is a method; expected a number",
                      "put @property above `def nbytes(self)`, so cache.nbytes reads like numpy's array.nbytes")
    expected = sum(a.nbytes for a in want)
    held = [getattr(cache, name, None) for name in ("k", "v")]
    if all(isinstance(a, np.ndarray) for a in held):  # a preallocated buffer holds more than it has filled
        expected = max(expected, sum(a.nbytes for a in held))
    if nbytes != expected:
        return failed(f"{when} cache.nbytes is {nbytes!r}; expected {expected} (K and V, {want[0].shape} each, "
                      f"{want[0].dtype})",
                      "nbytes is the bytes held by K and V together: self.k.nbytes + self.v.nbytes (a property)")
    return None


def _empty_append(cls):
    """T = 0 is a legal step (an empty chunk): it returns what is there and changes nothing."""
    a = _blocks(3, seed=3)
    cache, bad = _new(cls, 2, 4)
    if bad is not None:
        return bad
    _, bad = _append(cache, *a, "appending 3 tokens")
    if bad is not None:
        return bad
    got, bad = _append(cache, *_blocks(0), "appending an empty block [Hkv=2, T=0, d=4]")
    if _stub(bad):
        return bad
    if bad is not None:
        return failed(bad.message.removeprefix("NOT YET: ").split("\n")[0],
                      "T = 0 is a legal step (an empty chunk of a prefill): concatenating nothing is fine, so do not "
                      "reject it")
    problem = _block_problem(got, a, "after an empty append onto 3 tokens", 3)
    if problem is not None:
        return problem
    return _count_problem(cache, 3, "after an empty append onto 3 tokens", a)


def _float32(cls):
    cache, bad = _new(cls, 2, 4, dtype=np.float32)
    if bad is not None:
        return bad
    blocks = (_blocks(2, dtype=np.float32, seed=4), _blocks(1, dtype=np.float32, seed=5))
    for n, blk in enumerate(blocks):
        got, bad = _append(cache, *blk, "appending float32 blocks to a float32 cache")
        if bad is not None:
            return bad
        if got[0].dtype != np.float32 or got[1].dtype != np.float32:
            return failed(f"a float32 cache hands back {got[0].dtype} keys after {n + 1} append(s)",
                          "np.zeros((Hkv, 0, d)) is float64 unless told otherwise, and concatenating float32 onto "
                          "float64 upcasts: create the empty arrays with dtype=dtype")
    return None


def _bad_input(cls):
    """A rejected block must raise ValueError and leave the cache exactly as it was."""
    k1, v1 = _blocks(1, seed=7)
    bad_blocks = [
        ("keys [2, 1, 4] with values [2, 1, 5] (d differs)", k1, np.zeros((2, 1, 5)), np.float64),
        ("keys [2, 1, 4] with values [2, 2, 4] (T differs)", k1, np.zeros((2, 2, 4)), np.float64),
        ("keys and values [3, 1, 4] (3 KV heads for a 2-head cache)", np.zeros((3, 1, 4)), np.zeros((3, 1, 4)),
         np.float64),
        ("keys and values [1, 2, 4] laid out [T, Hkv, d]", np.zeros((1, 2, 4)), np.zeros((1, 2, 4)), np.float64),
        ("float64 keys and values into a float32 cache", k1, v1, np.float32),
    ]
    for what, k_bad, v_bad, dtype in bad_blocks:
        cache, bad = _new(cls, 2, 4, dtype=dtype)
        if bad is not None:
            return bad
        a, c = _blocks(2, dtype=dtype, seed=6), _blocks(1, dtype=dtype, seed=10)
        _, bad = _append(cache, *a, "appending 2 tokens")
        if bad is not None:
            return bad
        got, err = call(cache.append, k_bad, v_bad)
        if _stub(err):
            return err
        if err is None and dtype == np.float32 and np.asarray(got[0]).dtype == np.float32:
            continue  # accepted and cast into the cache's own dtype: fine too
        problem = _rejection_problem(cache, err, what, a, c)
        if problem is not None:
            return problem
    return None


def _rejection_problem(cache, err, what, before, probe):
    if err is None:
        hint = ("concatenating float64 onto float32 silently upcasts the whole cache: check the dtype (or cast "
                "k_new to self.dtype)" if "float32" in what else
                "check the block before touching any state: k_new and v_new must both be [Hkv, T, d] for this "
                "cache's Hkv and d; raise ValueError naming the shapes otherwise")
        return failed(f"appending {what} did not raise", hint)
    if "ValueError" not in err.message:
        return failed(f"appending {what} raised {_raised(err)}; expected a ValueError",
                      "check the shapes yourself and raise ValueError with a message that names them")
    # the cache must carry on exactly as if the bad block never came: one more good block makes 3 positions
    got, bad = _append(cache, *probe, f"appending a good block after rejecting {what}")
    if bad is not None:
        return bad
    want = tuple(np.concatenate([x, y], axis=1) for x, y in zip(before, probe, strict=True))
    n, bad = _length(cache)
    if bad is not None:
        return bad
    same = n == 3 and all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    if not same:
        return failed(f"appending {what} raised, but the cache changed anyway: after one more good token it holds "
                      f"K {got[0].shape}, V {got[1].shape} and len {n}; expected {want[0].shape} each and len 3",
                      "validate both blocks before the first assignment: concatenating the keys and then failing "
                      "on the values leaves K one block longer than V")
    return None


def _against_full_pass(cls):
    """Under kvlesson.step, with RoPE and H != Hkv: prefill + chunks + decode + T = 0 against one pass."""
    rng = np.random.default_rng(8)
    H, Hkv, d, D = 4, 2, 4, 8
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        Wq, Wk, Wv = ((rng.standard_normal((D, n * d)) / np.sqrt(D)).astype(dtype) for n in (H, Hkv, Hkv))
        x = rng.standard_normal((11, D)).astype(dtype)
        full = step(x, Wq, Wk, Wv, KVCache(Hkv, d, dtype), H, Hkv, rope_base=10000.0)
        cache, bad = _new(cls, Hkv, d, dtype=dtype)
        if bad is not None:
            return bad
        parts, start = [], 0
        for T in (4, 0, 1, 3, 1, 0, 1, 1):  # a prefill, an empty chunk, decode steps and a chunk
            out, bad = call(step, x[start:start + T], Wq, Wk, Wv, cache, H, Hkv, rope_base=10000.0)
            if _stub(bad):
                return bad
            if bad is not None:
                return failed(f"kvlesson.step with your cache raised at tokens {start}..{start + T}: "
                              + _raised(bad))
            parts.append(out)
            start += T
        err = float(np.abs(np.concatenate(parts) - full).max())
        if err > tol:
            return failed(f"with your cache, prefill + chunks + decode differ from one full pass by {err:.3g} "
                          f"({np.dtype(dtype).name})", "compare len(cache) and the returned K after each append with "
                                                       "what you expect: step rotates keys at len(cache) + i")
    return None


# ----------------------------------------------------------------------------------------------- step

def check_step(fn):
    """fn(x, Wq, Wk, Wv, cache, H, Hkv) -> [T, H*d]: project the T new tokens, append k and v to the cache,
    attend the new queries over every cached key. No RoPE here (lesson 06 adds it)."""
    for case, H, Hkv, d, D, chunks, dtype in _step_cases():
        problem = _step_run(fn, case, H, Hkv, d, D, chunks, dtype)
        if problem is not None:
            return problem
    return passed("one step for everything: prefill, decode, chunks onto a full cache, T = 0, MHA and GQA, float32")


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


def _step_run(fn, case, H, Hkv, d, D, chunks, dtype):
    rng = np.random.default_rng(9)
    Wq, Wk, Wv = ((rng.standard_normal((D, n * d)) / np.sqrt(D)).astype(dtype) for n in (H, Hkv, Hkv))
    x = rng.standard_normal((sum(chunks), D)).astype(dtype)
    mine, ref = KVCache(Hkv, d, dtype), KVCache(Hkv, d, dtype)
    start = 0
    for T in chunks:
        xs = x[start:start + T]
        where = f"{case}, tokens {start}..{start + T - 1}" if T else f"{case}, the empty step at {start}"
        past = (mine.k.copy(), mine.v.copy())
        x_in = xs.copy()
        got, bad = call(fn, x_in, Wq, Wk, Wv, mine, H, Hkv)
        if bad is not None:
            return _step_crash(bad, where, T)
        if not np.array_equal(x_in, xs):
            return failed(f"for {where} your step changed x in place", "x belongs to the caller; build new arrays")
        want = step(xs, Wq, Wk, Wv, ref, H, Hkv)
        problem = _step_problem(np.asarray(got), want, where, mine, ref, xs, (Wq, Wk, Wv), past, H, Hkv)
        if problem is not None:
            return problem
        start += T
    return None


def _step_crash(bad, where, T):
    if _stub(bad):
        return bad
    first = bad.message.removeprefix("NOT YET: ").split("\n")[0]
    if T == 0:
        return failed(f"for {where} {first}",
                      "T = 0 must work: reshape(0, H, d) is fine and kvlesson.attention returns an empty [H, 0, d]; "
                      "avoid anything that needs at least one token (x[-1], a max over nothing)")
    return failed(f"for {where} {first}", "q is [H, T, d], the cache takes k, v [Hkv, T, d]: "
                                          "(x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2)")


def _step_problem(got, want, where, mine, ref, xs, W, past, H, Hkv):
    T = xs.shape[0]
    d = W[0].shape[1] // H
    if len(mine) != len(ref):
        n = len(mine) - (len(ref) - T)
        hint = ("append the new k and v to the cache (cache.append(k, v)) and attend over what it returns"
                if n == 0 else f"you appended {n} positions for T={T} new tokens: append the new block exactly once")
        return failed(f"for {where} the cache holds {len(mine)} tokens after the step; expected {len(ref)}", hint)
    if got.shape == (H, T, d) and got.shape != want.shape:
        return failed(f"for {where} the output has shape {got.shape}; expected {want.shape} = [T, H*d]",
                      "the layer hands the next projection one row per token: out.transpose(1, 0, 2).reshape(T, H*d)")
    if got.shape != want.shape:
        return failed(f"for {where} the output has shape {got.shape}; expected {want.shape} = [T, H*d]")
    if got.dtype != want.dtype:
        return failed(f"for {where} the output is {got.dtype}; expected {want.dtype}",
                      "something upcast: float32 in, float32 out (np.sqrt(d) of a Python int is a float64 scalar)")
    tol = dict(rtol=1e-4, atol=1e-5) if want.dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    if np.allclose(got, want, **tol):
        return None
    for mutant, hint in _step_mutants(xs, W, past, H, Hkv):
        if mutant.shape == got.shape and np.allclose(got, mutant, **tol):
            return failed(f"for {where} the output differs from kvlesson.step", hint)
    err = float(np.abs(got.astype(np.float64) - want).max())
    return failed(f"for {where} the output differs from kvlesson.step (max abs error {err:.3g})",
                  "project x with Wq, Wk, Wv, append k and v, then attention(q, K, V) over what append returned")


def _step_mutants(xs, W, past, H, Hkv):
    """Wrong outputs that come from classic slips, given the cache as it was before the step."""
    Wq, Wk, Wv = W
    T, d = xs.shape[0], Wq.shape[1] // H
    heads = lambda y, n: y.reshape(T, n, d).transpose(1, 0, 2)  # noqa: E731  [n, T, d]
    mixed = lambda y, n: y.reshape(n, T, d)  # noqa: E731  tokens and heads interleaved
    q, k, v = heads(xs @ Wq, H), heads(xs @ Wk, Hkv), heads(xs @ Wv, Hkv)
    K, V = (np.concatenate([p, n], axis=1) for p, n in zip(past, (k, v), strict=True))
    flat = lambda o: o.transpose(1, 0, 2).reshape(T, H * d)  # noqa: E731
    out = []
    if T > 1:
        qm, km, vm = mixed(xs @ Wq, H), mixed(xs @ Wk, Hkv), mixed(xs @ Wv, Hkv)
        Km, Vm = (np.concatenate([p, n], axis=1) for p, n in zip(past, (km, vm), strict=True))
        out.append((flat(attention(qm, Km, Vm)),
                    "x @ Wq is [T, H*d]; reshape(H, T, d) interleaves tokens and heads. Reshape to [T, H, d] first, "
                    "then transpose(1, 0, 2). (Decode with T = 1 cannot show it: the test needs a prefill)"))
        out.append((attention(q, K, V).reshape(T, H * d),
                    "[H, T, d].reshape(T, H*d) interleaves heads and tokens: transpose(1, 0, 2) to [T, H, d] first"))
    if past[0].shape[1]:
        out.append((flat(attention(q, k, v)),
                    "the new queries attended over the new keys only: use the K, V that cache.append returns, which "
                    "hold every cached position"))
    return out
