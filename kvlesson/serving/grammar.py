"""Constrained output: what a request's text must match, as a mask over the vocabulary at every step (lesson 16).

    g = Grammar.json_schema(model.tokenizer, {"type": "object", ...})   # or Grammar.regex(model.tokenizer, r"...")
    rid = engine.submit(ids, 64, stop_ids=(eos,), grammar=g)           # every output parses

The grammar library is llguidance (github.com/guidance-ai/llguidance, the engine behind constrained output in
llama.cpp, vLLM and SGLang). It walks the grammar over the bytes of the tokens so far and answers two questions:
  - allowed(V): which tokens may come next (bool [V]). The sampler (kvlesson.sample) sets every other logit to -inf
    before it draws, so whatever the sampling, only text the grammar accepts comes out;
  - forced(): the tokens that must come next whatever the model says, because the grammar allows exactly one way on
    for several bytes (`{"name": ` after `{` in a schema whose only first key is name). They need no draw, and no
    decode step of their own: the engine feeds them to the model as one chunk (jump-forward).
Forced tokens are the canonical tokenization of the forced bytes (llguidance's compute_ff_tokens): at such a point
the mask alone would also allow spelling the same bytes in smaller pieces, which the model was never trained on.

A Grammar is one request's: it remembers the tokens it has accepted. checkpoint() lets an engine step that is cut
short put it back (kvlesson.atomic). JSON is compiled without free whitespace (", " and ": " between items): with it,
every position allows a space or a newline, nothing is ever forced, and a small model can pad with newlines for ever.
"""
import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a name for the annotation only: the model's own tokenizer
    from kvlesson.llama import Tokenizer

__all__ = ["Grammar", "JSON_OPTIONS"]

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as json.dumps writes


@functools.lru_cache(maxsize=4)
def _library_tokenizer(tokenizer):
    """The llguidance view of a kvlesson tokenizer (its byte-level BPE as tokenizers' JSON): about a second to build,
    so built once per tokenizer."""
    import llguidance

    return llguidance.LLTokenizer(tokenizer.hf.to_str(), eos_token=tokenizer.eos_id)


class Grammar:
    """One request's grammar: the tokens allowed next, the tokens forced next, and whether it is complete."""

    def __init__(self, tokenizer: "Tokenizer", grammar: str, name: str = "grammar"):
        """tokenizer: the model's (kvlesson.weights.tokenizer.Tokenizer); grammar: llguidance's grammar text (what
        LLMatcher.grammar_from_json_schema, _regex or _lark return). ValueError, naming `name`, when the library
        refuses it."""
        import llguidance

        lib = _library_tokenizer(tokenizer)
        problem = llguidance.LLMatcher.validate_grammar(grammar, lib)
        if problem:
            raise ValueError(f"{name}: the grammar library refuses it: {problem.strip().splitlines()[0]}")
        self.matcher = llguidance.LLMatcher(lib, grammar, log_level=0)
        self.eos = tokenizer.eos_id
        self.consumed = 0  # tokens accepted so far

    @classmethod
    def json_schema(cls, tokenizer, schema) -> "Grammar":
        """Output that is one JSON value valid under `schema` (a dict, or its JSON text)."""
        import llguidance

        try:
            text = schema if isinstance(schema, str) else json.dumps(schema)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            raise ValueError(f"schema: the grammar library refuses it: {e}") from None
        return cls(tokenizer, grammar, "schema")

    @classmethod
    def regex(cls, tokenizer, pattern: str) -> "Grammar":
        """Output that matches the regular expression `pattern` whole."""
        import llguidance

        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str; got {type(pattern).__name__}")
        return cls(tokenizer, llguidance.LLMatcher.grammar_from_regex(pattern), "pattern")

    def allowed(self, V: int) -> np.ndarray:
        """-> bool [V]: the tokens that may come next (the end-of-text token once the grammar is complete)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")  # [32 n]
        out = np.zeros(V, dtype=bool)  # [V]: a model's vocabulary may be padded past the tokenizer's
        n = min(V, bits.size)
        out[:n] = bits[:n]
        return out

    def forced(self) -> list[int]:
        """-> the tokens that must come next, in order, whatever the model would say ([] when there is a choice)."""
        return list(self.matcher.compute_ff_tokens())

    def accept(self, tokens: list[int]) -> None:
        """Move past `tokens`. ValueError if the grammar does not allow them (nothing moves then)."""
        if self.matcher.validate_tokens(list(tokens)) < len(tokens):
            raise ValueError(f"the grammar does not allow the tokens {list(tokens)} here")
        self.matcher.consume_tokens(list(tokens))
        self.consumed += len(tokens)

    @property
    def finished(self) -> bool:
        """Complete: nothing more may come but the end of the text (which may have come already)."""
        return self.matcher.is_stopped()

    def checkpoint(self) -> Callable[[], None]:
        """-> restore(): puts the grammar back where it is now (a copy of the matcher's state, about a microsecond)."""
        matcher, consumed = self.matcher.deep_copy(), self.consumed

        def restore():
            self.matcher, self.consumed = matcher, consumed
        return restore
