"""Batch invariance of a left-padded batch: each sequence must give, inside the batch, what it gives alone.

Alone means lesson 03's step on a KVCache: a prefill of the prompt, then one token at a time. In the batch, the
prompts are left-padded to one length, prefilled together, then decoded one column per step. Two things must
match, in float64 to 1e-12: the outputs of every real token, and the keys and values each sequence leaves in the
cache (a cache outlives its batch: the sequence may be decoded later in another batch, or share its prefix).
"""
import numpy as np
import pytest
from hypothesis import given

from kvlesson.serving.padding import batched_attention, pad_left, pad_mask, pad_positions, padded_step
from tests.helpers import alone, batched, batches, errors, padded_weights  # noqa: F401


@given(batches())
def test_each_sequence_in_a_padded_batch_equals_itself_alone(c):
    out, cache = errors(c)
    assert out < 1e-12 and cache < 1e-12


# ---- the pieces, by hand


def test_pad_left():
    batch, pads = pad_left([[5, 6, 7], [8], [1, 2]], value=-1)
    assert batch.tolist() == [[5, 6, 7], [-1, -1, 8], [-1, 1, 2]] and pads.tolist() == [0, 2, 1]
    rows, pads = pad_left([np.ones((2, 3)), np.ones((1, 3))])
    assert rows.shape == (2, 2, 3) and rows[1, 0].tolist() == [0, 0, 0]


def test_pad_mask_hides_pads_and_keeps_the_offset():
    m = pad_mask(np.array([0, 2]), T=2, S=4)  # two new columns, 2 and 3, of a 4-column batch
    assert m[0].astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert m[1].astype(int).tolist() == [[0, 0, 1, 0], [0, 0, 1, 1]]


def test_a_pad_query_sees_only_itself():
    m = pad_mask(np.array([3]), T=4, S=4)[0]
    assert m.astype(int).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


def test_pad_positions_count_from_each_sequences_first_token():
    assert pad_positions(np.array([0, 2]), T=4, S=4).tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]
    assert pad_positions(np.array([0, 2]), T=1, S=6).tolist() == [[5], [3]]


def test_float32_stays_float32():
    c = dict(lengths=[3, 1], steps=1, H=4, Hkv=2, d=4, D=8, rope_base=1e4, interleaved=True, seed=1)
    (Wq, Wk, Wv), prompts, _ = padded_weights(c)
    x, pads = pad_left([p.astype(np.float32) for p in prompts])
    K = np.zeros((2, 2, 0, 4), np.float32)
    out, K2, _ = padded_step(x, *(W.astype(np.float32) for W in (Wq, Wk, Wv)), K, K, pads, 4, 2, rope_base=1e4)
    assert out.dtype == K2.dtype == np.float32


@pytest.mark.parametrize("call, error, words", [
    (lambda: pad_mask(np.array([0, 4]), 4, 4), ValueError, "0 <= pads < S=4"),
    (lambda: pad_mask(np.array([0.0]), 1, 2), TypeError, "pads must be a 1-D array of integers"),
    (lambda: pad_mask(np.array([0]), 3, 2), ValueError, "T <= S"),
    (lambda: pad_positions(np.array([-1]), 1, 2), ValueError, "0 <= pads"),
    (lambda: pad_left([]), ValueError, "non-empty list"),
    (lambda: pad_left([np.ones((2, 3)), np.ones((2, 4))]), ValueError, "equal trailing shapes"),
    (lambda: batched_attention(np.ones((1, 2, 1, 4)), np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)),
                               np.zeros((1, 1, 2), bool)), ValueError, "a row of the mask is all False"),
    (lambda: batched_attention(np.ones((1, 3, 1, 4)), np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)),
                               np.ones((1, 1, 2), bool)), ValueError, "H % Hkv == 0"),
    (lambda: batched_attention(np.ones((1, 2, 1, 4)), np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)),
                               np.ones((1, 2), bool)), ValueError, r"mask must be bool \[B=1, T=1, S=2\]"),
    (lambda: padded_step(np.ones((1, 2, 3)), np.ones((3, 4)), np.ones((3, 2)), np.ones((3, 2)),
                         np.ones((1, 1, 0, 1)), np.ones((1, 1, 0, 1)), np.array([0]), 2, 1), ValueError,
     r"K, V \[B=1, Hkv=1, S, d=2\]"),
])
def test_bad_arguments_are_refused(call, error, words):
    with pytest.raises(error, match=words):
        call()
