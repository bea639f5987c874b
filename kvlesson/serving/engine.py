"""The scheduler of a serving engine: what runs in each step, on one paged pool, in one forward pass (lesson 13).

    eng = Engine(model, n_blocks=64)             # model: kvlesson.llama.load(), or anything with .config and .weights
    rid = eng.submit(ids, 32, stop_ids=(2,))     # between steps, at any time
    eng.step()                                   # one forward pass -> [(rid, token), ...] emitted in it
    outputs = eng.run()                          # step until every request is done -> {rid: [new token ids]}

A step spends a budget of max_batch_tokens tokens (Sarathi-Serve's stall-free batching, arXiv 2403.02310):
  1. one token for every running sequence that is decoding, oldest first, never skipped. When a decode needs a block
     and none is free, the most recently admitted sequence is preempted: by "recompute" (its blocks are freed, and it
     prefills its prompt and everything it generated again later) or by "swap" (its blocks are copied out to host
     memory and back in later). Either way its tokens come out as they would alone;
  2. what is left goes to prefill chunks (split_budget): the admitted sequences still prefilling, in the order they
     were admitted, then new ones. Swapped-out sequences come back first, then waiting requests in order of arrival,
     each admitted once the blocks of what it must prefill fit beside what the others were promised: admission on
     current need, not on the longest answer the request might have.
With prefix caching (vLLM's automatic prefix caching), a full block is known by a key chained over every token up to
its end (kvlesson.serving.paged.block_hash); a new request starts on every cached block of its longest cached prefix,
and the blocks of finished sequences stay cached until a free block is wanted.

Every step is one call of kvlesson.serving.batch.run: decodes and prefill chunks side by side in one [N, D] matrix.
poisson_arrivals, chat_trace and replay measure an engine (this one, or lesson 09's Batcher) on a trace of requests.
"""
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvlesson import validate
from kvlesson.serving import batch

__all__ = ["Engine", "split_budget", "poisson_arrivals", "chat_trace", "replay"]

PREEMPTION = ("recompute", "swap")
COUNTS = ("preemptions", "prefix_hit_tokens", "recomputed_tokens", "swap_bytes")  # the running totals in stats


def split_budget(decodes, prefills, budget):
    """How one step spends its token budget -> [chunk for each prefill], in order.

    decodes: sequences decoding, one token each, paid first (a decode is never skipped); prefills: tokens each
    prefilling sequence still has to process, in the order they are served; budget: max_batch_tokens. What the decodes
    leave goes to the prefills in order, each taking what it needs or what is left, whichever is less.
    """
    left = validate.integer("budget", budget, minimum=1) - validate.integer("decodes", decodes)
    if left < 0:
        raise ValueError(f"{decodes} decodes do not fit a budget of {budget} tokens")
    chunks = []
    for want in prefills:
        chunks.append(min(validate.integer("prefill", want), left))
        left -= chunks[-1]
    return chunks


@dataclass(eq=False)  # a request is itself: hashed by identity, so it can key a step's plan
class Request:
    id: int
    prompt: list
    max_new_tokens: int
    stop_ids: frozenset
    submitted: tuple  # (step, seconds) when it was submitted
    tokens: list = field(default_factory=list)  # generated so far: streamed as they come, never taken back
    seq: int | None = None  # its sequence in the pool, while it holds blocks there
    swapped: object = None  # its blocks, while swapped out (a paged.SwappedSequence)
    first: tuple | None = None  # (step, seconds) when its first token came out
    last: float | None = None  # seconds, when its last token came out
    hit_tokens: int = 0  # positions it found in the prefix cache, over all its admissions
    preemptions: int = 0
    held: int = 0  # positions it held when last preempted

    @property
    def ids(self):
        """What its sequence must hold before its next token can come out: the prompt and every token so far."""
        return self.prompt + self.tokens

    @property
    def done(self):
        return len(self.tokens) == self.max_new_tokens or bool(self.tokens and self.tokens[-1] in self.stop_ids)


class Engine:
    """Continuous batching with a scheduler: admission on current need, chunked prefill mixed with decode under a
    token budget, preemption by recompute or swap, automatic prefix caching, stop ids. Greedy; the pool's dtype is
    the model's (float32 as SmolLM2 loads; a float64 model runs in float64)."""

    def __init__(self, model, n_blocks, block_size=16, max_batch_tokens=256, max_seqs=64, prefix_caching=True,
                 preemption="recompute"):
        try:
            self.cfg, self.w = model.config, model.weights
        except AttributeError:
            raise TypeError(f"model must have .config and .weights (kvlesson.llama.load() gives one); got "
                            f"{type(model).__name__}") from None
        self.max_batch_tokens = validate.integer("max_batch_tokens", max_batch_tokens, minimum=1)
        # every running sequence may be decoding, and each decode takes one token of every step's budget
        self.max_seqs = min(validate.integer("max_seqs", max_seqs, minimum=1), self.max_batch_tokens)
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False; got prefix_caching={prefix_caching!r}")
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}; got preemption={preemption!r}")
        self.prefix_caching, self.preemption = prefix_caching, preemption
        self.pool = batch.model_pool(self.cfg, n_blocks, block_size, self.w["output.weight"].dtype)
        self.requests = {}  # rid -> Request, in submission order
        self.waiting, self.swapped, self.running = deque(), deque(), []  # running: in the order admitted
        self._steps, self._log, self._preempted = 0, [], []  # the log: one dict per step
        self._counts = dict.fromkeys(COUNTS, 0)

    # ---- the interface

    def submit(self, ids, max_new_tokens, stop_ids=()):
        """Queue a prompt -> its request id. It ends after max_new_tokens tokens, or at the first token in stop_ids
        (that token included). Refused with ValueError or TypeError, queueing nothing, when it could never run."""
        ids = validate.token_ids("ids", ids, self.cfg.vocab).tolist()
        n = validate.integer("max_new_tokens", max_new_tokens, minimum=1)
        stops = frozenset(validate.token_ids("stop_ids", list(stop_ids), self.cfg.vocab).tolist())
        if not ids:
            raise ValueError("ids is empty: need at least one prompt token to predict the next one")
        if len(ids) + n > self.cfg.max_len:
            raise ValueError(f"{len(ids)} prompt + {n} new tokens exceed the context of {self.cfg.max_len} positions")
        need = math.ceil((len(ids) + n - 1) / self.pool.block_size)  # its last token is never fed back
        if need > self.pool.n_blocks:
            raise ValueError(f"a prompt of {len(ids)} tokens with max_new_tokens={n} needs {need} blocks of "
                             f"{self.pool.block_size} even alone; the pool has n_blocks={self.pool.n_blocks}")
        rid = len(self.requests)
        self.requests[rid] = r = Request(rid, ids, n, stops, (self._steps, time.perf_counter()))
        self.waiting.append(r)
        return rid

    @property
    def done(self):
        return not (self.waiting or self.swapped or self.running)

    def step(self):
        """Schedule, then run one forward pass -> [(rid, token)] emitted in it, in submission order."""
        if self.done:
            return []
        start, before, self._preempted = time.perf_counter(), dict(self._counts), []
        plan = self._schedule()  # {request: tokens it brings}, decodes first
        seqs = list(plan)
        chunks = [r.ids[self.pool.length(r.seq) :][:n] for r, n in plan.items()]
        logits = iter(batch.run(self.cfg, self.w, self.pool, [r.seq for r in seqs], chunks))  # rows: n > 0, in order
        emitted, now = [], time.perf_counter()
        for r in seqs:
            row = next(logits)
            if self.pool.length(r.seq) == len(r.ids):  # its chunk reached the end: this row predicts its next token
                r.tokens.append(int(np.argmax(row)))
                r.first, r.last = r.first or (self._steps, now), now
                emitted.append((r.id, r.tokens[-1]))
        for r in list(self.running):
            if self.prefix_caching:
                self.pool.publish(r.seq, r.ids)  # full blocks, as soon as they are full: others may share them now
            if r.done:
                self.pool.free(r.seq)
                r.seq = None
                self.running.remove(r)
        self._steps += 1
        self._log.append(dict(tokens=sum(plan.values()), decodes=sum(n == 1 for n in plan.values()),
                              seqs=len(plan), decoded=[r.id for r, n in plan.items() if n == 1],
                              preempted=self._preempted, seconds=time.perf_counter() - start,
                              **{k: v - before[k] for k, v in self._counts.items()}))
        return sorted(emitted)

    def run(self):
        """Step until every request is done -> {rid: [new token ids]} for every request submitted."""
        while not self.done:
            self.step()
        return {rid: list(r.tokens) for rid, r in self.requests.items()}

    @property
    def stats(self):
        """Counts over all steps, per-step lists and per-request latencies (in steps and in seconds)."""
        per = {}
        for rid, r in self.requests.items():
            n, (s0, t0) = len(r.tokens), r.submitted
            per[rid] = dict(prompt=len(r.prompt), new=n, preemptions=r.preemptions, prefix_hit_tokens=r.hit_tokens,
                            ttft_steps=None if r.first is None else r.first[0] - s0 + 1,
                            ttft_s=None if r.first is None else r.first[1] - t0,
                            tpot_s=(r.last - r.first[1]) / (n - 1) if n > 1 else None)
        steps = {f"step_{k}": [entry[k] for entry in self._log] for k in ("tokens", "decodes", "seqs", "seconds")}
        return dict(steps=self._steps, **self._counts, **steps, requests=per)

    @property
    def log(self):
        """One dict per step: tokens, decodes, seqs, decoded and preempted (rids), seconds, and what each of the
        running totals (preemptions, prefix_hit_tokens, recomputed_tokens, swap_bytes) grew by in it."""
        return list(self._log)

    # ---- scheduling

    def _left(self, r):
        return len(r.ids) - self.pool.length(r.seq)

    def _schedule(self):
        """-> {request: tokens this step}: every decode first (preempting the newest when blocks run out), then prefill
        chunks from what the budget leaves, admitting new requests while the budget, max_seqs and the blocks allow."""
        while True:
            plan, spent = self._decodes()
            prefilling = [r for r in self.running if r not in plan]
            chunks = self._prefills(prefilling, len(plan), spent)
            plan.update((r, c) for r, c in chunks.items() if c > 0)
            if plan:
                return plan
            if not self.running:  # the queue's head fits an empty pool (submit checked): this cannot happen
                raise RuntimeError("the scheduler found nothing to run; please report this as a kvlesson bug")
            self._preempt(self.running[-1])  # all prefilling and out of blocks: make room, newest first

    def _decodes(self):
        """One token for every sequence that is decoding, oldest first -> ({request: 1}, blocks they take). A decode
        that needs a block when none is free preempts the most recently admitted sequence (perhaps itself)."""
        plan, spent = {}, 0
        for r in list(self.running):
            if r not in self.running or self._left(r) != 1:
                continue  # preempted just now, or still prefilling
            while r in self.running and self.pool.needed(r.seq, 1) > self.pool.blocks_free - spent:
                self._preempt(self.running[-1])
            if r in self.running:
                plan[r], spent = 1, spent + self.pool.needed(r.seq, 1)
        return plan, spent

    def _prefills(self, prefilling, decodes, spent):
        """Prefill chunks for the sequences still prefilling, then for new ones -> {request: chunk}."""
        room = self.max_batch_tokens - decodes
        promised = sum(self.pool.needed(r.seq, self._left(r)) for r in prefilling)  # the rest of their prompts
        wanted = sum(map(self._left, prefilling))
        queue = self.swapped if self.swapped else self.waiting
        while queue and wanted < room and len(self.running) < self.max_seqs:
            r = queue[0]
            if not self._admit(r, self.pool.blocks_free - spent - promised):
                break  # first come, first served: nobody jumps the head of the queue
            queue.popleft()
            prefilling.append(r)
            promised += self.pool.needed(r.seq, self._left(r))
            wanted += self._left(r)
            queue = self.swapped if self.swapped else self.waiting
        chunks = {}
        for r, c in zip(prefilling, split_budget(decodes, [self._left(r) for r in prefilling], self.max_batch_tokens),
                        strict=True):
            chunks[r] = self._fit(r, c, self.pool.blocks_free - spent)
            spent += self.pool.needed(r.seq, chunks[r])
        return chunks

    def _admit(self, r, available):
        """Start (or bring back) a request if what it must hold fits in `available` blocks -> whether it did."""
        bs = self.pool.block_size
        if r.swapped is not None:
            if math.ceil(len(r.ids) / bs) > available:
                return False
            self._count("swap_bytes", r.swapped.nbytes)
            r.seq, r.swapped = self.pool.swap_in(r.swapped), None
        else:
            limit = len(r.ids) - 1  # the last token is always run: its logits give the next token
            held, cost = self.pool.cached_cost(r.ids, limit) if self.prefix_caching else (0, math.ceil(len(r.ids) / bs))
            if cost > available:
                return False
            if self.prefix_caching:
                r.seq, held = self.pool.new_cached_sequence(r.ids, limit)
            else:
                r.seq = self.pool.new_sequence()
            r.hit_tokens += held
            self._count("prefix_hit_tokens", held)
            if r.preemptions:
                self._count("recomputed_tokens", max(r.held - held, 0))
        self.running.append(r)
        return True

    def _fit(self, r, want, available):
        """The largest chunk of at most `want` tokens whose blocks fit in `available` (pool.needed grows with T)."""
        lo, hi = 0, want
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.pool.needed(r.seq, mid) <= available else (lo, mid - 1)
        return lo

    def _preempt(self, r):
        """Evict a running request: free its blocks (recompute) or copy them out (swap). It goes to the front of its
        queue, ahead of everyone who arrived after it."""
        self.running.remove(r)
        r.preemptions, r.held = r.preemptions + 1, self.pool.length(r.seq)
        self._count("preemptions", 1)
        self._preempted.append(r.id)
        if self.preemption == "swap":
            r.swapped = self.pool.swap_out(r.seq)
            self._count("swap_bytes", r.swapped.nbytes)
            self.swapped.appendleft(r)
        else:
            self.pool.free(r.seq)  # its published blocks stay cached: its own recompute may find them
            self.waiting.appendleft(r)
        r.seq = None

    def _count(self, name, n):
        self._counts[name] += int(n)


# ---- measuring an engine on a trace


def poisson_arrivals(rate, n, seed=0):
    """float [n]: when n requests arrive, a Poisson process of `rate` requests per unit of time (exponential gaps,
    seeded), the first at 0. The unit is the replay's clock: steps or seconds."""
    rate = validate.positive("rate", rate)
    gaps = np.random.default_rng(seed).exponential(1 / rate, validate.integer("n", n, minimum=1))  # [n]
    return np.cumsum(gaps) - gaps[0]


def chat_trace(model, rate, n, new, seed=13, system=60, passages=(4, 8, 16, 32)):
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

    def summary(self):
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


def replay(engine, trace, clock="steps"):
    """Run a trace on an engine -> Replay. trace: [(arrival, prompt ids, max_new_tokens)], arrivals on `clock`:
    "steps" (a request arriving at t is submitted before forward pass ceil(t)) or "seconds" (submitted at the first
    step boundary after it arrives, the clock advanced by each step's wall-clock time). engine: an Engine, or lesson
    09's batch.Batcher, whose step is two forward passes when it admits: the new prompts, whole, then every decode."""
    if clock not in ("steps", "seconds"):
        raise ValueError(f"clock must be 'steps' or 'seconds'; got clock={clock!r}")
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
