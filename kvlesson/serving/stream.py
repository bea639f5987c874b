"""Tokens in, text out: what a server may send a client after each step, and where stop strings cut the text.

    text = TextStream(tokenizer.decode, stops=["\\n\\n"], stop_ids=(eos,))
    for tokens in each step's new tokens:
        send(text.push(tokens))         # "" while nothing is safe to send yet
        if text.stopped: abort the request (kvlesson.serving.Engine.abort)
    send(text.finish())                 # the end of a request that met no stop string

Two things make "decode the new token and send it" wrong:
  - a token is bytes, not characters: byte-level BPE splits a character of several UTF-8 bytes (an emoji, most CJK
    text) over several tokens, and decoding a token alone gives U+FFFD, the replacement character. So the whole
    text is decoded and nothing is sent past a trailing U+FFFD until the bytes that complete it arrive;
  - a stop string is text, not a token: it can start inside one token and end inside another, and the token that
    completes it may carry more text after it. The text ends just before the first character of the stop string
    completed first: the stop string and whatever follows it, in that token or any, are never sent (OpenAI's rule:
    "the returned text will not contain the stop sequence"). And since a stop string may still be completing, the
    longest tail of the text that could be the beginning of one is held back until it is resolved either way.
A token in stop_ids (the end-of-text token) ends the text too, and its own text (`<|im_end|>`) is never sent.
"""
from collections.abc import Callable, Iterable

__all__ = ["TextStream"]

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole character


class TextStream:
    """One request's text as a client receives it: push each step's tokens, send what push returns."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Iterable[str] = (), stop_ids: Iterable[int] = ()):
        self.decode = decode
        self.stops = tuple(stops)
        if not all(isinstance(s, str) and s for s in self.stops):
            raise ValueError(f"stop strings must be non-empty strings; got {self.stops!r}")
        self.stop_ids = frozenset(stop_ids)
        self.tokens = []  # every token pushed that belongs to the text (not a stop id)
        self.text = ""  # the text so far, cut at a stop string once one is found
        self.sent = 0  # characters of it already handed out
        self.stopped = None  # the stop string or stop id that ended the text, if one did

    def push(self, tokens: Iterable[int]) -> str:
        """Add a step's tokens -> the text that is now safe to send (maybe "")."""
        if self.stopped is not None:
            return ""
        for t in tokens:
            if t in self.stop_ids:
                self.stopped = t
                break
            self.tokens.append(t)
        self.text = self.decode(self.tokens)
        found = self._first_stop()
        if found is not None:
            self.text, self.stopped = self.text[: found[0]], found[1]
            return self._send(len(self.text))
        if self.stopped is not None:  # a stop id: what it leaves is final
            return self._send(len(self.text))
        safe = len(self.text.rstrip(REPLACEMENT))  # whole characters only
        return self._send(safe - self._held(safe))

    def finish(self) -> str:
        """The request ended (its length, a stop id): -> whatever was still held back."""
        return self._send(len(self.text))

    def _first_stop(self):
        """-> (where the stop string that ends the text starts, which one), or None. It is the one completed first, as
        the text grew character by character (of two completed by the same character, the one that starts first):
        so the cut does not depend on how many tokens a step brought. Held-back text is the only place one can
        start: anything sent was no stop string's beginning."""
        hits = [(i + len(s), i, s) for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        return min(hits)[1:] if hits else None

    def _held(self, end):
        """-> how many characters before `end` could be the beginning of a stop string still completing."""
        return max((n for s in self.stops for n in range(min(len(s) - 1, end - self.sent), 0, -1)
                    if self.text.endswith(s[:n], 0, end)), default=0)

    def _send(self, upto):
        out, self.sent = self.text[self.sent : max(upto, self.sent)], max(upto, self.sent)
        return out
