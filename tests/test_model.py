"""kvlesson.model: one layer body for every path. The fused weights (one product for Q, K and V, one for gate and up)
give the plain pass's logits, reordered sums aside; bad ids and bad cache lists are refused before any layer runs."""
import numpy as np
import pytest

from kvlesson import KVCache
from kvlesson import model as kvmodel
from kvlesson.costs.tolerance import CHUNK_TOL
from kvlesson.text import long_text
from kvlesson.weights.layout import fuse, is_fused

TINY = kvmodel.tiny_config()


def test_fused_weights_equal_plain_on_the_tiny_model_to_float64_rounding():
    w = kvmodel.random_weights(TINY, seed=3, dtype=np.float64)
    fw = fuse(TINY, w)
    assert is_fused(fw) and not is_fused(w)
    assert "blk.0.attn_q.weight" not in fw and fw["blk.0.attn_qkv.weight"].shape == (64, (4 + 2 * 2) * 16)
    ids = list(range(0, 200, 7))
    plain = kvmodel.forward(TINY, w, ids, kvmodel.new_cache(TINY, np.float64))
    caches = kvmodel.new_cache(TINY, np.float64)
    chunked = np.concatenate([kvmodel.forward(TINY, fw, ids[a:b], caches) for a, b in ((0, 11), (11, 12), (12, 99))])
    assert np.abs(chunked - plain).max() < 1e-12


def test_rows_give_only_the_logits_asked_for():
    w = kvmodel.random_weights(TINY, seed=4, dtype=np.float64)
    ids = [5, 9, 2, 7]
    full = kvmodel.forward(TINY, w, ids, kvmodel.new_cache(TINY, np.float64))
    some = kvmodel.forward(TINY, w, ids, kvmodel.new_cache(TINY, np.float64), rows=np.array([3, 1]))
    np.testing.assert_array_equal(some, full[[3, 1]])


@pytest.mark.parametrize("ids, caches, error, words", [
    ([3, -1], None, ValueError, r"ids must lie in \[0, 256\); got \[-1\]"),
    ([3, 256], None, ValueError, r"\[256\]"),
    ([3, True], None, TypeError, "integer token ids"),
    ([3, 2.0], None, TypeError, "integer token ids"),
    ("abc", None, TypeError, "not text"),
    ([3], KVCache(2, 16), TypeError, "a list of 4 caches, one per layer"),
    ([3], [KVCache(2, 16)], TypeError, "a list of 4 caches, one per layer .* got list of 1"),
])
def test_the_forward_pass_refuses_what_it_cannot_run(ids, caches, error, words):
    """A negative id once returned id 255's logits (the table read from its end); one cache for a 4-layer model said
    'not iterable'."""
    w = kvmodel.random_weights(TINY, seed=0)
    caches = kvmodel.new_cache(TINY) if caches is None else caches
    with pytest.raises(error, match=words):
        kvmodel.forward(TINY, w, ids, caches)


@pytest.fixture(scope="module")
def fast(model):
    return model.fused()


def test_fused_smollm2_matches_the_plain_model(model, fast):
    ids = model.tokenizer.encode(long_text())[:40]
    a, b = model.forward(ids), fast.forward(ids)
    assert b.dtype == np.float32 and np.abs(a - b).max() < CHUNK_TOL
    caches = fast.new_cache(capacity=41)
    fast.forward(ids[:39], caches)
    np.testing.assert_allclose(fast.forward(ids[39:], caches), a[39:], atol=CHUNK_TOL, rtol=0)


def test_fused_generation_and_batches_give_the_same_tokens(model, fast):
    prompt = model.tokenizer.encode(model.chat_prompt("What is the capital of France?"))
    want = model.generate(prompt, 12)
    assert fast.generate(prompt, 12) == want
    assert fast.generate_batch([prompt, prompt[:9]], [12, 4]) == [want, model.generate(prompt[:9], 4)]
    assert fast.fused() is fast and "fused" in repr(fast) and "fused" not in repr(model)
