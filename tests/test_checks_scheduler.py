"""The lesson 13 checkers pass kvlesson's answers and other right ones, and name each typical mistake."""
import hashlib
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvlesson import Engine, llama
from kvlesson import model as kvmodel
from kvlesson.serving import engine, paged
from kvlesson.serving.engine import split_budget
from kvlesson.serving.paged import block_hashes
from kvlesson.teaching.checks import check_block_hashes, check_blocks_to_start, check_preemption, check_split_budget
from kvlesson.teaching.checks import scheduler as checks_scheduler
from kvlesson.teaching.checks.scheduler import blocks_to_start, preempted


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


# ---- blocks to start: admission on current need, with a prefix cache


def start_cost(P, cached, bs, idle):
    """Worked out from the lesson's words: the prompt's blocks, less the shared cached ones, plus one copy when the
    whole prompt is cached (its last token still runs, into a shared block)."""
    return math.ceil(P / bs) - (0 if idle else cached) + (cached * bs == P and not idle)


def test_blocks_to_start_checker_passes_a_right_answer():
    assert check_blocks_to_start(start_cost)
    assert check_blocks_to_start(lambda P, c, bs, idle: np.int64(start_cost(P, c, bs, idle)))


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 70), bs=st.integers(1, 9), idle=st.booleans(), data=st.data())
def test_the_lessons_formula_is_what_the_pool_takes(P, bs, idle, data):
    """The reference asks a real pool (cached_cost, what the Engine admits by); the formula the lesson derives agrees
    with it on every prompt, block size and cached prefix."""
    cached = data.draw(st.integers(0, P // bs))
    assert start_cost(P, cached, bs, idle) == blocks_to_start(P, cached, bs, idle)


@pytest.mark.parametrize("wrong, words", [
    (lambda P, c, bs, idle: math.ceil(P / bs) - (0 if idle else c), "copies the block first"),
    (lambda P, c, bs, idle: math.ceil(P / bs), "they cost nothing"),
    (lambda P, c, bs, idle: math.ceil(P / bs) - c + (c * bs == P), "costs one, like a fresh block"),
    (lambda P, c, bs, idle: P // bs - (0 if idle else c) + (c * bs == P and not idle), "ceil(P / block_size)"),
    (lambda P, c, bs, idle: math.ceil(P / bs) + 1, "not room for the answer"),
    (lambda P, c, bs, idle: start_cost(P, c, bs, idle) + 0.5, "whole number"),
    (lambda P, c, bs, idle: str(start_cost(P, c, bs, idle)), "text that spells a number"),
    (lambda P, c, bs, idle: None, "expected a number"),
    (lambda P, c, bs, idle: blocks_to_start(P, c, bs, idle), "calls kvlesson's"),
    (todo, "NotImplementedError"),
])
def test_blocks_to_start_checker_names_the_mistake(wrong, words):
    verdict = check_blocks_to_start(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


# ---- preemption: who goes, when a decode needs a block


def victims(lengths, free, bs):
    """Written from the lesson's words, another way: a set of running sequences, the newest evicted first."""
    alive, out, spent = set(range(len(lengths))), [], 0
    for i, n in enumerate(lengths):
        if i in alive and n % bs == 0:
            while i in alive and free - spent < 1:
                newest = max(alive)
                alive.discard(newest)
                out.append(newest)
                free += -(-lengths[newest] // bs)
            spent += i in alive
    return out


def test_preemption_checker_passes_a_right_answer():
    assert check_preemption(victims)
    assert check_preemption(lambda n, f, bs: np.array(victims(n, f, bs), dtype=np.int64))


@settings(max_examples=25, deadline=None)
@given(prompts=st.lists(st.integers(1, 12), min_size=1, max_size=5), bs=st.sampled_from([2, 4]),
       spare=st.integers(0, 2))
def test_the_reference_victims_are_the_engines(prompts, bs, spare):
    """Engine, tiny model, no prefix caching: every prompt prefilled in one step with `spare` blocks left, then the
    next step's decodes; the requests it preempts are the reference's victims."""
    cfg = kvmodel.tiny_config(n_layers=1, D=8, H=2, Hkv=1, d=4, hidden=8, vocab=32, max_len=64)
    tiny = llama.Model(cfg, kvmodel.random_weights(cfg, seed=1), tokenizer=None)
    held = sum(-(-p // bs) for p in prompts)
    assume(all(-(-(p + 1) // bs) <= held + spare for p in prompts))  # each fits the pool alone (submit checks)
    eng = Engine(tiny, held + spare, bs, max_batch_tokens=256, prefix_caching=False)
    for p in prompts:
        eng.submit(list(range(1, p + 1)), 2)
    eng.step()
    assert len(eng.running) == len(prompts)  # all admitted, each now decoding at length = its prompt
    eng.step()
    assert eng.log[-1]["preempted"] == preempted(prompts, spare, bs) == victims(prompts, spare, bs)


@pytest.mark.parametrize("wrong, words", [
    (lambda n, f, bs: [i for i, L in enumerate(n) if L % bs == 0][: max(0, sum(L % bs == 0 for L in n) - f)],
     "is not the victim unless it is the newest"),
    (lambda n, f, bs: victims([L - 1 for L in n], f, bs), "you preempted"),
    (lambda n, f, bs: victims(n, f, bs)[:1], "you preempted"),
    (lambda n, f, bs: victims(n, f, bs)[::-1] if len(victims(n, f, bs)) > 1 else victims(n, f, bs) + [0],
     "you preempted"),
    (lambda n, f, bs: {"victims": []}, "expected a list of sequence indices"),
    (lambda n, f, bs: [0.0], "expected a list of sequence indices"),
    (lambda n, f, bs: preempted(n, f, bs), "calls kvlesson's"),
    (todo, "NotImplementedError"),
])
def test_preemption_checker_names_the_mistake(wrong, words):
    verdict = check_preemption(wrong)
    assert not verdict and words in repr(verdict), repr(verdict)


def test_each_preemption_slip_is_told_its_own_hint():
    for slip in checks_scheduler._PREEMPT_SLIPS:
        verdict = check_preemption(slip.wrong)
        assert not verdict and verdict.hint == slip.hint, (slip.name, repr(verdict))
    for slip in checks_scheduler._START_SLIPS:
        verdict = check_blocks_to_start(slip.wrong)
        assert not verdict and verdict.hint == slip.hint, (slip.name, repr(verdict))
