"""Lesson 05 checkers: each passes the reference and names each classic mistake."""
import math

import numpy as np
import pytest

from kvlesson import attention, causal_mask
from kvlesson.checks import check_cache_bytes_per_token, check_decode_floor, check_gqa_attention

# --------------------------------------------------------------------------------------- bytes per token


def right_bytes(spec, b):
    return 2 * spec.n_layers * spec.Hkv * spec.d * b


def test_bytes_per_token_passes_the_reference():
    verdict = check_cache_bytes_per_token(right_bytes)
    assert verdict and "PASS" in repr(verdict)


@pytest.mark.parametrize("wrong, words", [
    (lambda s, b: s.n_layers * s.Hkv * s.d * b, ["half", "factor 2"]),
    (lambda s, b: 2 * s.n_layers * s.H * s.d * b, ["query heads", "Hkv KV heads"]),
    (lambda s, b: s.n_layers * s.H * s.d * b, ["query heads and forgot the factor 2"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d * b * 8, ["bits, not bytes"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d * b / 8, ["divided bytes by 8"]),
    (lambda s, b: 2 * s.Hkv * s.d * b, ["one layer", "n_layers"]),
    (lambda s, b: 2 * s.n_layers * (s.H // s.Hkv) * s.d * b, ["G = H // Hkv"]),
    (lambda s, b: 2 * s.n_layers * s.Hkv * s.d, ["elements, not bytes"]),
    (lambda s, b: right_bytes(s, b) + 1, ["expected 131,072 B", "nothing else"]),
    (lambda s, b: f"{right_bytes(s, b)} B", ["expected a number"]),
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


@pytest.mark.parametrize("right", [loop_gqa, grouped, attention])
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
    (lambda q, k, v: grouped(q, k, v, pair="tile"), ["h % Hkv, not h // G", "[0, 1, 0, 1", "np.repeat"]),
    (lambda q, k, v: grouped(q, k, v, upcast=True), ["float64", "math.sqrt(d)"]),
    (lambda q, k, v: grouped(q, k, v, mask="none"), ["no causal mask"]),
    (lambda q, k, v: grouped(q, k, v, mask="top-left"), ["anchored top left", "lesson 04"]),
    (lambda q, k, v: grouped(q, k, v, scale=False), ["1/sqrt(d)"]),
    (plain_mha, ["expects the cache to hold H heads", "h // G"]),
    (_no_empty(attention), ["np.zeros_like(q)"]),
    (lambda q, k, v: attention(q, k, v).reshape(k.shape[0], -1, q.shape[2]), ["shape", "reshape(H, T, d)"]),
    (_in_place, ["changed k in place"]),
    (lambda q, k, v: attention(q, k, v) * 1.01, ["query heads [0, 1", "max abs error"]),
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
    (lambda s, a, c, b: right_floor(s, a, c, b) + 1, ["expected 4.954 ms", "divide by accel.bandwidth"]),
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


def test_the_package_exports_these_checkers_unshadowed():
    """kvlesson.checks star-imports every lesson's module: a later module with the same name would win silently."""
    import kvlesson.checks
    import kvlesson.checks.gqa

    for name in kvlesson.checks.gqa.__all__:
        assert getattr(kvlesson.checks, name) is getattr(kvlesson.checks.gqa, name), name
