"""The lesson 08 checkers pass the reference and name each typical mistake; NaN and a single pass never pass."""
import gguf
import numpy as np
import pytest

from kvlesson.teaching import checks
from kvlesson.teaching.checks.real_model import LAYOUT, stored_bytes
from kvlesson.weights import fetch, gguf_file

# ------------------------------------------------------------------------------------------- stored bytes


def right_stored(kind, n):
    per_block, size = {"F32": (1, 4), "Q8_0": (32, 34), "Q4_1": (32, 20)}[kind]
    return n // per_block * size


@pytest.mark.slow  # reads the layout of every tensor of a full-size file
def test_the_layout_is_ggml_s_and_prices_every_tensor_of_the_file():
    """The checker's block sizes agree with the gguf reader's table and with the byte count of each tensor."""
    for kind, (per_block, size) in LAYOUT.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]] == (per_block, size)
    summary = gguf_file.storage_summary(fetch.model_file()[0])
    assert {kind for _, kind, _, _ in summary} == set(LAYOUT)
    assert all(stored_bytes(kind, n) == nbytes for _, kind, n, nbytes in summary)


def test_stored_bytes_passes_the_reference():
    assert checks.check_stored_bytes(right_stored)
    assert checks.check_stored_bytes(lambda kind, n: {"F32": 32, "Q8_0": 8.5, "Q4_1": 5}[kind] * n / 8)  # bits


@pytest.mark.parametrize("wrong, words", [
    (lambda k, n: {"F32": 4 * n, "Q8_0": n, "Q4_1": n // 2}[k], ["28,311,552 B; expected 30,081,024 B",
                                                              "codes but not", "float16 scale"]),
    (lambda k, n: right_stored(k, n) if k != "Q4_1" else n // 32 * 18, ["scale but no minimum", "d * q + m"]),
    (lambda k, n: {"F32": 4 * n, "Q8_0": n // 32 * 36, "Q4_1": n // 32 * 24}[k], ["as float32", "float16"]),
    (lambda k, n: 8 * right_stored(k, n), ["bits, not bytes"]),
    (lambda k, n: 4 * n, ["float32 copy load() makes"]),
    (lambda k, n: right_stored(k, n) + 1, ["30,081,025 B; expected 30,081,024 B", "n // 32 blocks"]),
    (lambda k, n: right_stored(k, n) * 1.0001, ["expected a whole number"]),
    (lambda k, n: str(right_stored(k, n)), ["the string '30081024'", "expected a number"]),
    (lambda k, n: {"Q8_0": 34, "Q4_1": 20}[k] * n // 32, ["raised KeyError", "F32"]),
    (lambda k, n: None, ["returned None"]),
])
def test_stored_bytes_names_the_slip(wrong, words):
    verdict = checks.check_stored_bytes(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------- chunked prefill

def chunked(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    return np.concatenate([model.forward(ids[i:i + chunk], cache) for i in range(0, len(ids), chunk)])


def copied_list(model, ids, chunk):
    """Passing a copy of the cache list is fine: the caches in it are the same objects."""
    cache = model.new_cache(capacity=len(ids))
    return np.concatenate([model.forward(ids[i:i + chunk], list(cache)) for i in range(0, len(ids), chunk)])


def one_pass(model, ids, chunk):
    return model.forward(ids)


def one_pass_on_a_cache(model, ids, chunk):
    return model.forward(ids, model.new_cache(capacity=len(ids)))


def cache_per_chunk(model, ids, chunk):
    out = []
    for i in range(0, len(ids), chunk):
        out.append(model.forward(ids[i:i + chunk], model.new_cache(capacity=len(ids))))
    return np.concatenate(out)


def no_cache(model, ids, chunk):
    return np.concatenate([model.forward(ids[i:i + chunk]) for i in range(0, len(ids), chunk)])


def last_chunk_only(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    for i in range(0, len(ids), chunk):
        out = model.forward(ids[i:i + chunk], cache)
    return out


def drops_the_tail(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    return np.concatenate([model.forward(ids[i:i + chunk], cache) for i in range(0, len(ids) - chunk + 1, chunk)])


def out_of_order(model, ids, chunk):
    cache = model.new_cache(capacity=len(ids))
    starts = list(range(0, len(ids), chunk))
    logits = {i: model.forward(ids[i:i + chunk], cache) for i in starts[1:] + starts[:1]}
    return np.concatenate([logits[i] for i in starts])


def upcast(model, ids, chunk):
    return chunked(model, ids, chunk).astype(np.float64)


def with_nan(model, ids, chunk):
    out = chunked(model, ids, chunk)
    out[-1, 0] = np.nan
    return out


def unfilled_rows(model, ids, chunk):
    out = np.full((len(ids), model.config.vocab), np.nan, np.float32)  # what np.empty may hold
    cache = model.new_cache(capacity=len(ids))
    for i in range(0, len(ids), chunk):
        logits = model.forward(ids[i:i + chunk], cache)
        if i + chunk < len(ids):
            out[i:i + chunk] = logits
    return out


def shifted(model, ids, chunk):
    return chunked(model, ids, chunk) + np.float32(0.01)


def never_calls(model, ids, chunk):
    return np.zeros((len(ids), model.config.vocab), np.float32)


@pytest.mark.parametrize("right", [chunked, copied_list])
def test_chunked_prefill_checker_passes_the_reference(model, right):
    assert checks.check_chunked_prefill(right, model)


@pytest.mark.parametrize("wrong, words", [
    (one_pass, ["fed all 11 tokens in one call", "[4, 4, 3]"]),
    (one_pass_on_a_cache, ["fed all 11 tokens in one call"]),
    (cache_per_chunk, ["call 2 went onto an empty cache", "create the cache once"]),
    (no_cache, ["the first call had no cache"]),
    (last_chunk_only, ["has 3 rows; expected 11", "not only the last chunk"]),
    (drops_the_tail, ["fed 8 tokens", "last, shorter chunk"]),
    (out_of_order, ["not in order"]),
    (upcast, ["float64; expected float32"]),
    (with_nan, ["nan or inf"]),
    (unfilled_rows, ["nan or inf", "np.empty"]),
    (shifted, ["differ from one pass by up to 0.01"]),
    (never_calls, ["never called model.forward"]),
])
def test_chunked_prefill_checker_names_the_slip(model, wrong, words):
    verdict = checks.check_chunked_prefill(wrong, model)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


@pytest.mark.parametrize("checker", ["check_stored_bytes", "check_chunked_prefill"])
def test_a_student_copy_not_filled_in_gets_the_stub_verdict(model, checker):
    def stub(*args):
        raise NotImplementedError("your turn")

    args = (model,) if checker == "check_chunked_prefill" else ()
    verdict = getattr(checks, checker)(stub, *args)
    assert not verdict and verdict.stub
