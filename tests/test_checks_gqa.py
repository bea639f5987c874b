"""Lesson 05 checkers: each passes the reference and names each classic mistake."""
import math

import numpy as np
import pytest

from kvlesson import attention, causal_mask
from kvlesson.teaching.checks import check_cache_bytes_per_token, check_decode_floor, check_gqa_attention

# --------------------------------------------------------------------------------------- bytes per token


def right_bytes(spec, b):
    return 2 * spec.n_layers * spec.Hkv * spec.d * b


def test_bytes_per_token_passes_the_reference():
    verdict = check_cache_bytes_per_token(right_bytes)
    assert verdict and "PASS" in repr(verdict)
    assert check_cache_bytes_per_token(lambda s, b: np.float64(right_bytes(s, b)))  # any real number type
    assert check_cache_bytes_per_token(lambda s, b: np.array(right_bytes(s, b)))  # a 0-d array is one number


def test_the_cases_include_a_head_dim_set_on_its_own():
    """The D // H slip is caught only by a config whose head_dim is not D / H."""
    from kvlesson.teaching.checks.gqa import _TOKEN_CASES
    assert any(s.D is not None and s.D // s.H != s.d for _, (s, _) in _TOKEN_CASES)


@pytest.mark.parametrize("wrong, words", [
    (lambda s, b: s.n_layers * s.Hkv * s.d * b, ["half", "factor 2"]),
    (lambda s, b: 2 * s.n_layers * s.H * s.d * b, ["query heads", "Hkv KV heads"]),
    (lambda s, b: s.n_layers * s.H * s.d * b, ["query heads and forgot the factor 2"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d * b * 8, ["bits, not bytes"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d * b / 8, ["divided bytes by 8"]),
    (lambda s, b: 2 * s.Hkv * s.d * b, ["one layer", "n_layers"]),
    (lambda s, b: 2 * s.n_layers * (s.H // s.Hkv) * s.d * b, ["G = H // Hkv"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d, ["elements, not bytes"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * (s.D // s.H) * b, ["Qwen3-32B", "163,840 B", "D // H", "spec.d"]),
    (lambda s, b: 2 * s.n_layers * s.D * b, ["D numbers per layer", "Hkv x d"]),
    (lambda s, b: right_bytes(s, b) + 1, ["you return 131,073 B; expected 131,072 B", "nothing else"]),
    (lambda s, b: f"{right_bytes(s, b)} B", ["the string '131072 B'", "expected a number"]),
    (lambda s, b: str(right_bytes(s, b)), ["the string '131072'", "text that spells a number"]),
    (lambda s, b: [right_bytes(s, b)], ["expected a number"]),
    (lambda s, b: float("nan"), ["returned nan"]),
    (lambda s, b: None, ["returned None"]),
    (lambda s, b: s.n_kv_heads, ["raised AttributeError"]),
])
def test_bytes_per_token_names_the_mistake(wrong, words):
    verdict = check_cache_bytes_per_token(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------ GQA attention

def loop_gqa(q, k, v):
    """The lesson's loop: query head h reads KV head h // G."""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    out = np.zeros_like(q)
    for h in range(H):
        g = h // (H // Hkv)
        s = q[h] @ k[g].T / math.sqrt(d)
        s = np.where(causal_mask(T, S), s, -np.inf) if T else s
        p = np.exp(s - s.max(axis=-1, keepdims=True)) if T else s
        out[h] = (p / p.sum(axis=-1, keepdims=True)) @ v[g] if T else out[h]
    return out


def grouped(q, k, v, *, pair="repeat", mask="offset", scale=True, upcast=False):
    """A grouped-reshape GQA with switchable mistakes."""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv
    if T == 0:
        return np.zeros_like(q)
    if pair == "tile":
        k, v = np.tile(k, (G, 1, 1)), np.tile(v, (G, 1, 1))
    else:
        k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)
    s = q @ k.transpose(0, 2, 1)  # [H, T, S]
    if scale:
        s = s / (np.sqrt(d) if upcast else math.sqrt(d))
    keep = {"offset": causal_mask(T, S), "none": np.ones((T, S), bool),
            "top-left": np.tril(np.ones((T, S), bool))}[mask]
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def plain_mha(q, k, v):
    """Assumes k and v have H heads, as in lesson 01."""
    T, S, d = q.shape[1], k.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    s = np.where(causal_mask(T, S), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def broadcast(q, k, v):
    """The exercise's solution: q as [Hkv, G, T, d] against k[:, None], no copy."""
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    s = q.reshape(Hkv, H // Hkv, T, d) @ k[:, None].transpose(0, 1, 3, 2) / math.sqrt(d)  # [Hkv, G, T, S]
    s = np.where(causal_mask(T, S), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True)) if T else s
    return (p / p.sum(axis=-1, keepdims=True) @ v[:, None]).reshape(H, T, d)


def one_contiguous_copy(q, k, v):
    """Copying K and V once (a transposed, contiguous K) is not the G-fold copy the exercise forbids."""
    kt = np.ascontiguousarray(k.transpose(0, 2, 1)).transpose(0, 2, 1)
    return broadcast(q, kt, v.copy())


def _repeat_k_only(q, k, v):
    G = q.shape[0] // k.shape[0]
    H, T, d = q.shape
    Hkv, S, _ = k.shape
    s = q @ np.repeat(k, G, axis=0).transpose(0, 2, 1) / math.sqrt(d)  # [H, T, S]
    s = np.where(causal_mask(T, S), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True)) if T else s
    p = p / p.sum(axis=-1, keepdims=True)
    return (p.reshape(Hkv, G, T, S) @ v[:, None]).reshape(H, T, d)


def _fancy_index(q, k, v):
    idx = np.arange(q.shape[0]) // (q.shape[0] // k.shape[0])
    return attention(q, k[idx], v[idx])


@pytest.mark.parametrize("right", [loop_gqa, broadcast, one_contiguous_copy, attention])
def test_gqa_passes_the_reference(right):
    verdict = check_gqa_attention(right)
    assert verdict and "PASS" in repr(verdict)


def _no_empty(fn):
    def wrapped(q, k, v):
        if q.shape[1] == 0:
            raise ValueError("zero-size array to reduction operation maximum which has no identity")
        return fn(q, k, v)
    return wrapped


def _in_place(q, k, v):
    k *= 1.0
    k[0, 0, 0] += 1.0
    return attention(q, k, v)


@pytest.mark.parametrize("wrong, words", [
    (lambda q, k, v: grouped(q, k, v, pair="tile"), ["h % Hkv, not h // G", "[0, 1, 0, 1", "[Hkv, G, T, d]"]),
    (lambda q, k, v: grouped(q, k, v, upcast=True), ["float64", "math.sqrt(d)"]),
    (lambda q, k, v: grouped(q, k, v, mask="none"), ["no causal mask"]),
    (lambda q, k, v: grouped(q, k, v, mask="top-left"), ["anchored top left", "lesson 04"]),
    (lambda q, k, v: grouped(q, k, v, scale=False), ["1/sqrt(d)"]),
    (plain_mha, ["expects the cache to hold H heads", "h // G"]),
    (_no_empty(attention), ["np.zeros_like(q)"]),
    (lambda q, k, v: attention(q, k, v).reshape(k.shape[0], -1, q.shape[2]), ["shape", "reshape(H, T, d)"]),
    (_in_place, ["changed k in place"]),
    (lambda q, k, v: attention(q, k, v) * 1.01, ["query heads [0, 1", "max abs error"]),
    (lambda q, k, v: np.full_like(q, np.nan), ["nan"]),
    (lambda q, k, v: attention(q, k, v).tolist(), ["is float64; expected float32"]),
    (grouped, ["allocated", "copies the KV heads", "k[:, None]"]),  # np.repeat: right values, G copies
    (_repeat_k_only, ["allocated", "copies the KV heads"]),
    (_fancy_index, ["allocated", "copies the KV heads"]),
])
def test_gqa_names_the_mistake(wrong, words):
    verdict = check_gqa_attention(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------ decode floor

def right_floor(spec, accel, context, batch):
    weights = spec.params * 2
    kv = 2 * spec.n_layers * spec.Hkv * spec.d * 2 * context * batch
    return (weights + kv) / accel.bandwidth * 1e3


def _kv(s, c, b):
    return 2 * s.n_layers * s.Hkv * s.d * 2 * c * b


def test_decode_floor_passes_the_reference():
    verdict = check_decode_floor(right_floor)
    assert verdict and "PASS" in repr(verdict)


@pytest.mark.parametrize("wrong, words", [
    (lambda s, a, c, b: right_floor(s, a, c, b) / 1e3, ["in seconds"]),
    (lambda s, a, c, b: right_floor(s, a, c, b) * 1e3, ["microseconds"]),
    (lambda s, a, c, b: (b * s.params * 2 + _kv(s, c, b)) / a.bandwidth * 1e3, ["once per sequence", "amortises"]),
    (lambda s, a, c, b: (s.params * 2 + _kv(s, c, 1)) / a.bandwidth * 1e3, ["not multiplied by the batch"]),
    (lambda s, a, c, b: s.params * 2 / a.bandwidth * 1e3, ["left out the KV cache"]),
    (lambda s, a, c, b: _kv(s, c, b) / a.bandwidth * 1e3, ["left out the weights"]),
    (lambda s, a, c, b: (s.params * 2 + _kv(s, 1, b)) / a.bandwidth * 1e3, ["ignores the context"]),
    (lambda s, a, c, b: (s.params * 2 + _kv(s, c, b) / 2) / a.bandwidth * 1e3, ["K only, or V only"]),
    (lambda s, a, c, b: (s.params * 2 + _kv(s, c, b) * s.H // s.Hkv) / a.bandwidth * 1e3, ["query heads"]),
    (lambda s, a, c, b: (s.params + _kv(s, c, b)) / a.bandwidth * 1e3, ["1 byte each"]),
    (lambda s, a, c, b: right_floor(s, a, c, b) + 1, ["you return 5.954 ms; expected 4.954 ms",
                                                     "divide by accel.bandwidth"]),
    (lambda s, a, c, b: (s.params * 2 + _kv(s, c + 1, b)) / a.bandwidth * 1e3,
     ["you return 4.9545 ms; expected 4.9544 ms", "context + 1", "already in the cache"]),
    (lambda s, a, c, b: (s.params * 2 + 2 * s.n_layers * s.Hkv * (s.D // s.H) * 2 * c * b) / a.bandwidth * 1e3,
     ["Qwen3-32B", "D // H", "spec.d"]),
    (lambda s, a, c, b: f"{right_floor(s, a, c, b):.2f} ms", ["the string '4.95 ms'", "expected a number"]),
    (lambda s, a, c, b: None, ["returned None"]),
])
def test_decode_floor_names_the_mistake(wrong, words):
    verdict = check_decode_floor(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


@pytest.mark.parametrize("checker", [check_cache_bytes_per_token, check_gqa_attention, check_decode_floor])
def test_a_student_copy_not_filled_in_gets_the_package_message(checker):
    def stub(*args):
        raise NotImplementedError("your turn")

    verdict = checker(stub)
    assert not verdict and "NotImplementedError" in repr(verdict)


def test_the_copy_probe_leaves_a_running_tracemalloc_running():
    """A learner measuring their own allocations (section 2.5) keeps tracemalloc on across the checker."""
    import tracemalloc

    tracemalloc.start()
    try:
        assert check_gqa_attention(broadcast)
        assert not check_gqa_attention(grouped)  # the copy is still seen with tracing already on
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert check_gqa_attention(broadcast) and not tracemalloc.is_tracing()
