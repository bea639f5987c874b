"""The scheduler of a serving engine: what runs in each step, on one paged pool, in one forward pass (lesson 13).

    eng = Engine(model, n_blocks=64)             # model: kvlesson.llama.load(), or anything with .config and .weights
    rid = eng.submit(ids, 32, stop_ids=(2,))     # between steps, at any time; greedy unless sampling= says
    eng.step()                                   # one forward pass -> [(rid, token), ...] emitted in it
    eng.abort(rid)                               # between steps: its blocks go back (or stay cached)
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

Each request brings its own sampling (kvlesson.sample: temperature, top-k, top-p, min-p, a seed, a repetition
penalty), and may bring a grammar (kvlesson.serving.grammar, lesson 16): the tokens it allows next mask the logits
before the draw, and when it allows exactly one continuation for several tokens (forced tokens), they are emitted at
once and go into the next step as one chunk, like a prefill (jump-forward), instead of one decode step each.

Every step is one call of kvlesson.serving.forward.run: decodes and prefill chunks side by side in one [N, D] matrix.
A step happens whole or not at all: cut short (Ctrl-C in a notebook, an error), it leaves the queues, every request
and the pool as they were, so that positions are never counted as written that no forward pass computed.
kvlesson.serving.trace measures an engine (this one, or lesson 09's Batcher) on a trace of requests.
"""
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvlesson import atomic, validate
from kvlesson.configs import ModelLike
from kvlesson.sample import GREEDY, Sampling, sample, seeded
from kvlesson.serving.forward import model_pool, run
from kvlesson.serving.grammar import Grammar
from kvlesson.serving.paged import blocks_for, request_blocks

__all__ = ["Engine", "split_budget"]

PREEMPTION = ("recompute", "swap")
COUNTS = ("preemptions", "prefix_hit_tokens", "recomputed_tokens", "swap_bytes", "forced_tokens", "aborts")  # totals


def split_budget(decodes: int, prefills: Sequence[int], budget: int) -> list[int]:
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
    sampling: Sampling = GREEDY  # with a seed, whenever it samples (sample.seeded)
    grammar: object = None  # a kvlesson.serving.grammar.Grammar, or None: what the output must match
    tokens: list = field(default_factory=list)  # generated so far: streamed as they come, never taken back
    queued: deque = field(default_factory=deque)  # forced tokens still to emit one a step (jump_forward=False)
    forced: int = 0  # tokens a grammar forced (emitted without a draw)
    aborted: bool = False
    seq: int | None = None  # its sequence in the pool, while it holds blocks there
    swapped: object = None  # its blocks, while swapped out (a paged.SwappedSequence)
    first: tuple | None = None  # (step, seconds) when its first token came out
    last: float | None = None  # seconds, when its last token came out
    hit_tokens: int = 0  # positions it found in the prefix cache, over all its admissions
    preemptions: int = 0
    held: int = 0  # positions it held when last preempted

    @property
    def ids(self) -> list[int]:
        """What its sequence must hold before its next token can come out: the prompt and every token so far."""
        return self.prompt + self.tokens

    @property
    def done(self) -> bool:
        return (self.aborted or len(self.tokens) == self.max_new_tokens
                or bool(self.tokens and self.tokens[-1] in self.stop_ids)
                or (self.grammar is not None and self.grammar.finished))


class Engine:
    """Continuous batching with a scheduler: admission on current need, chunked prefill mixed with decode under a
    token budget, preemption by recompute or swap, automatic prefix caching, stop ids, a sampler and a grammar per
    request, aborts. The pool's dtype is the model's (float32 as SmolLM2 loads; a float64 model runs in float64)."""

    def __init__(self, model: ModelLike, n_blocks: int, block_size: int = 16, max_batch_tokens: int = 256,
                 max_seqs: int | None = None, prefix_caching: bool = True, preemption: str = "recompute",
                 jump_forward: bool = True):
        """max_seqs: how many sequences may run at once; None is 64, or max_batch_tokens when that is smaller, since
        every running sequence may be decoding and each decode takes one token of every step's budget.
        jump_forward: tokens a grammar forces go into the next step as one chunk (True), or one a step (False: the
        same tokens, a step each, to compare against)."""
        try:
            self.cfg, self.w = model.config, model.weights
        except AttributeError:
            raise TypeError(f"model must have .config and .weights (kvlesson.llama.load() gives one); got "
                            f"{type(model).__name__}") from None
        self.max_batch_tokens = validate.integer("max_batch_tokens", max_batch_tokens, minimum=1)
        if max_seqs is None:
            max_seqs = min(64, self.max_batch_tokens)
        self.max_seqs = validate.integer("max_seqs", max_seqs, minimum=1)
        if self.max_seqs > self.max_batch_tokens:
            raise ValueError(f"max_seqs={max_seqs} sequences cannot all decode in a step of max_batch_tokens="
                             f"{max_batch_tokens} tokens; give max_seqs <= max_batch_tokens")
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False; got prefix_caching={prefix_caching!r}")
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}; got preemption={preemption!r}")
        if not isinstance(jump_forward, bool):
            raise TypeError(f"jump_forward must be True or False; got jump_forward={jump_forward!r}")
        self.prefix_caching, self.preemption, self.jump_forward = prefix_caching, preemption, jump_forward
        self.pool = model_pool(self.cfg, n_blocks, block_size, self.w["output.weight"].dtype)
        self.requests = {}  # rid -> Request, in submission order
        self.waiting, self.swapped, self.running = deque(), deque(), []  # running: in the order admitted
        self._steps, self._log, self._preempted = 0, [], []  # the log: one dict per step
        self._counts = dict.fromkeys(COUNTS, 0)

    # ---- the interface

    def submit(self, ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = (),
               sampling: Sampling = GREEDY, grammar: Grammar | None = None) -> int:
        """Queue a prompt -> its request id. It ends after max_new_tokens tokens, at the first token in stop_ids (that
        token included), or when its grammar is complete. sampling: how its tokens are drawn (kvlesson.sample; a
        seed is picked for it when it samples without one); grammar: a kvlesson.serving.grammar.Grammar, fresh, that
        its output must match. Refused with ValueError or TypeError, queueing nothing, when it could never run."""
        ids, n = self.check(ids, max_new_tokens)
        stops = frozenset(validate.token_ids("stop_ids", stop_ids, self.cfg.vocab).tolist())
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a kvlesson.sample.Sampling; got {type(sampling).__name__}")
        if grammar is not None and not (hasattr(grammar, "allowed") and getattr(grammar, "consumed", None) == 0):
            raise ValueError("grammar must be a fresh kvlesson.serving.grammar.Grammar (one per request, unused)")
        rid = len(self.requests)
        self.requests[rid] = r = Request(rid, ids, n, stops, (self._steps, time.perf_counter()), seeded(sampling),
                                         grammar)
        self.waiting.append(r)
        return rid

    def abort(self, rid: int) -> bool:
        """Stop request rid between steps -> True; its tokens so far stay in requests[rid].tokens. A running request's
        blocks are freed: those only it used go back to the pool (its full blocks stay in the prefix cache, unused),
        those it shares with others stay theirs; a waiting one leaves the queue, a swapped one drops its host copy.
        Aborting a request that has already ended (finished, or aborted before) changes nothing -> False: a client
        that goes away just as its answer ends is no error. A rid never submitted is a ValueError."""
        rid = validate.integer("rid", rid)
        if rid not in self.requests:
            raise ValueError(f"rid={rid} was never submitted to this engine (rids 0 to {len(self.requests) - 1})")
        r = self.requests[rid]
        if r.done:
            return False
        undo = atomic.snapshot(self, r)
        with self.pool.atomic(), atomic.undo_on_error(undo):
            if r in self.running:
                self.pool.free(r.seq)
                self.running.remove(r)
            else:
                (self.swapped if r.swapped is not None else self.waiting).remove(r)
            r.seq, r.swapped, r.aborted = None, None, True
            self._count("aborts", 1)
        return True

    def check(self, ids: list[int], max_new_tokens: int, name: str = "ids") -> tuple[list[int], int]:
        """-> (ids, n) as submit would queue them; ValueError or TypeError, naming the argument, for a request that
        could never run: too long for the context, or needing more blocks than the whole pool even alone."""
        ids, n = validate.request(ids, max_new_tokens, self.cfg.vocab, self.cfg.max_len, name=name, at_least=1)
        need = request_blocks(len(ids), n, self.pool.block_size)
        if need > self.pool.n_blocks:
            raise ValueError(f"{name}: a prompt of {len(ids)} tokens with max_new_tokens={n} needs {need} blocks of "
                             f"{self.pool.block_size} even alone; the pool has n_blocks={self.pool.n_blocks}")
        return ids, n

    @property
    def done(self) -> bool:
        return not (self.waiting or self.swapped or self.running)

    def step(self) -> list[tuple[int, int]]:
        """Schedule, then run one forward pass -> [(rid, token)] emitted in it, in submission order. All or nothing:
        cut short, it leaves the queues, every request and the pool as they were."""
        if self.done:
            return []
        undo = atomic.snapshot(self, *self.waiting, *self.swapped, *self.running)
        grammars = [r.grammar.checkpoint() for q in (self.waiting, self.swapped, self.running) for r in q
                    if r.grammar is not None]  # a waiting one may be admitted and draw in this very step
        with self.pool.atomic(), atomic.undo_on_error(undo, *grammars):
            return self._step()

    def _step(self):
        start, before, self._preempted = time.perf_counter(), dict(self._counts), []
        plan = self._schedule()  # {request: tokens it brings}, decodes first
        seqs = list(plan)
        chunks = [r.ids[self.pool.length(r.seq) :][:n] for r, n in plan.items()]
        logits = iter(run(self.cfg, self.w, self.pool, [r.seq for r in seqs], chunks))  # rows: n > 0, in order
        emitted, now = [], time.perf_counter()
        for r in seqs:
            row = next(logits)
            if self.pool.length(r.seq) == len(r.ids):  # its chunk reached the end: this row predicts its next token
                new = self._next_tokens(r, row)
                r.first, r.last = r.first or (self._steps, now), now
                emitted += [(r.id, t) for t in new]
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
        return sorted(emitted, key=lambda pair: pair[0])  # by rid; a rid's tokens in order

    def _next_tokens(self, r, row):
        """The tokens request r emits in this step, its logits `row` [V] in hand -> [ids]: a forced token waiting its
        turn (jump_forward off), or a draw by its sampling from what its grammar allows; after a draw, the tokens the
        grammar then forces, now (jump_forward) or queued to come out one a step."""
        if r.queued:
            new = [r.queued.popleft()]  # the row is not needed: this is the step jump-forward saves
            r.grammar.accept(new)
        else:
            allowed = None if r.grammar is None else r.grammar.allowed(self.cfg.vocab)
            new = [sample(row, r.sampling, position=len(r.tokens), history=r.ids, allowed=allowed)]
            if r.grammar is not None:
                r.grammar.accept(new)
                forced = r.grammar.forced()[: r.max_new_tokens - len(r.tokens) - 1]
                self._count("forced_tokens", len(forced))
                r.forced += len(forced)
                if self.jump_forward:
                    r.grammar.accept(forced)
                    new += forced
                else:
                    r.queued.extend(forced)
        r.tokens += new
        return new

    def run(self) -> dict[int, list[int]]:
        """Step until every request is done -> {rid: [new token ids]} for every request submitted."""
        while not self.done:
            self.step()
        return {rid: list(r.tokens) for rid, r in self.requests.items()}

    @property
    def stats(self) -> dict:
        """Counts over all steps, per-step lists and per-request latencies (in steps and in seconds)."""
        per = {}
        for rid, r in self.requests.items():
            n, (s0, t0) = len(r.tokens), r.submitted
            per[rid] = dict(prompt=len(r.prompt), new=n, preemptions=r.preemptions, prefix_hit_tokens=r.hit_tokens,
                            forced=r.forced, aborted=r.aborted, seed=r.sampling.seed,
                            ttft_steps=None if r.first is None else r.first[0] - s0 + 1,
                            ttft_s=None if r.first is None else r.first[1] - t0,
                            tpot_s=(r.last - r.first[1]) / (n - 1) if n > 1 else None)
        steps = {f"step_{k}": [entry[k] for entry in self._log] for k in ("tokens", "decodes", "seqs", "seconds")}
        return dict(steps=self._steps, **self._counts, **steps, requests=per)

    @property
    def log(self) -> list[dict]:
        """One dict per step: tokens, decodes, seqs, decoded and preempted (rids), seconds, and what each of the
        running totals (COUNTS: preemptions, prefix_hit_tokens, recomputed_tokens, swap_bytes, forced_tokens, aborts)
        grew by in it."""
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
            if blocks_for(len(r.ids), bs) > available:
                return False
            self._count("swap_bytes", r.swapped.nbytes)
            r.seq, r.swapped = self.pool.swap_in(r.swapped), None
        else:
            limit = len(r.ids) - 1  # the last token is always run: its logits give the next token
            held, cost = self.pool.cached_cost(r.ids, limit) if self.prefix_caching else (0, blocks_for(len(r.ids), bs))
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
