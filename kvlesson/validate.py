"""Argument checks shared by the whole package.

Every public function checks what it was given before it computes anything or changes any state, and a
bad argument gets an error that names it:
  - TypeError when the kind of thing is wrong (a float where a count belongs, an integer array where
    the maths needs floating point, a bool passed as a number);
  - ValueError when the kind is right but the value is not (a negative size, a NaN base, a ragged list).

Integers go through operator.index, so 3, np.int64(3) and any other true integer pass while 2.5 and "3"
do not; bool is refused even though Python counts it as an int, because window=True is never meant.
"""
import math
import numbers
import operator

import numpy as np

__all__ = ["integer", "window", "positive", "floats", "same_dtype", "token_ids", "request", "real",
           "parents"]


def integer(name, value, minimum=0):
    """-> int. TypeError unless `value` is a true integer (not a bool); ValueError below `minimum`."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not a bool; got {name}={value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer; got {name}={value!r} ({type(value).__name__})") from None
    if n < minimum:
        raise ValueError(f"{name} must be at least {minimum}; got {name}={n}")
    return n


def window(value, name="window"):
    """-> None or an int >= 1: how many positions a query sees, itself included."""
    return None if value is None else integer(name, value, minimum=1)


_window = window  # for attention_inputs, whose argument has that name


def positive(name, value):
    """-> float. A finite real number above zero (a RoPE base, an epsilon); bool refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {name}={value!r} ({type(value).__name__})")
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be finite and above 0; got {name}={value!r}")
    return x


def real(name, value, minimum=-math.inf):
    """-> float. A finite real number of at least `minimum` (an arrival time, a temperature); bool refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {name}={value!r} ({type(value).__name__})")
    x = float(value)
    if not (math.isfinite(x) and x >= minimum):
        raise ValueError(f"{name} must be finite and at least {minimum:g}; got {name}={value!r}")
    return x


def floats(name, x):
    """-> a numpy array of a floating dtype (float16, float32 or float64), not copied when it already is one.

    A list of Python floats becomes float64, as numpy makes it. Integer, bool and complex arrays are refused
    rather than cast: integers would silently truncate results, and the caller should choose the precision.
    """
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except (ValueError, TypeError) as e:  # a ragged nested list
            raise ValueError(f"{name} is not a rectangular array of numbers ({e})") from None
    if x.dtype.kind != "f":
        if x.dtype.kind == "O":
            raise ValueError(f"{name} is not a rectangular array of numbers (numpy made it dtype=object)")
        raise TypeError(f"{name} must hold floating-point numbers; got dtype {x.dtype}. "
                        f"Cast it first, e.g. {name}.astype(np.float32)")
    return x


def same_dtype(**arrays):
    """Raise ValueError unless every named array has one dtype; mixing would upcast silently."""
    dtypes = {name: a.dtype for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} {dt}" for name, dt in dtypes.items())
        raise ValueError(f"need one dtype for all of them; got {listed} (cast explicitly)")


def token_ids(name, ids, vocab=None):
    """-> int64 [T]: every id a true integer (not a bool) in [0, vocab); TypeError or ValueError naming the bad ones.

    A negative id would index the token table from its end and quietly run the wrong token, so it is refused.
    vocab=None checks only that no id is negative (a text's ids, whatever table they index)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"{name} must be a 1-D array of integer token ids; got {ids.dtype} {ids.shape}")
        out = ids.astype(np.int64, copy=False)
    else:
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of token ids, not text (encode it first); got {ids[:20]!r}")
        try:
            items = list(ids)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of token ids; got {type(ids).__name__}") from None
        out = np.array([_token(name, i) for i in items], dtype=np.int64)
    bad = out[(out < 0) | (out >= vocab)] if vocab is not None else out[out < 0]
    if bad.size:
        where = f"lie in [0, {vocab})" if vocab is not None else "be at least 0"
        raise ValueError(f"{name} must {where}; got {bad[:5].tolist()}")
    return out


def _token(name, i):
    """One id of a list -> int; a bool, a float, a string or an array (a list of rows) is a TypeError naming it."""
    if isinstance(i, (bool, np.bool_)):
        raise TypeError(f"{name} must hold integer token ids; got {i!r} (bool)")
    try:
        return operator.index(i)
    except TypeError:
        what = (f"an array of shape {i.shape} (one id per token, not a row of them)" if isinstance(i, np.ndarray)
                else f"{i!r} ({type(i).__name__})")
        raise TypeError(f"{name} must hold integer token ids; got {what}") from None


def parents(value, name="parents"):
    """-> list[int]: a tree of T nodes, parents[i] the node before i that i follows, or -1 for a root (a child of
    the last cached token). Each parent comes before its child, so no node is its own ancestor and every walk up
    the tree ends: a node that is its own parent, or a cycle, is refused by name."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a list of T integers; got {type(value).__name__}")
    out = [integer(f"{name}[{i}]", p, minimum=-1) for i, p in enumerate(value)]
    for i, p in enumerate(out):
        if p >= i:
            raise ValueError(f"{name}[{i}]={p}: a node's parent must come before it (-1 for the last cached token)")
    return out


def request(ids, max_new_tokens, vocab, max_len, *, name="ids", at_least=0):
    """-> (ids as a list of ints, n): a prompt of at least one token id in [0, vocab), and max_new_tokens, an integer
    of at least `at_least`, such that the prompt and the new tokens fit a context of max_len positions. The one check
    every way of generating makes (Model.generate, both engines, speculative decoding) before anything moves."""
    ids = token_ids(name, ids, vocab).tolist()
    n = integer("max_new_tokens", max_new_tokens, minimum=at_least)
    if not ids:
        raise ValueError(f"{name} is empty: need at least one prompt token to predict the next one")
    if len(ids) + n > max_len:
        raise ValueError(f"{name}: {len(ids)} prompt + max_new_tokens={n} exceed the context of {max_len} positions")
    return ids, n


def attention_inputs(q, k, v, window=None, *, offset=True):
    """-> (q, k, v, window), checked: q [H, T, d], k and v [Hkv, S, d] of one float dtype, H a multiple of Hkv,
    T <= S, and a window that is None or a positive integer. Every attention in the package checks its inputs here.
    offset=False drops T <= S, for queries and keys whose positions are given apiece (online.partial_attention)."""
    q, k, v = floats("q", q), floats("k", k), floats("v", v)
    window = _window(window)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"need q [H, T, d] and k, v [Hkv, S, d]; got q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
    (H, T, d), (Hkv, S, dk) = q.shape, k.shape
    if d != dk:
        raise ValueError(f"head dims differ: q {q.shape} has d={d}, k {k.shape} has d={dk}")
    if d == 0:
        raise ValueError(f"the head dim d must be at least 1; got q {q.shape}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"H={H} query heads must be a multiple of Hkv={Hkv} KV heads (q {q.shape}, k {k.shape})")
    if offset and T > S:
        raise ValueError(f"more queries than keys: T={T} > S={S} (q {q.shape}, k {k.shape})")
    same_dtype(q=q, k=k, v=v)
    return q, k, v, window
