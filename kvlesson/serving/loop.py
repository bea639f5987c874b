"""The engine in one background thread: requests join and leave between steps, text flows out as it is made.

    loop = EngineLoop(Engine(model, n_blocks=128), model.tokenizer.decode)
    loop.start()
    ticket = loop.submit(ids, 64, stop_ids=(eos,), on_event=print)   # from any thread; events come from the loop's
    loop.abort(ticket)                                               # the client went away: its blocks come back
    loop.stop()

An Engine is not thread-safe, and it need not be: only the loop's thread touches it. Other threads (a web server's)
put commands in an inbox; between two steps the loop takes every command waiting (submits, aborts), runs one step,
turns each request's new tokens into text (kvlesson.serving.stream.TextStream: whole characters only, stop strings
cut), and hands each ticket its events through on_event(kind, **details), called on the loop's thread:
    ("text", text=...)                       new text, as it becomes safe to send
    ("end", finish_reason=..., usage=...)    the last event of a request: "stop" (a stop id, a stop string, its
                                             grammar complete), "length" (max_new_tokens), "abort" (aborted, or the
                                             loop stopped), or "error" (with message=...)
When no request is in the engine the thread sleeps until a command arrives.
"""
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvlesson.sample import GREEDY, Sampling
from kvlesson.serving.engine import Engine
from kvlesson.serving.grammar import Grammar
from kvlesson.serving.stream import TextStream

__all__ = ["EngineLoop", "Ticket"]


@dataclass(eq=False)
class Ticket:
    """One request as the loop tracks it: what was asked, the text so far, and when things happened."""

    ids: list
    max_new_tokens: int
    stop_ids: tuple
    sampling: Sampling
    grammar: object
    text: TextStream
    on_event: Callable
    number: int = 0  # the loop's own count of tickets
    rid: int | None = None  # the engine's request id, once the loop has submitted it
    finish_reason: str | None = None  # set once the request has ended
    times: dict = field(default_factory=dict)  # perf_counter seconds: "queued", "submitted", "first", "end"

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None


class EngineLoop:
    """An Engine stepped by one thread of its own; submit and abort from any other."""

    def __init__(self, engine: Engine, decode: Callable[[list[int]], str]):
        self.engine, self.decode = engine, decode
        self.inbox = queue.SimpleQueue()  # ("submit" | "abort", ticket) from other threads
        self.lock = threading.Lock()  # held while the loop works on the engine: stats() waits for a step to end
        self.tickets = {}  # rid -> ticket, for requests in the engine that have not ended
        self.error = None  # the last exception a step raised (the step itself was undone)
        self._numbers = itertools.count()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvlesson-engine", daemon=True)

    # ---- from any thread

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def submit(self, ids: Sequence[int], max_new_tokens: int, *, stop_ids: Sequence[int] = (),
               stops: Sequence[str] = (), sampling: Sampling = GREEDY, grammar: Grammar | None = None,
               on_event: Callable = lambda kind, **details: None) -> Ticket:
        """Queue a request for the loop -> its ticket. Checked by the engine when the loop takes it: a refusal
        arrives as an ("end", finish_reason="error") event (check it first with engine.check to answer at once)."""
        ticket = Ticket(list(ids), max_new_tokens, tuple(stop_ids), sampling, grammar,
                        TextStream(self.decode, stops, stop_ids), on_event, next(self._numbers))
        ticket.times["queued"] = time.perf_counter()
        self._post("submit", ticket)
        return ticket

    def abort(self, ticket: Ticket) -> None:
        """Stop a ticket's request at the next boundary between steps; nothing happens to one that has ended."""
        self._post("abort", ticket)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after the step it is in; every request still open ends with "abort"."""
        self._stopping.set()
        self.inbox.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the engine thread did not stop within {timeout} s")

    def stats(self) -> dict:
        """The engine's stats (kvlesson.serving.Engine.stats), read between two steps."""
        with self.lock:
            return self.engine.stats

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _post(self, kind, ticket):
        if self._stopping.is_set():
            raise RuntimeError("the engine loop has stopped")
        self.inbox.put((kind, ticket))

    # ---- on the loop's thread

    def _run(self):
        try:
            while not self._stopping.is_set():
                with self.lock:
                    self._commands(block=self.engine.done)
                    if not self.engine.done and not self._stopping.is_set():
                        self._step()
        finally:
            with self.lock:
                self._commands(block=False)
                for ticket in list(self.tickets.values()):
                    self.engine.abort(ticket.rid)
                    self._end(ticket, "abort")

    def _commands(self, block):
        """Take every command waiting; with block, sleep until one comes (the engine has nothing to do)."""
        while True:
            try:
                if block:
                    self.lock.release()  # let stats() in while the loop sleeps
                    try:
                        kind, ticket = self.inbox.get()
                    finally:
                        self.lock.acquire()
                    block = False
                else:
                    kind, ticket = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                self._admit(ticket)
            elif kind == "abort" and not ticket.ended:
                if ticket.rid is not None:
                    self.engine.abort(ticket.rid)
                self._end(ticket, "abort")

    def _admit(self, ticket):
        if self._stopping.is_set():
            return self._end(ticket, "abort")
        try:
            ticket.rid = self.engine.submit(ticket.ids, ticket.max_new_tokens, ticket.stop_ids, ticket.sampling,
                                            ticket.grammar)
        except (ValueError, TypeError) as e:
            return self._end(ticket, "error", message=str(e))
        ticket.times["submitted"] = time.perf_counter()
        self.tickets[ticket.rid] = ticket

    def _step(self):
        try:
            out = self.engine.step()
        except Exception as e:  # the step was undone (kvlesson.atomic); its requests cannot go on
            self.error = e
            for ticket in list(self.tickets.values()):
                self.engine.abort(ticket.rid)
                self._end(ticket, "error", message=f"{type(e).__name__}: {e}")
            return
        new = {}
        for rid, token in out:
            new.setdefault(rid, []).append(token)
        now = time.perf_counter()
        for rid, tokens in new.items():
            ticket = self.tickets[rid]
            ticket.times.setdefault("first", now)
            text = ticket.text.push(tokens)
            if text:
                ticket.on_event("text", text=text)
            request = self.engine.requests[rid]
            if isinstance(ticket.text.stopped, str):  # a stop string: the rest of the request is not wanted
                self.engine.abort(rid)
                self._end(ticket, "stop")
            elif request.done:
                ended_itself = request.tokens[-1] in request.stop_ids or (request.grammar is not None and
                                                                          request.grammar.finished)
                self._end(ticket, "stop" if ended_itself else "length")

    def _end(self, ticket, reason, **details):
        if ticket.ended:
            return
        rest = ticket.text.finish() if reason in ("stop", "length") else ""
        if rest:
            ticket.on_event("text", text=rest)
        ticket.finish_reason = reason
        ticket.times["end"] = time.perf_counter()
        self.tickets.pop(ticket.rid, None)
        made = len(self.engine.requests[ticket.rid].tokens) if ticket.rid is not None else 0
        usage = {"prompt_tokens": len(ticket.ids), "completion_tokens": made, "total_tokens": len(ticket.ids) + made}
        ticket.on_event("end", finish_reason=reason, usage=usage, **details)
