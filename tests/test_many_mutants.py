"""The lesson 09 tests must be able to fail: each bug the lesson demonstrates, swapped in, breaks one of them.

  - pads left visible to real queries: the padded batch's outputs differ from each sequence alone;
  - RoPE positions that count the left pads: the outputs survive (RoPE sees only distances) but the keys each
    sequence leaves in the cache do not, so the invariance test, which checks both, fails;
  - a paged pool without copy-on-write: a child's append lands in a block its parent still uses;
  - a batched decode step without the length mask, or with one position for the whole batch.
"""
from unittest import mock

import numpy as np
import pytest

import kvlesson.serving.forward
import kvlesson.serving.padding
from kvlesson import attention
from kvlesson import model as kvmodel
from kvlesson.sdpa import causal_mask
from kvlesson.serving.paged import PagedKVCache
from tests.helpers import decode_matches_alone, errors, mix_matches_alone, play, reserve_without_copy

CASE = dict(lengths=[5, 2, 3], steps=3, H=4, Hkv=2, d=8, D=16, rope_base=1e4, interleaved=False, seed=3)


def test_the_unmutated_padded_batch_passes():
    out, cache = errors(CASE)
    assert out < 1e-12 and cache < 1e-12


def test_pads_left_visible_are_caught():
    def no_pad_mask(pads, T, S):
        return np.broadcast_to(causal_mask(T, S), (len(pads), T, S))

    with mock.patch.object(kvlesson.serving.padding, "pad_mask", no_pad_mask):
        out, _ = errors(CASE)
    assert out > 0.1


def test_rope_positions_counting_left_pads_are_caught_in_the_cache():
    """Every sequence is shifted by its own pad count, and RoPE scores depend only on distances: the outputs stay
    equal to rounding. The rotated keys in the cache do not, and the test compares them too."""
    def column_positions(pads, T, S):
        return np.broadcast_to(np.arange(S - T, S), (len(pads), T))

    with mock.patch.object(kvlesson.serving.padding, "pad_positions", column_positions):
        out, cache = errors(CASE)
    assert out < 1e-12 and cache > 0.1


FORK_THEN_BOTH_APPEND = [("new",), ("append", 0, 6), ("fork", 0), ("append", 0, 1), ("append", 1, 1)]


def test_the_unmutated_pool_passes_the_fork_script():
    play(PagedKVCache(8, 4, 2, 3), FORK_THEN_BOTH_APPEND)


def test_forgetting_copy_on_write_is_caught():
    with mock.patch.object(PagedKVCache, "reserve", reserve_without_copy), \
            pytest.raises(AssertionError, match="sequence 0 differs"):
        play(PagedKVCache(8, 4, 2, 3), FORK_THEN_BOTH_APPEND)


MIX = dict(prompts=[[3, 1, 4, 1, 5, 9], [2, 6], [5, 3, 5]], steps=3, leave=0, seed=5, block_size=2)


def test_the_unmutated_batched_decode_passes():
    decode_matches_alone(MIX)


def test_a_batched_decode_without_the_length_mask_is_caught():
    """Shorter sequences would attend over the rest of their last block and over the padding blocks."""
    real = kvlesson.serving.forward.decode_attention

    def unmasked(q, K, V, tables, lengths):
        return real(q, K, V, tables, np.full_like(lengths, tables.shape[1] * K.shape[2]))

    with mock.patch.object(kvlesson.serving.forward, "decode_attention", unmasked), pytest.raises(AssertionError):
        decode_matches_alone(MIX)


MIXED = dict(steps=[[3, 1, 0], [1, 4, 2], [1, 1, 1]], fork=1, seed=7, block_size=2, fused=False)


def test_the_unmutated_mixed_step_passes():
    mix_matches_alone(MIXED)


def test_a_chunk_that_attends_over_its_whole_pages_is_caught():
    """A prefill chunk onto earlier positions must use lesson 04's offset mask: without it, every query of the chunk
    sees the chunk's later tokens."""
    def everything(q, K, V, **kwargs):
        return attention(q, K, V, mask=np.ones((q.shape[1], K.shape[1]), bool))

    with mock.patch.object(kvlesson.serving.forward, "attention", everything), pytest.raises(AssertionError):
        mix_matches_alone(MIXED)


def test_one_position_for_the_whole_batch_is_caught():
    """RoPE at the longest sequence's position for every row: the decode-time twin of counting pads."""
    real = kvlesson.serving.forward.turn

    def shared_rope(q, k, positions, base, interleaved):
        return real(q, k, np.full_like(positions, max(positions)), base, interleaved)

    with mock.patch.object(kvlesson.serving.forward, "turn", shared_rope), pytest.raises(AssertionError):
        decode_matches_alone(MIX)


def test_the_tiny_model_has_rope():
    assert kvmodel.tiny_config().rope_base  # else the last mutant could not be caught
