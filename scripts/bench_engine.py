"""Four engines on SmolLM2 against the arrival rate, in seconds: `python scripts/bench_engine.py`

Lesson 13's measurement, longer than a lesson can afford. A seeded Poisson trace of chat requests over the shipped
text (kvlesson.serving.trace.chat_trace: one system prompt for all, a passage of the text each), arrivals in seconds,
replayed (trace.replay, clock="seconds": each step lasts what it took; when nothing runs, the clock jumps to the next
arrival) through:
  (a) lesson 09's Batcher: worst-case admission, whole prompts in a pass of their own;
  (b) Engine: admission on current need, whole prompts (a budget larger than any prompt), no prefix caching;
  (c) the same with a token budget (default 64): chunked prefill mixed with decode;
  (d) the same with automatic prefix caching.
Each round replays the same trace through the four engines, one after the other, at every rate; the table gives the
median over rounds and the min..max spread. A round in which an engine's busy time exceeds 1.5x its median over rounds
at that rate is flagged as stalled and left out. The four engines must give every request the same tokens (checked).
"""
import argparse
import datetime
import os
import platform
import statistics
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count()))  # before numpy loads OpenBLAS
import numpy as np  # noqa: E402

from kvlesson import llama  # noqa: E402
from kvlesson.serving import Engine, batch, trace  # noqa: E402

STALL = 1.5  # an engine's busy time this many times its median over rounds marks the round as stalled
ENGINES = ("(a) lesson 09", "(b) on need", "(c) + chunks", "(d) + cache")


def engines(model, n_blocks, budget, max_seqs):
    """The four engines of lesson 13, fresh: name -> a function that makes one."""
    return {ENGINES[0]: lambda: batch.Batcher(model.config, model.weights, n_blocks=n_blocks, block_size=16,
                                              max_batch=max_seqs, dtype=model.dtype),
            ENGINES[1]: lambda: Engine(model, n_blocks, 16, max_batch_tokens=4096, max_seqs=max_seqs,
                                       prefix_caching=False),
            ENGINES[2]: lambda: Engine(model, n_blocks, 16, max_batch_tokens=budget, max_seqs=max_seqs,
                                       prefix_caching=False),
            ENGINES[3]: lambda: Engine(model, n_blocks, 16, max_batch_tokens=budget, max_seqs=max_seqs,
                                       prefix_caching=True)}


def measure(model, requests, makers):
    """One round at one rate -> ({engine: summary}, {engine: busy seconds}, whether all gave the same tokens)."""
    out, busy, outputs = {}, {}, []
    for name, make in makers.items():
        r = trace.replay(make(), requests, clock="seconds")
        out[name], busy[name] = r.summary(), float(r.step_seconds.sum())
        outputs.append(r.outputs)
    return out, busy, all(o == outputs[0] for o in outputs)


def stalled(busy_rounds):
    """Indices of rounds in which some engine's busy time exceeds STALL x its median over rounds."""
    med = {k: statistics.median(r[k] for r in busy_rounds) for k in busy_rounds[0]}
    return {i for i, r in enumerate(busy_rounds) if any(r[k] > STALL * med[k] for k in r)}


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))} .. {fmt(max(values))})"


def table(rate, rounds):
    """Markdown rows for one rate: per engine, the median over rounds and the min..max of each figure."""
    rows = []
    for name in ENGINES:
        got = [r[name] for r in rounds]
        pre = [g["preemptions"] for g in got]
        rows.append(f"| {rate:g} | {name} | {spread([g['tokens_per_s'] for g in got], lambda x: f'{x:.1f}')} | "
                    + " | ".join(spread([g[key][i] for g in got], lambda x: f"{x:.2f}")
                                 for key in ("ttft_s", "tpot_s") for i in (0, 1))
                    + f" | {'-' if pre[0] is None else spread(pre, lambda x: f'{x:.0f}')} |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description="lesson 13's four engines on SmolLM2 against the arrival rate")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="requests per second")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32, help="new tokens per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-blocks", type=int, default=48)
    ap.add_argument("--budget", type=int, default=64, help="max_batch_tokens of engines (c) and (d)")
    ap.add_argument("--max-seqs", type=int, default=16)
    args = ap.parse_args(argv)

    model = llama.load()
    print(f"### kvlesson scheduler benchmark, {datetime.date.today()}, {os.cpu_count()} cores ({platform.machine()}), "
          f"Python {sys.version.split()[0]}, numpy {np.__version__}, OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}; load average at start {os.getloadavg()[0]:.2f}")
    makers = engines(model, args.n_blocks, args.budget, args.max_seqs)
    traces = {rate: trace.chat_trace(model, rate, args.requests, args.new) for rate in args.rates}
    lengths = [len(p) for _, p, _ in traces[args.rates[0]]]
    print(f"{args.requests} chat requests of {min(lengths)} to {max(lengths)} prompt tokens, {args.new} new tokens "
          f"each; a pool of {args.n_blocks} blocks of 16, at most {args.max_seqs} sequences, budget {args.budget}; "
          f"{args.rounds} rounds\n", flush=True)
    results = {rate: [] for rate in args.rates}
    for n in range(args.rounds):
        for rate in args.rates:
            out, busy, same = measure(model, traces[rate], makers)
            if not same:
                raise SystemExit(f"the engines gave different tokens at rate {rate} (round {n + 1})")
            results[rate].append((out, busy))
        print(f"round {n + 1} of {args.rounds} done; load average {os.getloadavg()[0]:.2f}", flush=True)
    print("\nAll four engines gave every request the same tokens in every round.\n")
    print("| rate (requests/s) | engine | tokens/s | TTFT p50 (s) | TTFT p90 (s) | TPOT p50 (s) | TPOT p90 (s) | "
          "preemptions |")
    print("|---|---|---|---|---|---|---|---|")
    for rate, got in results.items():
        bad = stalled([busy for _, busy in got]) if len(got) > 2 else set()
        if bad:
            print(f"(rate {rate:g}: round{'s' if len(bad) > 1 else ''} {', '.join(str(i + 1) for i in sorted(bad))} "
                  f"of {len(got)} flagged as stalled and left out)")
        kept = [out for i, (out, _) in enumerate(got) if i not in bad] or [out for out, _ in got]
        print("\n".join(table(rate, kept)))
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
