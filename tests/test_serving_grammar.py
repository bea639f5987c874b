"""Constrained output (kvlesson.serving.grammar) in the Engine: the mask keeps every output inside the grammar, and
jump-forward feeds forced tokens as one chunk with the same tokens as one step each, saving exactly one step per
forced token. On the tiny float64 model with a byte tokenizer (every character a token, so forced runs are long).
Mutants: a sampler that ignores the mask, and jump-forward that forgets to move the grammar past the forced tokens.
"""
import json
import re
from unittest import mock

import numpy as np
import pytest

from kvlesson.sample import Sampling
from kvlesson.serving import Engine, engine
from kvlesson.serving.grammar import Grammar
from tests.helpers import tiny_chat_model

MODEL = tiny_chat_model(seed=3)
TOK = MODEL.tokenizer
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "rank": {"type": "integer", "minimum": 1, "maximum": 99},
                                           "kind": {"enum": ["capital", "port"]}},
          "required": ["city", "rank", "kind"], "additionalProperties": False}
PROMPTS = [TOK.encode(f"request {i}:") for i in range(6)]


def serve_all(jump_forward, grammar=lambda: Grammar.json_schema(TOK, SCHEMA), n=80):
    eng = Engine(MODEL, n_blocks=128, block_size=4, max_batch_tokens=64, jump_forward=jump_forward)
    rids = [eng.submit(p, n, stop_ids=(TOK.eos_id,), sampling=Sampling(temperature=1.0, seed=i), grammar=grammar())
            for i, p in enumerate(PROMPTS)]
    out = eng.run()
    return [out[r] for r in rids], eng


def text(tokens):
    return TOK.decode([t for t in tokens if t != TOK.eos_id])


def test_every_output_parses_and_jump_forward_gives_the_same_tokens_in_fewer_steps():
    fast, e_fast = serve_all(True)
    slow, e_slow = serve_all(False)
    assert fast == slow  # the requests batched together, forced runs chunked or not
    for tokens in fast:
        value = json.loads(text(tokens))
        assert set(value) == {"city", "rank", "kind"} and value["kind"] in ("capital", "port")
    assert e_fast.stats["forced_tokens"] == e_slow.stats["forced_tokens"] > 6 * len('{"city": "')
    assert e_slow.stats["steps"] > e_fast.stats["steps"]


def test_jump_forward_saves_one_step_per_forced_token():
    """A request alone: one step each, it takes a step per token; jump-forward takes `forced` fewer."""
    for i, prompt in enumerate(PROMPTS[:3]):
        steps = {}
        for jump in (True, False):
            eng = Engine(MODEL, n_blocks=64, block_size=4, jump_forward=jump)
            rid = eng.submit(prompt, 80, stop_ids=(TOK.eos_id,), sampling=Sampling(temperature=1.0, seed=i),
                             grammar=Grammar.json_schema(TOK, SCHEMA))
            tokens = eng.run()[rid]
            steps[jump] = eng.stats["steps"]
        forced = eng.stats["forced_tokens"]
        assert steps[False] == len(tokens) and steps[True] == len(tokens) - forced


def test_a_regex_holds_every_sample():
    out, _ = serve_all(True, lambda: Grammar.regex(TOK, r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])"))
    assert all(re.fullmatch(r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])", text(t)) for t in out)


def test_a_sampler_that_ignores_the_mask_is_caught():
    real = engine.sample
    with mock.patch.object(engine, "sample", lambda row, params, **kw: real(row, params, **dict(kw, allowed=None))):
        with pytest.raises(ValueError, match="does not allow"):  # the grammar refuses the first stray token
            serve_all(True)


def test_jump_forward_that_leaves_the_grammar_behind_is_caught():
    real = Grammar.accept

    def forgetful(self, tokens):
        if len(tokens) > 1:  # the forced run: emitted, but the grammar not moved past it
            return None
        return real(self, tokens)

    with mock.patch.object(Grammar, "accept", forgetful), pytest.raises((ValueError, AssertionError)):
        test_every_output_parses_and_jump_forward_gives_the_same_tokens_in_fewer_steps()


def test_a_grammar_the_library_refuses_is_refused_by_name():
    with pytest.raises(ValueError, match="schema: the grammar library refuses it"):
        Grammar.json_schema(TOK, {"type": "frobnicate"})
    with pytest.raises(ValueError, match="pattern: the grammar library refuses it"):
        Grammar.regex(TOK, "(unclosed")
    with pytest.raises(ValueError, match="fresh"):
        g = Grammar.regex(TOK, "ab")
        g.accept(TOK.encode("a"))
        Engine(MODEL, 8, 4).submit([1, 2], 4, grammar=g)


def test_the_mask_and_a_checkpoint():
    g = Grammar.regex(TOK, "ab|ac")
    allowed = g.allowed(MODEL.config.vocab)
    assert allowed.dtype == np.bool_ and np.flatnonzero(allowed).tolist() == TOK.encode("a")
    undo = g.checkpoint()
    g.accept(TOK.encode("a"))
    assert sorted(np.flatnonzero(g.allowed(MODEL.config.vocab))) == sorted(TOK.encode("b") + TOK.encode("c"))
    undo()
    assert g.consumed == 0 and np.flatnonzero(g.allowed(MODEL.config.vocab)).tolist() == TOK.encode("a")
    with pytest.raises(ValueError, match="does not allow"):
        g.accept(TOK.encode("b"))
