"""The lesson 13 checkers pass kvlesson's answers and other right ones, and name each typical mistake."""
import hashlib

import numpy as np
import pytest

from kvlesson.serving import engine, paged
from kvlesson.serving.engine import split_budget
from kvlesson.serving.paged import block_hashes
from kvlesson.teaching.checks import check_block_hashes, check_split_budget


def todo(*args, **kwargs):
    raise NotImplementedError("your turn")


# ---- block keys: any hash that chains is right


def chained_tuples(ids, bs):
    """Keys that are the prefixes themselves, as nested tuples: no hashing at all, and right."""
    keys, parent = [], None
    for i in range(len(ids) // bs):
        parent = (parent, tuple(ids[i * bs : (i + 1) * bs]))
        keys.append(parent)
    return keys


def chained_text(ids, bs):
    """sha256 over text, with separators: right."""
    keys, parent = [], ""
    for i in range(len(ids) // bs):
        parent = hashlib.sha256((parent + "|" + ",".join(map(str, ids[i * bs : (i + 1) * bs]))).encode()).hexdigest()
        keys.append(parent)
    return keys


def whole_prefix(ids, bs):
    """Each key hashes the whole prefix again: quadratic, but right."""
    return [hash(tuple(ids[: (i + 1) * bs])) for i in range(len(ids) // bs)]


@pytest.mark.parametrize("right", [chained_tuples, chained_text, whole_prefix])
def test_block_key_checker_passes_any_chained_key(right):
    verdict = check_block_hashes(right)
    assert verdict, verdict


def own_tokens(ids, bs):
    return [hash(tuple(ids[i * bs : (i + 1) * bs])) for i in range(len(ids) // bs)]


def with_partial(ids, bs):
    return [hash(tuple(ids[: (i + 1) * bs])) for i in range(-(-len(ids) // bs))]


def one_short(ids, bs):
    return whole_prefix(ids, bs)[:-1]


def over_everything(ids, bs):
    return [hash((tuple(ids), i)) for i in range(len(ids) // bs)]


def summed(ids, bs):
    keys, parent = [], 0
    for i in range(len(ids) // bs):
        parent = hash((parent, sum(ids[i * bs : (i + 1) * bs])))
        keys.append(parent)
    return keys


def joined(ids, bs):
    keys, parent = [], ""
    for i in range(len(ids) // bs):
        parent = parent + "".join(map(str, ids[i * bs : (i + 1) * bs]))
        keys.append(parent)
    return keys


def weak_mix(ids, bs):
    keys, parent = [], 0
    for i in range(len(ids) // bs):
        for t in ids[i * bs : (i + 1) * bs]:
            parent = (parent * 3 + t) % 7
        keys.append(parent)
    return keys


def salted(ids, bs, counter=[0]):  # noqa: B006  a call counter on purpose
    counter[0] += 1
    return [(counter[0], k) for k in whole_prefix(ids, bs)]


def mutating(ids, bs):
    out = whole_prefix(ids, bs)
    ids.clear()
    return out


@pytest.mark.parametrize("wrong, words", [
    (own_tokens, "got the same key for it: a new request would reuse keys and values computed after the wrong"),
    (with_partial, "you returned 4 keys; expected 3"),
    (one_short, "you returned 2 keys; expected 3"),
    (over_everything, "begin with the same two blocks, and got different keys"),
    (summed, "[5, 9, 2, 7] and [9, 5, 2, 7] got the same key"),
    (joined, "[1, 23] and [12, 3] got the same key"),
    (weak_mix, "got the same key"),
    (salted, "the same ids gave different keys on two calls"),
    (mutating, "your function changed ids"),
    (lambda ids, bs: [list(ids[: (i + 1) * bs]) for i in range(len(ids) // bs)], "cannot be hashed"),
    (lambda ids, bs: None, "returned NoneType"),
    (lambda ids, bs: "abc", "returned str"),
    (todo, "NotImplementedError"),
])
def test_block_key_checker_names_the_mistake(wrong, words):
    verdict = check_block_hashes(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def chained_over(ids, bs, block, salt=lambda ids: b""):
    """sha256 chained over the bytes `block` makes of each block (and a salt made from the whole of ids)."""
    keys, parent = [], salt(ids)
    for i in range(len(ids) // bs):
        parent = hashlib.sha256(parent + block(ids[i * bs : (i + 1) * bs])).digest()
        keys.append(parent)
    return keys


def split_evenly(ids, bs):
    """np.array_split: as many blocks as fit, but the tokens spread over all of them."""
    keys, parent = [], b""
    for part in np.array_split(np.asarray(ids, np.int64), len(ids) // bs) if len(ids) >= bs else []:
        parent = hashlib.sha256(parent + part.tobytes()).digest()
        keys.append(parent)
    return keys


# issue 29: each of these passed the checker, and each breaks prefix caching in the engine
@pytest.mark.parametrize("wrong, words", [
    (lambda ids, bs: chained_over(ids, bs, bytes), "bytes() of a list takes 0..255 only"),
    (lambda ids, bs: chained_over(ids, bs, lambda b: np.asarray(b).astype(np.uint8).tobytes()),
     "multiple of 2**8"),
    (lambda ids, bs: chained_over(ids, bs, lambda b: np.asarray(b).astype(np.uint16).tobytes()),
     "multiple of 2**16"),
    (split_evenly, "np.array_split"),
    (lambda ids, bs: chained_over(ids, bs, lambda b: np.asarray(b, np.int64).tobytes(),
                                  salt=lambda ids: str(len(ids)).encode()), "not len(ids)"),
    (lambda ids, bs: [hash(tuple(ids[max(0, len(ids) - (i + 1) * bs):])) for i in range(len(ids) // bs)][::-1],
     "begin with the same two blocks"),  # blocks cut from the end
])
def test_block_key_checker_refuses_keys_that_break_in_the_engine(wrong, words):
    verdict = check_block_hashes(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_a_chain_that_ignores_its_parent_is_told_why():
    verdict = check_block_hashes(own_tokens)
    assert "wrong text" in verdict.problem and "key of the block before" in verdict.hint


# ---- the budget of one step


def split(decodes, prefills, budget):
    """A right answer of the tests' own (an answer that calls kvlesson's split_budget is refused as delegation)."""
    left, chunks = budget - decodes, []
    for need in prefills:
        chunks.append(min(need, left))
        left -= chunks[-1]
    return chunks


def test_budget_checker_passes_right_answers_and_numpy_ones():
    assert check_split_budget(split)
    assert check_split_budget(lambda d, p, b: np.array(split(d, p, b), dtype=np.int64))
    assert check_split_budget(lambda d, p, b: tuple(split(d, p, b)))


@pytest.mark.parametrize("delegating, name", [
    (split_budget, "engine.split_budget"), (lambda d, p, b: list(split_budget(d, p, b)), "engine.split_budget"),
    (lambda d, p, b: engine.split_budget(d, p, b), "engine.split_budget"),
    (block_hashes, "paged.block_hashes"), (lambda ids, bs: paged.block_hashes(ids, bs)[:], "paged.block_hashes"),
])
def test_an_answer_that_calls_kvlessons_own_function_is_told_so(delegating, name):
    """issue 29: both exercises passed by calling the function the page imports."""
    check = check_split_budget if "budget" in name else check_block_hashes
    verdict = check(delegating)
    assert not verdict and f"calls kvlesson's {name}" in verdict.problem, repr(verdict)


def even(d, p, b):
    share = (b - d) // max(len(p), 1)
    return [min(x, share) for x in p]


def each_alone(d, p, b):
    return [min(x, b - d) for x in p]


def no_cap(d, p, b):
    left, out = b - d, []
    for _ in p:
        out.append(left)
        left = 0
    return out


def negative(d, p, b):
    left, out = b - d, []
    for x in p:
        out.append(min(x, left) if left > 0 else left - 1)
        left -= x
    return out


@pytest.mark.parametrize("wrong, words", [
    (lambda d, p, b: split(0, p, b), "as if the decodes cost nothing"),
    (each_alone, "together they overspend it"),
    (no_cap, "larger than what its prefill still needs"),
    (even, "split evenly"),
    (lambda d, p, b: split(d, p[::-1], b)[::-1], "the last prefill is served first"),
    (lambda d, p, b: split(min(d + 1, b), p, b), "one token of the budget is never used"),
    (lambda d, p, b: [x / 1 for x in split(d, p, b)], "not a whole number"),
    (lambda d, p, b: split(d, p, b) + [0], "chunks for"),
    (negative, "negative chunk"),
    (lambda d, p, b: [min(x, 3) for x in p], "expected [10, 3, 0]"),
    (lambda d, p, b: {"chunks": p}, "returned dict"),
    (todo, "NotImplementedError"),
])
def test_budget_checker_names_the_mistake(wrong, words):
    verdict = check_split_budget(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)
