"""Perplexity: exp of the mean next-token NLL, the same whatever the chunking, and equal to k for a model that
spreads its bets evenly over k tokens."""
import math

import numpy as np
import pytest

from kvlesson import KVCache
from kvlesson.costs.perplexity import perplexity, token_nll, window_nll, windows


class Uniform:
    """A stand-in model: every logit equal, so p(next) = 1 / vocab whatever came before."""

    def __init__(self, vocab):
        self.vocab = vocab

    def new_cache(self, capacity=None):
        return [KVCache(1, 2)]

    def forward(self, ids, caches):
        caches[0].append(np.zeros((1, len(ids), 2)), np.zeros((1, len(ids), 2)))
        return np.zeros((len(ids), self.vocab), np.float32)


def test_a_uniform_model_has_perplexity_equal_to_its_vocabulary():
    assert perplexity(Uniform(50), list(range(20))) == pytest.approx(50, rel=1e-12)


def test_every_token_after_the_first_is_scored_once_whatever_the_chunk():
    model = Uniform(7)
    for chunk in (1, 3, 19, 100):
        caches = model.new_cache()
        nll = token_nll(model, [i % 7 for i in range(20)], caches, chunk=chunk)
        assert nll.shape == (19,) and np.allclose(nll, math.log(7))
        assert len(caches[0]) == 19  # the last token is only a target: it never has to be run


def test_the_real_model_gives_the_same_perplexity_in_any_chunks(model):
    from kvlesson.text import long_text
    ids = model.tokenizer.encode(long_text())[:97]
    a, b = perplexity(model, ids, chunk=96), perplexity(model, ids, chunk=10)
    assert abs(a - b) < 1e-4 * a  # float32 sums in another order: far below any change a cache makes


@pytest.mark.parametrize("ids, chunk, error", [([1], 4, ValueError), ([1, 2], 0, ValueError), ([1, 2], 1.5, TypeError)])
def test_bad_input(ids, chunk, error):
    with pytest.raises(error):
        token_nll(Uniform(3), ids, chunk=chunk)


def test_windows_are_evenly_spread_from_the_first_token_to_the_last():
    ids = list(range(100))
    wins = windows(ids, 4, 9)
    assert [w[0] for w in wins] == [0, 30, 60, 90] and all(len(w) == 10 for w in wins) and wins[-1][-1] == 99
    assert windows(ids, 1, 99) == [ids]


@pytest.mark.parametrize("n, length, error", [(0, 4, ValueError), (2, 100, ValueError), (2, 2.0, TypeError)])
def test_windows_refuse_what_the_text_cannot_give(n, length, error):
    with pytest.raises(error):
        windows(list(range(100)), n, length)


def test_window_nll_reads_each_window_through_its_own_fresh_caches():
    model, made = Uniform(5), []

    def new_caches(capacity):
        made.append((capacity, model.new_cache()))
        return made[-1][1]

    nll = window_nll(model, windows([i % 5 for i in range(50)], 3, 7), new_caches)
    assert nll.shape == (3, 7) and np.allclose(nll, math.log(5))
    assert [c for c, _ in made] == [7, 7, 7] and all(len(caches[0]) == 7 for _, caches in made)
    with pytest.raises(ValueError, match="equal length"):
        window_nll(model, [[1, 2, 3], [1, 2]], new_caches)


def test_the_float64_model_agrees_with_the_float32_one_and_keeps_its_table_tied(model):
    from kvlesson.text import long_text
    from kvlesson.weights import layout

    model64 = model.astype(np.float64)
    ids = model.tokenizer.encode(long_text())[:24]
    a, b = model.forward(ids), model64.forward(ids)
    assert a.dtype == np.float32 and b.dtype == np.float64 and model64.new_cache(4)[0].dtype == np.float64
    assert np.abs(a - b).max() < 1e-3 and layout.is_tied(model64.weights)
    with pytest.raises(TypeError, match="floating"):
        model.astype(np.int32)
