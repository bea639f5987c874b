"""The equivalence tests must be able to fail: three classic bugs, swapped in, each break them.

Each mutant runs through the same `run_chunks` / `reference` pair the property tests use, on a
case that exercises the bug; the test passes only if the comparison with the full pass fails.
"""
from unittest import mock

import numpy as np
import pytest

import kvlesson.layer
import kvlesson.sdpa
from kvlesson import KVCache, WindowKVCache
from kvlesson.cache import Cache
from tests.helpers import reference, run_chunks

CASE = dict(H=4, Hkv=2, d=4, D=8, N=9, chunks=[4, 3, 1, 1], window=None, rope_base=None, interleaved=False, seed=7)


def mismatches(case, cache):
    """True when the chunked run disagrees with the full pass, or cannot even run."""
    try:
        got = run_chunks(case, cache)
    except ValueError:  # e.g. a cache that hands back fewer keys than queries
        return True
    return not np.allclose(got, reference(case), rtol=0, atol=1e-12)


def test_the_unmutated_case_passes():
    assert not mismatches(CASE, KVCache(2, 4))


def test_tril_mask_anchored_top_left_is_caught():
    """np.tril(np.ones((T, S))) lets the first query of a chunk see key 0 only."""
    def tril_mask(T, S, window=None):
        return np.tril(np.ones((T, S), bool))

    with mock.patch.object(kvlesson.sdpa, "causal_mask", tril_mask):
        assert mismatches(CASE, KVCache(2, 4))


def test_rope_at_local_positions_is_caught():
    """Rotating by 0..T-1 inside each chunk instead of len(cache) + i."""
    real = kvlesson.layer.turn

    def local_rope(q, k, positions, base, interleaved):
        return real(q, k, np.arange(len(positions)), base, interleaved)

    case = {**CASE, "rope_base": 10000.0}
    with mock.patch.object(kvlesson.layer, "turn", local_rope):
        assert mismatches(case, KVCache(2, 4))


class EvictBeforeAttend(Cache):
    """Writes the new block first, then hands back only the last W - 1: chunks with T > 1 lose keys."""

    def __init__(self, Hkv, d, window):
        super().__init__(Hkv, d, np.float64)
        self.window = window
        self.k = self.v = np.zeros((Hkv, 0, d))

    def append(self, k_new, v_new):
        keep = self.window - 1
        self.k = np.concatenate([self.k, k_new], axis=1)[:, -keep:] if keep else self.k[:, :0]
        self.v = np.concatenate([self.v, v_new], axis=1)[:, -keep:] if keep else self.v[:, :0]
        self._seen += k_new.shape[1]
        return self.k, self.v


@pytest.mark.parametrize("window", [3, 5])
def test_evict_before_attend_is_caught(window):
    case = {**CASE, "window": window}
    assert not mismatches(case, WindowKVCache(2, 4, window))
    assert mismatches(case, EvictBeforeAttend(2, 4, window))
