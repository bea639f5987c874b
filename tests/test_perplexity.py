"""Perplexity: exp of the mean next-token NLL, the same whatever the chunking, and equal to k for a model that
spreads its bets evenly over k tokens."""
import math

import numpy as np
import pytest

from kvlesson import KVCache
from kvlesson.perplexity import perplexity, token_nll


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


def test_the_real_model_gives_the_same_perplexity_in_any_chunks():
    from kvlesson import llama
    from kvlesson.text import long_text
    model = llama.load()
    ids = model.tokenizer.encode(long_text())[:97]
    a, b = perplexity(model, ids, chunk=96), perplexity(model, ids, chunk=10)
    assert abs(a - b) < 1e-4 * a  # float32 sums in another order: far below any change a cache makes


@pytest.mark.parametrize("ids, chunk, error", [([1], 4, ValueError), ([1, 2], 0, ValueError), ([1, 2], 1.5, TypeError)])
def test_bad_input(ids, chunk, error):
    with pytest.raises(error):
        token_nll(Uniform(3), ids, chunk=chunk)
