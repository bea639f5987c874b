"""The lesson 03 checkers pass right answers and name each classic wrong one."""
import numpy as np
import pytest

from kvlesson import KVCache, StaticKVCache, attention, step
from kvlesson.checks import check_kv_cache, check_step

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


class CastingCache(LessonCache):
    """Casts blocks of another float dtype into its own instead of refusing them: also fine."""

    def append(self, k_new, v_new):
        return super().append(np.asarray(k_new, self.dtype), np.asarray(v_new, self.dtype))


def static_cache(Hkv, d, dtype=np.float64):
    return StaticKVCache(Hkv, d, 32, dtype)


@pytest.mark.parametrize("cls", [KVCache, LessonCache, CastingCache, static_cache])
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
    """The card's cache: fine on good input, half-changed on bad input."""

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
        self.k = np.concatenate([self.k, k_new], axis=1)
        self.v = np.concatenate([self.v, v_new], axis=1)
        return self.k, self.v


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


class NoHkv(LessonCache):
    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        del self.Hkv


class NoLen(LessonCache):
    __len__ = None


class ReturnsList(LessonCache):
    def append(self, k_new, v_new):
        return list(super().append(k_new, v_new))


@pytest.mark.parametrize("cls, hint", [
    (OnlyNew, "holds only the 2 new tokens"),
    (Overwrites, "holds only the 2 new tokens"),
    (ForgetsToStore, "store it back on self"),
    (NewestFirst, "oldest first"),
    (PositionsFirst, "keep the positions on axis 1"),
    (NeverAdvances, "the count never moved"),
    (CountsBlocks, "count tokens"),
    (Upcasts, "dtype=dtype"),
    (NoValidation, "validate both blocks before the first assignment"),
    (ShapesOnly, "silently upcasts"),
    (AssertsShapes, "expected a ValueError"),
    (RejectsEmpty, "T = 0 is a legal step"),
    (NoNbytes, "self.k.nbytes + self.v.nbytes"),
    (NbytesMethod, "put @property above"),
    (NoHkv, "store them in __init__"),
    (NoLen, "define __len__"),
    (ReturnsList, "expected the tuple (K, V)"),
])
def test_cache_names_the_slip(cls, hint):
    v = check_kv_cache(cls)
    assert not v
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


@pytest.mark.parametrize("fn, hint", [
    (step_mixed_heads, "reshape(H, T, d) interleaves tokens and heads"),
    (step_flat_no_transpose, "interleaves heads and tokens"),
    (step_new_keys_only, "new keys only"),
    (step_no_append, "append the new k and v"),
    (step_twice, "exactly once"),
    (step_heads_out, "= [T, H*d]"),
    (step_upcast, "float32 in, float32 out"),
    (step_no_empty, "T = 0 must work"),
    (step_in_place, "changed x in place"),
    (step_wrong_weights, "max abs error"),
])
def test_step_names_the_slip(fn, hint):
    v = check_step(fn)
    assert not v
    assert hint in repr(v), repr(v)


class Stub:
    """A student copy: every method still raises."""

    def __init__(self, Hkv, d, dtype=np.float64):
        raise NotImplementedError("your turn")


def stub_step(x, Wq, Wk, Wv, cache, H, Hkv):
    raise NotImplementedError("your turn")


@pytest.mark.parametrize("checker, fn", [(check_kv_cache, Stub), (check_step, stub_step)])
def test_student_copy_gets_the_plain_message(checker, fn):
    v = checker(fn)
    assert not v
    assert "still raises NotImplementedError" in repr(v) and "replace the" in repr(v), repr(v)
