"""The lesson 15 checkers pass right answers written several ways and refuse each plausible wrong one with its own
hint; junk answers are fuzzed for every checker in test_checks_junk.py."""
import numpy as np
import pytest

from kvlesson.configs import MODELS
from kvlesson.parallel import ring, tensor
from kvlesson.teaching.checks import check_decode_bytes, check_kv_heads, check_zigzag
from kvlesson.teaching.checks.parallel import decode_bytes

# ------------------------------------------------------------------------------------------------ KV heads


def heads_by_query_heads(rank, P, H, Hkv):
    G = H // Hkv
    return sorted({h // G for h in range(rank * H // P, (rank + 1) * H // P)})


def heads_by_cases(rank, P, H, Hkv):
    if P <= Hkv:
        return np.arange(rank * Hkv // P, (rank + 1) * Hkv // P)  # an array will do
    return [rank // (P // Hkv)]


def test_kv_heads_checker_passes_right_answers():
    for right in (heads_by_query_heads, heads_by_cases):
        assert check_kv_heads(right), right.__name__


@pytest.mark.parametrize("wrong, words", [
    (lambda r, P, H, Hkv: [r % Hkv], "not dealt round robin"),
    (lambda r, P, H, Hkv: list(range(r * Hkv // P, (r + 1) * Hkv // P)), "a range of Hkv / P < 1 heads is empty"),
    (lambda r, P, H, Hkv: list(range(r * H // P, (r + 1) * H // P)), "those are the rank's query heads"),
    (lambda r, P, H, Hkv: [r], "a rank holds one KV head only when P = Hkv"),
    (lambda r, P, H, Hkv: [r * Hkv // P], "at P=1, rank 0 you say [0]; it holds [0, 1, 2]"),
    (lambda r, P, H, Hkv: [[0]], "expected a list of KV head numbers"),
    (lambda r, P, H, Hkv: [0.5], "expected a list of KV head numbers"),
])
def test_kv_heads_checker_names_the_mistake(wrong, words):
    verdict = check_kv_heads(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------------ zigzag


def zigzag_by_chunks(S, P):
    c = S // (2 * P)
    return [list(range(r * c, (r + 1) * c)) + list(range((2 * P - 1 - r) * c, (2 * P - r) * c)) for r in range(P)]


def zigzag_late_first(S, P):
    """Right: the same positions, the late chunk listed first, as arrays."""
    return [np.array(h[::-1]) for h in zigzag_by_chunks(S, P)]


def test_zigzag_checker_passes_right_answers():
    for right in (zigzag_by_chunks, zigzag_late_first, lambda S, P: ring.layout(S, P, "zigzag")):
        assert check_zigzag(right)


def p_plus_r(S, P):
    c = S // (2 * P)
    return [list(range(r * c, (r + 1) * c)) + list(range((P + r) * c, (P + r + 1) * c)) for r in range(P)]


@pytest.mark.parametrize("wrong, words", [
    (lambda S, P: ring.layout(S, P, "contiguous"), "that is the contiguous layout"),
    (p_plus_r, "chunks r and P + r"),
    (lambda S, P: [list(range(r, S, P)) for r in range(P)], "that is the striped layout"),
    (lambda S, P: zigzag_by_chunks(S, P)[:-1] + [[]], "every position must be on exactly one rank; missing"),
    (lambda S, P: [h + [0] for h in zigzag_by_chunks(S, P)], "twice [0]"),
    (lambda S, P: zigzag_by_chunks(S, P)[::-1], "zigzag gives"),
    (lambda S, P: zigzag_by_chunks(S, P)[0], "expected 2 lists, one per rank"),
    (lambda S, P: "zigzag", "expected 2 lists"),
    (lambda S, P: [["a"]] * P, "not an array of numbers"),
    (lambda S, P: [[0.5]] * P, "expected a list of positions"),
])
def test_zigzag_checker_names_the_mistake(wrong, words):
    verdict = check_zigzag(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ------------------------------------------------------------------------------------------------ decode bytes


def bytes_by_heads_held(cfg, tp, nbytes):
    held = len(tensor.heads(cfg.__class__(n_layers=1, H=cfg.H, Hkv=cfg.Hkv, d=1), 0, tp)[1])
    return 2 * cfg.n_layers * held * cfg.d * nbytes


def test_decode_bytes_checker_passes_right_answers():
    assert check_decode_bytes(decode_bytes)
    assert check_decode_bytes(bytes_by_heads_held)
    assert check_decode_bytes(lambda cfg, tp, n: np.float64(decode_bytes(cfg, tp, n)))


def test_the_reference_is_lesson_05s_price_divided_among_the_ranks():
    cfg = MODELS["Llama 3.1 8B"]
    assert decode_bytes(cfg, 1, 2) == 131072  # lesson 05's 128 KiB per token
    assert decode_bytes(cfg, 8, 2) == 131072 // 8 and decode_bytes(cfg, 16, 2) == 131072 // 8


@pytest.mark.parametrize("wrong, words", [
    (lambda cfg, tp, n: decode_bytes(cfg, tp, n) / 2, "the factor 2 is missing"),
    (lambda cfg, tp, n: 2 * cfg.n_layers * max(cfg.H // tp, 1) * cfg.d * n, "you counted query heads"),
    (lambda cfg, tp, n: 2 * cfg.n_layers * cfg.Hkv / tp * cfg.d * n, "cannot hold a fraction of a head"),
    (lambda cfg, tp, n: 2 * cfg.n_layers * cfg.Hkv * cfg.d * n, "the whole token to every rank"),
    (lambda cfg, tp, n: decode_bytes(cfg, tp, n) * 8, "bits, not bytes"),
    (lambda cfg, tp, n: "46080", "text that spells a number is not one"),
    (lambda cfg, tp, n: float("nan"), "returned nan"),
])
def test_decode_bytes_checker_names_the_mistake(wrong, words):
    verdict = check_decode_bytes(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)
