"""The lesson 07 checkers pass kvlesson's own answers and name each typical mistake."""
import numpy as np
import pytest

from kvlesson import KVCache, WindowKVCache, causal_mask
from kvlesson.checks import check_window_cache, check_window_mask


def positions(T, S):
    return np.arange(S - T, S)[:, None], np.arange(S)[None, :]  # [T, 1] query positions, [1, S] key positions


def test_window_mask_checker_passes_the_package():
    assert check_window_mask(causal_mask)


@pytest.mark.parametrize("wrong, hint", [
    (lambda T, S, W: (positions(T, S)[1] <= positions(T, S)[0]) & (positions(T, S)[1] >= positions(T, S)[0] - W),
     "W + 1 keys"),
    (lambda T, S, W: (positions(T, S)[1] <= positions(T, S)[0]) & (positions(T, S)[1] > positions(T, S)[0] - W + 1),
     "W - 1 keys"),
    (lambda T, S, W: np.tril(np.ones((T, S), bool)) & ~np.tril(np.ones((T, S), bool), -W), "top left"),
    (lambda T, S, W: (positions(T, S)[1] <= positions(T, S)[0]) & (np.arange(S)[None, :] > np.arange(T)[:, None] - W),
     "lower bound misses the offset"),
    (lambda T, S, W: causal_mask(T, S), "no lower bound"),
    (lambda T, S, W: positions(T, S)[1] > positions(T, S)[0] - W, "causal bound"),
    (lambda T, S, W: causal_mask(T, S, W).astype(int), "expected bool"),
    (lambda T, S, W: causal_mask(S, S, W), "shape"),
    (lambda T, S, W: None, "returned None"),
])
def test_window_mask_checker_names_the_mistake(wrong, hint):
    verdict = check_window_mask(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


def test_window_mask_checker_reports_the_first_wrong_row():
    verdict = check_window_mask(lambda T, S, W: causal_mask(T, S, W + 1))
    assert "T=3, S=7, window=3 query 0 (position 4) sees keys [1, 2, 3, 4]; it should see [2, 3, 4]" in repr(verdict)


class EvictFirst(WindowKVCache):
    """The bug: write the new block into a ring of `slots` first, then hand back what is left."""

    def __init__(self, Hkv, d, window, dtype=np.float64, slots=None):
        super().__init__(Hkv, d, window, dtype)
        self.store = KVCache(Hkv, d, dtype)
        self.keep = window - 1 if slots is None else slots

    def append(self, k_new, v_new):
        self._seen += k_new.shape[1]
        K, V = self.store.append(k_new, v_new)
        self.store.k, self.store.v = K[:, K.shape[1] - self.keep:], V[:, V.shape[1] - self.keep:]
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
    """Attends before evicting, but its ring has W slots, so it hands back one key nobody can see."""

    def __init__(self, Hkv, d, window, dtype=np.float64):
        super().__init__(Hkv, d, window, dtype)
        self.slots = window
        self.k = np.zeros((Hkv, window, d), self.dtype)
        self.v = np.zeros((Hkv, window, d), self.dtype)


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


def test_window_cache_checker_passes_the_package():
    assert check_window_cache(WindowKVCache)


@pytest.mark.parametrize("wrong, hint", [
    (EvictFirst, "evict after attending"),
    (EvictFirstWSlots, "evict after attending"),
    (Unbounded, "nbytes grew from"),
    (AllKeys, "drop keys older than the window"),
    (WSlotRing, "drop keys older than the window"),
    (SlotOrder, "wrong order"),
    (CountsHeld, "counts every token seen"),
    (OneSlotTooMany, "W - 1 = 3 positions of K and V take"),
    (NoNbytes, "no nbytes"),
])
def test_window_cache_checker_names_the_mistake(wrong, hint):
    verdict = check_window_cache(wrong)
    assert not verdict
    assert hint in repr(verdict), repr(verdict)


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
    from kvlesson import attention
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


def test_a_student_copy_gets_a_friendly_nudge():
    def untouched(*args, **kwargs):
        raise NotImplementedError("your turn")

    class Untouched:
        def __init__(self, Hkv, d, window, dtype=np.float64):
            self.Hkv, self.d, self.window = Hkv, d, window

        def append(self, k_new, v_new):
            raise NotImplementedError("your turn")

    for checker, answer in ((check_window_mask, untouched), (check_window_cache, untouched),
                            (check_window_cache, Untouched)):
        verdict = checker(answer)
        assert not verdict and "still raises NotImplementedError" in repr(verdict), repr(verdict)
