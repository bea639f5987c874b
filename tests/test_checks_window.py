"""The lesson 07 checkers pass right answers and reject each wrong one with its own hint.

check_window_mask is the one window-mask checker of the series (lesson 04 previews the bound, lesson 07's
exercise writes it). check_window_cache is fed caches with one classic bug each. Junk answers are fuzzed for
every checker in test_checks_junk.py.
"""
import numpy as np
import pytest

from kvlesson import KVCache, WindowKVCache, attention, causal_mask
from kvlesson.teaching.checks import check_window_cache, check_window_mask

# ---------------------------------------------------------------------------------------------- window mask


def positions(T, S):
    return np.arange(S - T, S)[:, None], np.arange(S)[None, :]  # [T, 1] query positions, [1, S] key positions


def window_right(T, S, W):
    p, j = positions(T, S)
    return (j <= p) & (j > p - W)


def window_as_difference_of_trils(T, S, W):
    ones = np.ones((T, S), dtype=bool)
    return np.tril(ones, k=S - T) & ~np.tril(ones, k=S - T - W)


def window_ignored(T, S, W):
    return causal_mask(T, S)


def window_top_left(T, S, W):
    return np.tril(np.ones((T, S), bool)) & ~np.tril(np.ones((T, S), bool), -W)


def window_T_as_offset(T, S, W):
    p, j = np.arange(T, 2 * T)[:, None], np.arange(S)[None, :]
    return (j <= p) & (j > p - W)


def window_lower_bound_without_offset(T, S, W):
    p, j = positions(T, S)
    return (j <= p) & (j > np.arange(T)[:, None] - W)


def window_one_too_wide(T, S, W):
    p, j = positions(T, S)
    return (j <= p) & (j >= p - W)


def window_one_too_narrow(T, S, W):
    p, j = positions(T, S)
    return (j <= p) & (j > p - W + 1)


def window_no_causal_bound(T, S, W):
    p, j = positions(T, S)
    return j > p - W


def window_strict_causal(T, S, W):
    p, j = positions(T, S)
    return (j < p) & (j > p - W)


def window_last_W_keys(T, S, W):
    """One window for the whole chunk: right for the newest query only."""
    p, j = positions(T, S)
    return (j <= p) & (j >= S - W)


def window_int(T, S, W):
    return causal_mask(T, S, W).astype(int)


def window_square(T, S, W):
    return causal_mask(S, S, W)


def test_window_mask_passes_right_answers():
    for fn in (window_right, window_as_difference_of_trils, causal_mask):
        verdict = check_window_mask(fn)
        assert verdict, verdict.message


WINDOW_WRONG = [
    (window_ignored, ["T=3, S=7, W=3", "sees 5 keys; it should see 3", "keys 0..1 are outside its window",
                      "window is missing"]),
    (window_top_left, ["sees 1 key; it should see 3", "top left"]),
    (window_T_as_offset, ["sees keys 1..3; it should see keys 2..4", "not T"]),
    (window_lower_bound_without_offset, ["lower bound misses the offset"]),
    (window_one_too_wide, ["sees 4 keys; it should see 3", "W + 1 keys", "strict"]),
    (window_one_too_narrow, ["sees 2 keys; it should see 3", "W - 1 keys"]),
    (window_no_causal_bound, ["sees 5 keys; it should see 3", "in its future", "causal bound"]),
    (window_strict_causal, ["sees 2 keys; it should see 3", "its own key", "not <"]),
    (window_last_W_keys, ["T=3, S=7, W=3", "its own window"]),
    (window_int, ["int64; expected bool"]),
    (window_square, ["shape (7, 7); expected (3, 7)"]),
    (lambda T, S, W: None, ["returned None"]),
]


@pytest.mark.parametrize("fn, words", WINDOW_WRONG, ids=[f.__name__ for f, _ in WINDOW_WRONG])
def test_window_mask_rejects_each_wrong_answer_with_its_hint(fn, words):
    verdict = check_window_mask(fn)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_window_mask_reports_the_first_wrong_row():
    verdict = check_window_mask(window_one_too_wide)
    assert "for T=3, S=7, W=3 the first query (at position 4) sees 4 keys; it should see 3" in verdict.message


# ---------------------------------------------------------------------------------------------- ring cache


class EvictFirst(WindowKVCache):
    """The bug: write the new block into a ring of `slots` first, then hand back what is left."""

    def __init__(self, Hkv, d, window, dtype=np.float64, slots=None):
        super().__init__(Hkv, d, window, dtype)
        self.store = KVCache(Hkv, d, dtype)
        self.keep = window - 1 if slots is None else slots

    def append(self, k_new, v_new):
        self._seen += k_new.shape[1]
        K, V = self.store.append(k_new, v_new)
        self.store.k, self.store.v = K[:, max(K.shape[1] - self.keep, 0):], V[:, max(V.shape[1] - self.keep, 0):]
        return self.store.k, self.store.v


class EvictFirstWSlots(EvictFirst):
    """The same bug with W slots: exact for T = 1, wrong for chunks."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, window, dtype, slots=window)


class Unbounded(KVCache):
    """Correct keys for the window, but it never forgets anything."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.window = window

    def append(self, k_new, v_new):
        K, V = super().append(k_new, v_new)
        n = min(self._seen - k_new.shape[1], self.window - 1) + k_new.shape[1]
        return K[:, K.shape[1] - n:], V[:, V.shape[1] - n:]


class AllKeys(KVCache):
    """Hands back every key ever seen: attention would still be right under the mask, memory is not."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, dtype)


class WSlotRing(WindowKVCache):
    """Attends before evicting, but keeps and hands back W old keys, one nobody can see."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, window, dtype, slack=1)  # a ring of W slots

    def append(self, k_new, v_new):
        self.window += 1  # the bug: it hands back as many old keys as its ring holds
        try:
            return super().append(k_new, v_new)
        finally:
            self.window -= 1


class SlotOrder(WindowKVCache):
    """Reads the ring in slot order instead of time order."""

    def append(self, k_new, v_new):
        held = min(self._seen, self.slots)
        K = np.concatenate([self.k[:, :held], k_new], axis=1)
        V = np.concatenate([self.v[:, :held], v_new], axis=1)
        super().append(k_new, v_new)
        return K, V


class CountsHeld(WindowKVCache):
    def __len__(self):
        return min(self._seen, self.slots)


class OneSlotTooMany(WindowKVCache):
    """Right answers, but it allocates W slots rather than W - 1."""

    @property
    def nbytes(self):
        return super().nbytes * self.window // max(self.slots, 1) if self.slots else 8


class NoNbytes:
    def __init__(self, Hkv, d, window, dtype=np.float64):
        self.inner = WindowKVCache(Hkv, d, window, dtype)

    def append(self, k, v):
        return self.inner.append(k, v)

    def __len__(self):
        return len(self.inner)


class NbytesMethod(WindowKVCache):
    """nbytes as a plain method: cache.nbytes is then a bound method, not a number."""

    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class NbytesRaises(WindowKVCache):
    @property
    def nbytes(self):
        raise AttributeError("k")


class NbytesZero(WindowKVCache):
    """Holds the right slots but reports nothing held."""

    @property
    def nbytes(self):
        return 0


class NbytesText(WindowKVCache):
    @property
    def nbytes(self):
        return f"{super().nbytes} bytes"


class IgnoresDtype(WindowKVCache):
    """Stores float64 whatever it is asked for, and hands back float64."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, window, np.float64)

    def append(self, k_new, v_new):
        return super().append(k_new.astype(np.float64), v_new.astype(np.float64))


class NoDtypeArgument(WindowKVCache):
    def __init__(self, Hkv, d, window):
        super().__init__(Hkv, d, window, np.float32)


class SwappedKV(WindowKVCache):
    def append(self, k_new, v_new):
        K, V = super().append(k_new, v_new)
        return V, K


class OnlyK(WindowKVCache):
    def append(self, k_new, v_new):
        return super().append(k_new, v_new)[0]


class ModuloByZero(WindowKVCache):
    """The lesson's ring without a guard for window = 1, where W - 1 = 0 slots."""

    def append(self, k_new, v_new):
        _ = self._seen % (self.window - 1)
        return super().append(k_new, v_new)


class ListPair(WindowKVCache):
    """A list [K, V] is as good as a tuple."""

    def append(self, k_new, v_new):
        return list(super().append(k_new, v_new))


def test_window_cache_passes_the_package_and_a_list_pair():
    assert check_window_cache(WindowKVCache)
    assert check_window_cache(ListPair)


CACHE_WRONG = [
    (EvictFirst, ["append 3 (T=3", "the new queries need", "oldest are missing", "evict after attending"]),
    (EvictFirstWSlots, ["append 3 (T=3", "evict after attending"]),
    (Unbounded, ["nbytes grew from"]),
    (AllKeys, ["drop keys older than the window"]),
    (WSlotRing, ["drop keys older than the window"]),
    (SlotOrder, ["wrong order", "oldest first"]),
    (CountsHeld, ["len(cache) is 3", "counts every token seen"]),
    (OneSlotTooMany, ["W - 1 = 3 positions of K and V take"]),
    (NoNbytes, ["reading your cache.nbytes raised AttributeError"]),
    (NbytesMethod, ["nbytes is a method", "@property"]),
    (NbytesRaises, ["reading your cache.nbytes raised AttributeError"]),
    (NbytesZero, ["nbytes is 0", "self.k.nbytes + self.v.nbytes"]),
    (NbytesText, ["nbytes returned the string", "expected a number"]),
    (IgnoresDtype, ["K is float64; expected float32", "dtype the cache was made with"]),
    (NoDtypeArgument, ["raised TypeError", "accept the dtype"]),
    (SwappedKV, ["K and V come back swapped"]),
    (OnlyK, ["append returned one array; expected the pair (K, V)"]),
    (ModuloByZero, ["window=1", "raised ZeroDivisionError", "W - 1 = 0 slots"]),
]


@pytest.mark.parametrize("cls, words", CACHE_WRONG, ids=[c.__name__ for c, _ in CACHE_WRONG])
def test_window_cache_rejects_each_wrong_answer_with_its_hint(cls, words):
    verdict = check_window_cache(cls)
    assert not verdict and not verdict.stub
    for w in words:
        assert w in verdict.message, (w, verdict.message)


def test_evict_first_with_w_slots_survives_decode_and_fails_on_the_first_chunk():
    """Decode-only streams cannot see the bug when the ring has W slots; the checker's first chunk (T=3) does."""
    verdict = check_window_cache(EvictFirstWSlots)
    assert "append 3 (T=3" in repr(verdict), repr(verdict)


def test_evict_first_with_w_minus_1_slots_fails_even_in_decode():
    """With W - 1 slots, writing first loses the oldest key of the window even when T = 1."""
    rng = np.random.default_rng(0)
    c = EvictFirst(1, 2, 3)
    for _ in range(3):
        K, _ = c.append(*rng.standard_normal((2, 1, 1, 2)))
    assert K.shape[1] == 2  # the third query should see 3 keys


def test_slot_order_changes_nothing_in_decode_and_breaks_chunks():
    """The checker's hint claims it: with T = 1 the query sees every key handed back, so order cannot matter."""
    rng = np.random.default_rng(1)
    W, Hkv, d = 4, 1, 2
    outs = {}
    for name, cls in (("ring", WindowKVCache), ("slot", SlotOrder)):
        c, outs[name] = cls(Hkv, d, W), []
        for T in (1, 1, 1, 1, 1, 3):
            q, k, v = rng.standard_normal((3, 1, T, d))
            outs[name].append(attention(q, *c.append(k, v), window=W))
        rng = np.random.default_rng(1)  # the same tokens for both caches
    for a, b in zip(outs["ring"][:5], outs["slot"][:5], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert not np.allclose(outs["ring"][5], outs["slot"][5])


def test_a_student_copy_gets_the_stub_verdict():
    def untouched(*args, **kwargs):
        raise NotImplementedError("your turn")

    class Untouched:
        def __init__(self, Hkv, d, window, dtype=np.float64):
            self.Hkv, self.d, self.window = Hkv, d, window
            raise NotImplementedError("your turn")

    class AppendUntouched:
        def __init__(self, Hkv, d, window, dtype=np.float64):
            self.Hkv, self.d, self.window = Hkv, d, window

        def append(self, k_new, v_new):
            raise NotImplementedError("your turn")

    for checker, answer in ((check_window_mask, untouched), (check_window_cache, Untouched),
                            (check_window_cache, AppendUntouched)):
        verdict = checker(answer)
        assert not verdict and verdict.stub, verdict.message
