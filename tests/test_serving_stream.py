"""TextStream (kvlesson.serving.stream): what a client receives, piece by piece, against the whole text cut once.

Under hypothesis over byte sequences full of multi-byte characters (split across tokens by a byte tokenizer, one
token per byte), stop strings that begin inside them and overlap each other, and steps that bring one to three tokens:
the pieces joined equal the whole decoded text cut just before the stop string completed first; every piece is whole
characters; nothing sent is ever taken back, and no piece holds a stop string or any of its text. Then the
mutants: checking each token's own text for the stop string, and sending a token's text as soon as it is decoded.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlesson.serving import stream
from kvlesson.serving.stream import TextStream
from tests.helpers import byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.eos_id
TEXT = st.text(alphabet=st.sampled_from(list("ab \n:é🍵€x")), max_size=14)


def expected(tokens, stops):
    """The whole text, decoded once, cut before the first stop id; then grown character by character until a stop
    string ends, and cut where that one starts (the one starting first, if two end at the same character)."""
    if EOS in tokens:
        tokens = tokens[: tokens.index(EOS)]
    text = TOK.decode(tokens)
    for end in range(1, len(text) + 1):
        ending = [end - len(s) for s in stops if text[:end].endswith(s)]
        if ending:
            return text[: min(ending)]
    return text


@settings(max_examples=300)
@given(TEXT, st.lists(st.text(alphabet=st.sampled_from(list("ab \n:é🍵")), min_size=1, max_size=4), max_size=3),
       st.booleans(), st.integers(1, 3))
def test_the_pieces_join_to_the_text_cut_before_the_first_stop(text, stops, end, chunk):
    tokens = TOK.encode(text) + ([EOS] if end else [])
    s = TextStream(TOK.decode, stops, stop_ids=(EOS,))
    pieces = [s.push(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    pieces.append(s.finish())
    want = expected(tokens, stops)
    assert "".join(pieces) == want
    assert all(stream.REPLACEMENT not in p for p in pieces[:-1] if "\ufffd" not in want)
    sent = ""
    for p in pieces:
        sent += p
        assert want.startswith(sent)  # nothing sent is ever taken back
    assert not any(stop in sent for stop in stops)


def test_a_stop_string_that_ends_inside_a_token_cuts_that_token():
    """"done" starts inside token 2 (" do") and ends inside token 3 ("ne now"): " do" is held back while it might
    become the stop string, and the text ends before it, "ne now" dropped with it."""
    s = TextStream(lambda ids: "".join({1: "well", 2: " do", 3: "ne now"}[i] for i in ids), ["done"])
    assert [s.push([t]) for t in (1, 2, 3)] == ["well", " ", ""]
    assert s.text == "well " and s.stopped == "done"


def per_token(self, tokens):
    """The bug: each token decoded and checked on its own."""
    out = ""
    for t in tokens:
        piece = self.decode([t])
        if any(s in piece for s in self.stops):
            self.stopped = True
            return out
        out += piece
    return out


def test_checking_each_tokens_own_text_is_caught():
    with pytest.MonkeyPatch.context() as mp, pytest.raises(AssertionError):
        mp.setattr(TextStream, "push", per_token)
        test_the_pieces_join_to_the_text_cut_before_the_first_stop.hypothesis.inner_test("ab\n\n:x", ["\n\n"], False,
                                                                                          1)


def test_sending_text_before_its_character_is_whole_is_caught():
    with pytest.MonkeyPatch.context() as mp, pytest.raises(AssertionError):
        mp.setattr(stream, "REPLACEMENT", "")  # nothing held back at a split character
        test_the_pieces_join_to_the_text_cut_before_the_first_stop.hypothesis.inner_test("é🍵", [], False, 1)
