"""The fused forward pass (one product for Q, K and V, one for gate and up) is the plain one, reordered sums aside."""
import numpy as np
import pytest

from kvlesson import fused
from kvlesson import model as kvmodel
from kvlesson.costs.tolerance import CHUNK_TOL
from kvlesson.text import long_text


def test_fused_equals_plain_on_the_tiny_model_to_float64_rounding():
    cfg = kvmodel.tiny_config()
    w = kvmodel.random_weights(cfg, seed=3, dtype=np.float64)
    fw = fused.fuse(cfg, w)
    assert "blk.0.attn_q.weight" not in fw and fw["blk.0.attn_qkv.weight"].shape == (64, (4 + 2 * 2) * 16)
    ids = list(range(0, 200, 7))
    plain = kvmodel.forward(cfg, w, ids, kvmodel.new_cache(cfg, np.float64))
    caches = kvmodel.new_cache(cfg, np.float64)
    chunked = np.concatenate([fused.forward(cfg, fw, ids[:11], caches), fused.forward(cfg, fw, ids[11:12], caches),
                              fused.forward(cfg, fw, ids[12:], caches)])
    assert np.abs(chunked - plain).max() < 1e-12


@pytest.fixture(scope="module")
def models(model):
    return model, model.fused()


def test_fused_smollm2_matches_the_plain_model(models):
    plain, fast = models
    ids = plain.tokenizer.encode(long_text())[:40]
    a, b = plain.forward(ids), fast.forward(ids)
    assert b.dtype == np.float32 and np.abs(a - b).max() < CHUNK_TOL
    caches = fast.new_cache(capacity=41)
    fast.forward(ids[:39], caches)
    np.testing.assert_allclose(fast.forward(ids[39:], caches), a[39:], atol=CHUNK_TOL, rtol=0)


def test_fused_generation_gives_the_same_tokens(models):
    plain, fast = models
    prompt = plain.tokenizer.encode(plain.chat_prompt("What is the capital of France?"))
    assert fast.generate(prompt, 12) == plain.generate(prompt, 12)
    assert fast.fused() is fast and "Fused" in repr(fast)
