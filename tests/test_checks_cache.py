"""The lesson 03 checkers pass right answers and name each classic wrong one."""
import math

import numpy as np
import pytest

from kvlesson import KVCache, StaticKVCache, attention, step
from kvlesson.teaching.checks import check_kv_cache, check_step

# ------------------------------------------------------------------------------------------- KV cache


class LessonCache:
    """The lesson's solution: validate, then concatenate along the positions axis."""

    def __init__(self, Hkv, d, dtype=np.float64):
        self.Hkv, self.d, self.dtype = Hkv, d, np.dtype(dtype)
        self.k = np.zeros((Hkv, 0, d), self.dtype)
        self.v = np.zeros((Hkv, 0, d), self.dtype)

    def __len__(self):
        return self.k.shape[1]

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes

    def append(self, k_new, v_new):
        want = (self.Hkv, k_new.shape[1] if k_new.ndim == 3 else -1, self.d)
        if k_new.shape != want or v_new.shape != want or k_new.dtype != self.dtype or v_new.dtype != self.dtype:
            raise ValueError(f"need k_new, v_new {want} in {self.dtype}; got {k_new.shape}, {v_new.shape}")
        self.k = np.concatenate([self.k, k_new], axis=1)
        self.v = np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


def static_cache(Hkv, d, dtype=np.float64):
    return StaticKVCache(Hkv, d, 32, dtype)


@pytest.mark.parametrize("cls", [KVCache, LessonCache, static_cache])
def test_cache_passes(cls):
    v = check_kv_cache(cls)
    assert v, v


class OnlyNew(LessonCache):
    def append(self, k_new, v_new):
        super().append(k_new, v_new)
        return k_new, v_new


class Overwrites(LessonCache):
    """Forgets to concatenate: keeps only the latest block."""

    def append(self, k_new, v_new):
        self.k, self.v = k_new, v_new
        return self.k, self.v


class ForgetsToStore(LessonCache):
    def append(self, k_new, v_new):
        np.concatenate([self.k, k_new], axis=1)
        np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


class NewestFirst(LessonCache):
    def append(self, k_new, v_new):
        self.k = np.concatenate([k_new, self.k], axis=1)
        self.v = np.concatenate([v_new, self.v], axis=1)
        return self.k, self.v


class PositionsFirst(LessonCache):
    """Stores [S, Hkv, d]."""

    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.k = np.zeros((0, Hkv, d), self.dtype)
        self.v = np.zeros((0, Hkv, d), self.dtype)

    def __len__(self):
        return self.k.shape[0]

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new.transpose(1, 0, 2)], axis=0)
        self.v = np.concatenate([self.v, v_new.transpose(1, 0, 2)], axis=0)
        return self.k, self.v


class NeverAdvances(LessonCache):
    def __len__(self):
        return 0


class CountsBlocks(LessonCache):
    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.blocks = 0

    def __len__(self):
        return self.blocks

    def append(self, k_new, v_new):
        self.blocks += 1
        return super().append(k_new, v_new)


class Upcasts(LessonCache):
    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.k, self.v = np.zeros((Hkv, 0, d)), np.zeros((Hkv, 0, d))  # float64 whatever dtype says

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new], axis=1)
        self.v = np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


class NoValidation(LessonCache):
    """The growing cache with no checks: fine on good input, half-changed on bad input."""

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new], axis=1)
        self.v = np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


class ShapesOnly(LessonCache):
    """Validates shapes but lets a float64 block upcast a float32 cache."""

    def append(self, k_new, v_new):
        want = (self.Hkv, k_new.shape[1] if k_new.ndim == 3 else -1, self.d)
        if k_new.shape != want or v_new.shape != want:
            raise ValueError("bad shapes")
        return NoValidation.append(self, k_new, v_new)


class KeysDtypeOnly(LessonCache):
    """Checks the shapes of both blocks but the dtype of k_new only: float64 values slip into a float32 cache."""

    def append(self, k_new, v_new):
        want = (self.Hkv, k_new.shape[1] if k_new.ndim == 3 else -1, self.d)
        if k_new.shape != want or v_new.shape != want or k_new.dtype != self.dtype:
            raise ValueError("bad block")
        return NoValidation.append(self, k_new, v_new)


class CastsSilently(LessonCache):
    """Checks shapes, then casts any dtype into its own instead of raising ValueError as the spec asks."""

    def append(self, k_new, v_new):
        return ShapesOnly.append(self, k_new.astype(self.dtype), v_new.astype(self.dtype))


class TypeErrorForShapes(LessonCache):
    def append(self, k_new, v_new):
        try:
            return super().append(k_new, v_new)
        except ValueError as e:
            raise TypeError(str(e)) from None


class AssertsShapes(LessonCache):
    def append(self, k_new, v_new):
        assert k_new.shape == v_new.shape and k_new.shape[0] == self.Hkv and k_new.shape[2] == self.d
        assert k_new.dtype == self.dtype
        return NoValidation.append(self, k_new, v_new)


class RejectsEmpty(LessonCache):
    def append(self, k_new, v_new):
        if k_new.shape[1] == 0:
            raise ValueError("nothing to append")
        return super().append(k_new, v_new)


class NoNbytes(LessonCache):
    nbytes = None


class NbytesMethod(LessonCache):
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class NbytesRaises(LessonCache):
    @property
    def nbytes(self):
        return self.k_cache.nbytes  # a typo: there is no k_cache


class NbytesText(LessonCache):
    @property
    def nbytes(self):
        return f"{self.k.nbytes + self.v.nbytes} bytes"


class NbytesKeysOnly(LessonCache):
    @property
    def nbytes(self):
        return self.k.nbytes


class NoHkv(LessonCache):
    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        del self.Hkv


class NoDtype(LessonCache):
    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        del self.dtype

    def append(self, k_new, v_new):
        return NoValidation.append(self, k_new, v_new)


class NoLen(LessonCache):
    __len__ = None


class LenCountsHeads(LessonCache):
    def __len__(self):
        return self.k.shape[0]


class ReturnsList(LessonCache):
    def append(self, k_new, v_new):
        return list(super().append(k_new, v_new))


class NoDefaultDtype(LessonCache):
    def __init__(self, Hkv, d, dtype):
        super().__init__(Hkv, d, dtype)


CACHE_WRONG = [  # (wrong cache, words its hint must contain)
    (OnlyNew, "holds only the 2 new tokens"),
    (Overwrites, "holds only the 2 new tokens"),
    (ForgetsToStore, "store it back on self"),
    (NewestFirst, "oldest first"),
    (PositionsFirst, "keep the positions on axis 1"),
    (NeverAdvances, "the count never moved"),
    (CountsBlocks, "count tokens"),
    (LenCountsHeads, "count positions (axis 1 of K), not heads"),
    (Upcasts, "dtype=dtype"),
    (NoValidation, "validate both blocks before the first assignment"),
    (ShapesOnly, "k_new.dtype and v_new.dtype, both"),
    (KeysDtypeOnly, "k_new.dtype and v_new.dtype, both"),
    (CastsSilently, "Do not cast"),
    (TypeErrorForShapes, "expected a ValueError"),
    (AssertsShapes, "expected a ValueError"),
    (RejectsEmpty, "T = 0 is a legal step"),
    (NoNbytes, "self.k.nbytes + self.v.nbytes"),
    (NbytesMethod, "put @property above"),
    (NbytesRaises, "must work at any time"),
    (NbytesText, "text that spells a number is not one"),
    (NbytesKeysOnly, "K and V together"),
    (NoHkv, "store them in __init__"),
    (NoDtype, "store the dtype in __init__"),
    (NoLen, "define __len__"),
    (ReturnsList, "expected the tuple (K, V)"),
    (NoDefaultDtype, "cls(Hkv, d, dtype=np.float64)"),
    (LessonCache(2, 4), "pass the class by name"),
]


@pytest.mark.parametrize("cls, hint", CACHE_WRONG)
def test_cache_rejects_each_wrong_cache_with_its_hint(cls, hint):
    v = check_kv_cache(cls)
    assert not v and not v.stub
    assert hint in repr(v), repr(v)


class WrongLenOnlyWithRope(LessonCache):
    """Right by hand, but len lags one append behind: only RoPE under step can notice."""

    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.calls = 0

    def __len__(self):
        return self.k.shape[1] if self.calls < 5 else self.k.shape[1] + 1  # only the full-pass run appends 5 times

    def append(self, k_new, v_new):
        self.calls += 1
        return super().append(k_new, v_new)


def test_cache_full_pass_catches_what_the_hand_checks_miss():
    v = check_kv_cache(WrongLenOnlyWithRope)
    assert not v
    assert "differ from one full pass" in repr(v), repr(v)


# ----------------------------------------------------------------------------------------------- step


def my_step(x, Wq, Wk, Wv, cache, H, Hkv):
    T = x.shape[0]
    d = Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    k = (x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2)
    v = (x @ Wv).reshape(T, Hkv, d).transpose(1, 0, 2)
    K, V = cache.append(k, v)
    return attention(q, K, V).transpose(1, 0, 2).reshape(T, H * d)


@pytest.mark.parametrize("fn", [my_step, step])
def test_step_passes(fn):
    v = check_step(fn)
    assert v, v


def step_mixed_heads(x, Wq, Wk, Wv, cache, H, Hkv):
    T = x.shape[0]
    d = Wq.shape[1] // H
    q, k, v = (x @ Wq).reshape(H, T, d), (x @ Wk).reshape(Hkv, T, d), (x @ Wv).reshape(Hkv, T, d)
    K, V = cache.append(k, v)
    return attention(q, K, V).transpose(1, 0, 2).reshape(T, H * d)


def step_flat_no_transpose(x, Wq, Wk, Wv, cache, H, Hkv):
    T, d = x.shape[0], Wq.shape[1] // H
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv).reshape(T, H, d).transpose(1, 0, 2).reshape(T, H * d)


def step_new_keys_only(x, Wq, Wk, Wv, cache, H, Hkv):
    T = x.shape[0]
    d = Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    k = (x @ Wk).reshape(T, Hkv, d).transpose(1, 0, 2)
    v = (x @ Wv).reshape(T, Hkv, d).transpose(1, 0, 2)
    cache.append(k, v)
    return attention(q, k, v).transpose(1, 0, 2).reshape(T, H * d)


def step_no_append(x, Wq, Wk, Wv, cache, H, Hkv):
    return my_step(x, Wq, Wk, Wv, KVCache(cache.Hkv, cache.d, cache.dtype), H, Hkv)


def step_twice(x, Wq, Wk, Wv, cache, H, Hkv):
    d = Wq.shape[1] // H
    T = x.shape[0]
    cache.append(*(((x @ W).reshape(T, Hkv, d).transpose(1, 0, 2)) for W in (Wk, Wv)))
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv)


def step_heads_out(x, Wq, Wk, Wv, cache, H, Hkv):
    T, d = x.shape[0], Wq.shape[1] // H
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv).reshape(T, H, d).transpose(1, 0, 2)


def step_upcast(x, Wq, Wk, Wv, cache, H, Hkv):
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv).astype(np.float64)


def step_no_empty(x, Wq, Wk, Wv, cache, H, Hkv):
    if x.shape[0] == 0:
        raise IndexError("no tokens")
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv)


def step_in_place(x, Wq, Wk, Wv, cache, H, Hkv):
    out = my_step(x, Wq, Wk, Wv, cache, H, Hkv)
    x *= 0
    return out


def step_wrong_weights(x, Wq, Wk, Wv, cache, H, Hkv):
    return my_step(x, Wq, Wv, Wk, cache, H, Hkv)


def step_reads_cache_k(x, Wq, Wk, Wv, cache, H, Hkv):
    """Ignores what append returns and reads cache.k: right for a KVCache, wrong for a preallocated one."""
    T, d = x.shape[0], Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    cache.append(*((x @ W).reshape(T, Hkv, d).transpose(1, 0, 2) for W in (Wk, Wv)))
    return attention(q, cache.k, cache.v).transpose(1, 0, 2).reshape(T, H * d)


def step_reads_cache_k_by_length(x, Wq, Wk, Wv, cache, H, Hkv):
    """Reads cache.k[:, :len(cache)]: right for both kvlesson caches, but a cache need not have .k at all."""
    T, d = x.shape[0], Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    cache.append(*((x @ W).reshape(T, Hkv, d).transpose(1, 0, 2) for W in (Wk, Wv)))
    S = len(cache)
    return attention(q, cache.k[:, :S], cache.v[:, :S]).transpose(1, 0, 2).reshape(T, H * d)


def step_top_left_mask(x, Wq, Wk, Wv, cache, H, Hkv):
    """Its own attention with np.tril(np.ones((T, S))): right for a prefill and for decode, wrong for chunks."""
    T, d = x.shape[0], Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    K, V = cache.append(*((x @ W).reshape(T, Hkv, d).transpose(1, 0, 2) for W in (Wk, Wv)))
    if T == 0:
        return np.zeros((0, H * d), x.dtype)
    K, V = np.repeat(K, H // Hkv, axis=0), np.repeat(V, H // Hkv, axis=0)
    s = q @ K.transpose(0, 2, 1) / math.sqrt(d)
    if T > 1:
        s = np.where(np.tril(np.ones((T, K.shape[1]), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return ((p / p.sum(axis=-1, keepdims=True)) @ V).transpose(1, 0, 2).reshape(T, H * d)


def step_scales_weights_in_place(x, Wq, Wk, Wv, cache, H, Hkv):
    Wq *= 1.0
    Wq[0, 0] += 0.0
    Wk /= 1.0 + 1e-3  # "normalises" a weight the caller still needs
    return my_step(x, Wq, Wk, Wv, cache, H, Hkv)


def step_h_heads_for_keys(x, Wq, Wk, Wv, cache, H, Hkv):
    T, d = x.shape[0], Wq.shape[1] // H
    q = (x @ Wq).reshape(T, H, d).transpose(1, 0, 2)
    k = (x @ Wk).reshape(T, H, d).transpose(1, 0, 2)
    v = (x @ Wv).reshape(T, H, d).transpose(1, 0, 2)
    K, V = cache.append(k, v)
    return attention(q, K, V).transpose(1, 0, 2).reshape(T, H * d)


STEP_WRONG = [  # (wrong step, words its hint must contain)
    (step_mixed_heads, "reshape(H, T, d) interleaves tokens and heads"),
    (step_flat_no_transpose, "interleaves heads and tokens"),
    (step_new_keys_only, "new keys only"),
    (step_no_append, "append the new k and v"),
    (step_twice, "exactly once"),
    (step_heads_out, "= [T, H*d]"),
    (step_upcast, "float32 in, float32 out"),
    (step_no_empty, "T = 0 must work"),
    (step_in_place, "changed x in place"),
    (step_scales_weights_in_place, "changed Wk in place"),
    (step_wrong_weights, "max abs error"),
    (step_reads_cache_k, "you attended over cache.k and cache.v"),
    (step_reads_cache_k_by_length, "a cache need not have a .k attribute"),
    (step_top_left_mask, "anchored top-left"),
    (step_h_heads_for_keys, "(x @ Wk).reshape(T, Hkv, d)"),
    (lambda x, Wq, Wk, Wv, cache, H, Hkv: my_step(x, Wq, Wk, Wv, cache, H, Hkv).tolist(), "what .tolist() gives"),
]


@pytest.mark.parametrize("fn, hint", STEP_WRONG)
def test_step_rejects_each_wrong_step_with_its_hint(fn, hint):
    v = check_step(fn)
    assert not v and not v.stub
    assert hint in repr(v), repr(v)


class Stub:
    """A student copy: every method still raises."""

    def __init__(self, Hkv, d, dtype=np.float64):
        raise NotImplementedError("your turn")


def stub_step(x, Wq, Wk, Wv, cache, H, Hkv):
    raise NotImplementedError("your turn")


@pytest.mark.parametrize("checker, fn", [(check_kv_cache, Stub), (check_step, stub_step)])
def test_student_copy_gets_the_stub_verdict(checker, fn):
    v = checker(fn)
    assert not v and v.stub
    assert "still raises NotImplementedError" in repr(v) and "replace the" in repr(v), repr(v)


@pytest.mark.parametrize("checker", [check_kv_cache, check_step])
def test_each_checker_passes_its_own_reference(checker):
    """Lessons fall back on `.reference` (through yours_or_ours) while an exercise is unsolved."""
    assert checker(checker.reference)
