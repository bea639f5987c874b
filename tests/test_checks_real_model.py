"""The lesson 08 checkers pass the reference and name each typical mistake."""
import numpy as np
import pytest

from kvlesson import checks, llama


def kv_bytes(cfg, bytes_per_value):
    return 2 * cfg.n_layers * cfg.Hkv * cfg.d * bytes_per_value


@pytest.mark.parametrize("wrong, hint", [
    (lambda c, b: 2 * c.n_layers * c.H * c.d * b, "query heads"),
    (lambda c, b: c.n_layers * c.Hkv * c.d * b, "K but not V"),
    (lambda c, b: 2 * c.Hkv * c.d * b, "one layer"),
    (lambda c, b: 8 * kv_bytes(c, b), "bits"),
    (lambda c, b: kv_bytes(c, 4), "4 bytes whatever"),
    (lambda c, b: kv_bytes(c, b) + 1, "you got 46081"),
])
def test_kv_bytes_checker_names_the_slip(wrong, hint):
    verdict = checks.check_kv_bytes_per_token(wrong)
    assert not verdict and hint in repr(verdict)


def test_kv_bytes_checker_passes_the_reference_and_reports_a_crash():
    assert checks.check_kv_bytes_per_token(kv_bytes)
    assert "raised ZeroDivisionError" in repr(checks.check_kv_bytes_per_token(lambda c, b: 1 / 0))


@pytest.fixture(scope="module")
def model():
    return llama.load()


def chunked(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    return np.concatenate([model.forward(ids[i:i + chunk], cache) for i in range(0, len(ids), chunk)])


def cache_per_chunk(model, ids, chunk):
    return np.concatenate([model.forward(ids[i:i + chunk]) for i in range(0, len(ids), chunk)])


def last_chunk_only(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    for i in range(0, len(ids), chunk):
        out = model.forward(ids[i:i + chunk], cache)
    return out


def drops_the_tail(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    return np.concatenate([model.forward(ids[i:i + chunk], cache) for i in range(0, len(ids) - chunk + 1, chunk)])


def upcast(model, ids, chunk):
    return chunked(model, ids, chunk).astype(np.float64)


def test_chunked_prefill_checker_passes_the_reference(model):
    assert checks.check_chunked_prefill(chunked, model)


@pytest.mark.parametrize("wrong, hint", [
    (cache_per_chunk, "create the cache once"),
    (last_chunk_only, "not only the last chunk"),
    (drops_the_tail, "last, shorter chunk"),
    (upcast, "float64"),
])
def test_chunked_prefill_checker_names_the_slip(model, wrong, hint):
    verdict = checks.check_chunked_prefill(wrong, model)
    assert not verdict and hint in repr(verdict)
