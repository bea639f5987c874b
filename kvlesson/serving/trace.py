"""Measuring an engine on a trace of requests: when they arrive, what each one saw, what each forward pass cost.

    trace = chat_trace(model, rate=0.5, n=24, new=16)     # [(arrival, prompt ids, new tokens)], arrivals Poisson
    result = replay(engine, trace)                        # an Engine (lesson 13) or lesson 09's Batcher
    result.summary()                                      # throughput, TTFT and TPOT on two clocks

Two clocks: steps, one per forward pass, the same on every machine; and seconds, what each step took here.
"""
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlesson import validate
from kvlesson.configs import ModelLike
from kvlesson.serving.batch import Batcher
from kvlesson.serving.engine import Engine

__all__ = ["poisson_arrivals", "chat_trace", "Replay", "replay"]


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """float [n]: when n requests arrive, a Poisson process of `rate` requests per unit of time (exponential gaps,
    seeded), the first at 0. The unit is the replay's clock: steps or seconds."""
    rate = validate.positive("rate", rate)
    gaps = np.random.default_rng(seed).exponential(1 / rate, validate.integer("n", n, minimum=1))  # [n]
    return np.cumsum(gaps) - gaps[0]


def chat_trace(model: ModelLike, rate: float, n: int, new: int, seed: int = 13, system: int = 60,
               passages: Sequence[int] = (4, 8, 16, 32)) -> list[tuple[float, list[int], int]]:
    """-> [(arrival, prompt ids, new)]: n chat requests for `new` tokens each, arriving as a Poisson process of `rate`
    (seeded). Every request has the same system prompt, the shipped text's first `system` tokens, and asks about a
    passage of the text whose length is drawn from `passages`, from a random place after them. model: SmolLM2 (its
    tokenizer and chat template)."""
    from kvlesson.text import long_text  # a leaf module; only traces need the text

    tok = model.tokenizer
    text = tok.encode(long_text())
    rules = tok.decode(text[:system])
    pick = np.random.default_rng(seed)
    trace = []
    for t in poisson_arrivals(rate, n, seed):
        k = int(pick.choice(passages))
        start = int(pick.integers(system, len(text) - k))
        trace.append((float(t), tok.encode(model.chat_prompt(tok.decode(text[start : start + k]), system=rules)), new))
    return trace


@dataclass(frozen=True)
class Replay:
    """What each request of a trace saw, and what each forward pass cost, on two clocks: steps, one per forward pass
    (the same on every machine), and seconds (each engine step lasts what it took here; waiting for a request that
    has not arrived takes no time on the steps clock, and jumps to its arrival on the seconds clock)."""

    submitted: np.ndarray  # [R] the step before which each request was submitted
    first_step: np.ndarray  # [R] the step its first token came out in
    last_step: np.ndarray  # [R] the step its last token came out in
    new: np.ndarray  # [R] tokens it got
    ttft_s: np.ndarray  # [R] seconds from its arrival to its first token
    tpot_s: np.ndarray  # [R] seconds per token after the first (nan for a single token)
    step_tokens: np.ndarray  # [steps] tokens each forward pass processed (prompts and decodes); nan where none ran
    step_seconds: np.ndarray  # [steps] seconds each took (an engine step of two passes is charged to its second)
    wait_tokens: np.ndarray  # [tokens after each first] tokens processed between the token and the one before it
    outputs: dict  # request index -> its tokens
    preemptions: int | None  # the Engine's count; None for lesson 09's Batcher, which never preempts

    def summary(self) -> dict:
        """Throughput; TTFT and TPOT as (median, p90) on both clocks; the tokens a request waited for between two of
        its tokens as (median, p99): one long step shows in the tail."""
        ran = ~np.isnan(self.step_tokens)
        steps = self.last_step.max() + 1 - self.submitted.min()
        tpot_steps = np.where(self.new > 1, (self.last_step - self.first_step) / np.maximum(self.new - 1, 1), np.nan)
        return dict(tokens_per_step=self.new.sum() / steps, tokens_per_s=self.new.sum() / self.step_seconds[ran].sum(),
                    ttft_steps=_quantiles(self.first_step - self.submitted + 1), tpot_steps=_quantiles(tpot_steps),
                    wait_tokens=_quantiles(self.wait_tokens, 99), ttft_s=_quantiles(self.ttft_s),
                    tpot_s=_quantiles(self.tpot_s), preemptions=self.preemptions)


def _quantiles(x, tail=90):
    """-> (median, the `tail` percentile) of the numbers that are not nan."""
    x = np.asarray(x, float)
    x = x[~np.isnan(x)]
    return (float(np.median(x)), float(np.percentile(x, tail))) if x.size else (math.nan, math.nan)


def replay(engine: Engine | Batcher, trace: Sequence[tuple[float, Sequence[int], int]], clock: str = "steps") -> Replay:
    """Run a trace on an engine -> Replay. trace: [(arrival, prompt ids, max_new_tokens)], arrivals on `clock`:
    "steps" (a request arriving at t is submitted before forward pass ceil(t)) or "seconds" (submitted at the first
    step boundary after it arrives, the clock advanced by each step's wall-clock time). engine: an Engine, or lesson
    09's batch.Batcher, whose step is two forward passes when it admits: the new prompts, whole, then every decode."""
    if clock not in ("steps", "seconds"):
        raise ValueError(f"clock must be 'steps' or 'seconds'; got clock={clock!r}")
    trace = _checked(engine, trace)  # every request, before the first one runs
    R = len(trace)
    order = sorted(range(R), key=lambda i: trace[i][0])
    submitted, first, last, new = np.full(R, -1), np.full(R, -1), np.full(R, -1), np.zeros(R, int)
    start, ttft, last_s = np.zeros(R), np.full(R, math.nan), np.full(R, math.nan)  # seconds on the clock
    seen = np.zeros(R)  # tokens processed, in all, when each request's latest token came out
    step_tokens, step_seconds, wait, outputs, index = [], [], [], {i: [] for i in range(R)}, {}
    seconds, s, k, processed = 0.0, 0, 0, 0
    while k < R or not engine.done:
        now = s if clock == "steps" else seconds
        while k < R and trace[order[k]][0] <= now:
            i = order[k]
            index[engine.submit(list(trace[i][1]), trace[i][2])] = i
            submitted[i], start[i], k = s, seconds if clock == "steps" else trace[i][0], k + 1
        if engine.done:  # nothing to run until the next arrival
            if clock == "steps":
                step_tokens.append(math.nan)
                step_seconds.append(0.0)
                s += 1
            else:
                seconds = trace[order[k]][0]
            continue
        t0 = time.perf_counter()
        out = engine.step()
        took = time.perf_counter() - t0
        seconds += took
        passes = _passes(engine, out, new, index, trace)
        for n, (tokens, emitted) in enumerate(passes):
            processed += tokens
            step_tokens.append(tokens)
            step_seconds.append(took if n == len(passes) - 1 else 0.0)
            for rid, token in emitted:
                i = index[rid]
                if new[i] == 0:
                    first[i], ttft[i] = s, seconds - start[i]
                else:
                    wait.append(processed - seen[i])
                new[i], seen[i], last[i], last_s[i] = new[i] + 1, processed, s, seconds
                outputs[i].append(token)
            s += 1
    tpot = np.where(new > 1, (last_s - (start + ttft)) / np.maximum(new - 1, 1), math.nan)
    return Replay(submitted, first, last, new, ttft, tpot, np.array(step_tokens, float), np.array(step_seconds),
                  np.array(wait, float), outputs, engine.stats["preemptions"] if isinstance(engine, Engine) else None)


def _checked(engine, trace):
    """-> the trace as a list of (arrival, ids, new), each request checked as the engine's submit would check it."""
    if isinstance(trace, (str, bytes)) or not hasattr(trace, "__len__") or not len(trace):
        raise ValueError(f"trace must be a non-empty list of (arrival, prompt ids, max_new_tokens); got {trace!r:.60}")
    checked = []
    for i, entry in enumerate(trace):
        try:
            arrival, ids, new = entry
        except (TypeError, ValueError):
            raise ValueError(f"trace[{i}] must be (arrival, prompt ids, max_new_tokens); got {entry!r:.60}") from None
        arrival = validate.real(f"trace[{i}] arrival", arrival, minimum=0)
        checked.append((arrival, *engine.check(ids, new, name=f"trace[{i}] ids")))
    return checked


def _passes(engine, out, new, index, trace):
    """-> [(tokens processed, [(rid, token) emitted])] for each forward pass of the step just run. The Engine runs one
    and logs its tokens; lesson 09's Batcher first prefills the requests it admitted (whole prompts: their first
    tokens), then decodes every running sequence (one token each)."""
    if isinstance(engine, Engine):
        return [(engine.log[-1]["tokens"], out)]
    admitted = len({rid for rid, _ in out if new[index[rid]] == 0})
    prefilled, decoded = out[:admitted], out[admitted:]  # Batcher.step lists the prefill's tokens first
    passes = [(sum(len(trace[index[rid]][1]) for rid, _ in prefilled), prefilled)] if prefilled else []
    return passes + ([(len(decoded), decoded)] if decoded else [])
