"""Lesson 14's clock, fairly: speculative decoding with prompt lookup against plain greedy decoding on SmolLM2.

    python scripts/bench_speculative.py [--rounds 9] [--threads 2] [--new 40] [--ks 3 7]

Every contender writes the same greedy tokens (checked each round) for the same two prompts lesson 14 uses (the
shipped story's first 96 tokens, and the chat prompt that asks for type hints), prefill included:
  - the baseline: speculative.generate with k = 0, which drafts nothing and so is plain greedy decoding, one decode
    step per token, on caches of exactly the size of the request (len(prompt) + new positions), as the speculative
    runs have;
  - prompt lookup at each k of --ks, on the same cache sizes;
  - model.generate, for the record: it sizes its caches to the request too (it once allocated config.max_len,
    8,192 positions per layer, whose first touch made it slow for reasons that have nothing to do with speculation).
    It is timed, never the baseline.
One warm-up run of each, then --rounds rounds; within a round the contenders take turns in an order that rotates
from round to round. The table gives each contender's median seconds and its speed-up against the baseline of the
same round: the median and the min .. max over rounds. A round in which any contender took more than STALL times its
own median is flagged as stalled and left out of the speed-up's median and spread (it is listed, never quoted).
Last, the chat prompt's prefill onto caches of the model's whole context and onto caches sized to the request, taking
turns: the cost a baseline with oversized caches pays (run it once more with NUMPY_MADVISE_HUGEPAGE=0 to compare).
"""
# ruff: noqa: E402  (the imports below must wait until the thread count is in the environment)
import os
import sys

from bench import _threads_from_argv

if __name__ == "__main__":
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = _threads_from_argv(sys.argv[1:])

import argparse
import datetime
import platform
import statistics
import time

import numpy as np
from bench import STALL, rounds_table

from kvlesson import llama, speculative
from kvlesson.text import long_text

BASELINE = "k = 0 (plain decoding)"


def prompts(model):
    """Lesson 14's two prompts -> {name: ids}: the story's opening and the chat prompt."""
    tok = model.tokenizer
    return {"story": tok.encode(long_text())[:96],
            "chat": tok.encode(model.chat_prompt("Add type hints to this Python function:\n"
                                                 "def area(width, height):\n    return width * height"))}


def contenders(model, ids, n, ks):
    """name -> a function that writes n greedy tokens after ids -> the tokens."""
    runs = {BASELINE: lambda: speculative.generate(model, ids, n, draft="ngram", k=0)[0]}
    for k in ks:
        runs[f"prompt lookup, k = {k}"] = lambda k=k: speculative.generate(model, ids, n, draft="ngram", k=k)[0]
    runs["model.generate"] = lambda: model.generate(ids, n)
    return runs


def one_round(runs, shift):
    """Each contender once, in an order rotated by `shift` -> ({name: seconds}, whether all wrote the same tokens)."""
    names = list(runs)
    names = names[shift % len(names):] + names[: shift % len(names)]
    seconds, tokens = {}, []
    for name in names:
        t = time.perf_counter()
        tokens.append(runs[name]())
        seconds[name] = time.perf_counter() - t
    return seconds, all(x == tokens[0] for x in tokens)


def measure(runs, rounds):
    """One warm-up run of each, then `rounds` interleaved rounds -> per round {name: seconds}."""
    _, same = one_round(runs, 0)
    assert same, "the contenders wrote different tokens"
    rows = []
    for r in range(rounds):
        row, same = one_round(runs, r)
        assert same, f"round {r + 1}: the contenders wrote different tokens"
        rows.append(row)
        print(f"  round {r + 1:2d}: " + ", ".join(f"{n} {s * 1e3:.0f} ms" for n, s in row.items()), flush=True)
    return rows


def table(name, rows):
    """The markdown rows for one prompt: each contender's median seconds and its speed-up against the baseline."""
    names = list(rows[0])
    med, stalled = rounds_table(rows, names)
    quiet = [row for i, row in enumerate(rows) if i not in stalled]
    note = f"; stalled rounds left out: {', '.join(str(i + 1) for i in stalled)}" if stalled else ""
    print(f"\n{name}: {len(rows)} rounds, {len(quiet)} quiet{note}\n")
    print("| contender | median ms | speed-up against k = 0: median (min .. max over quiet rounds) |")
    print("|---|---|---|")
    for n in names:
        ratios = [row[BASELINE] / row[n] for row in quiet] or [float("nan")]  # every round stalled
        cell = "" if n == BASELINE else f"{statistics.median(ratios):.2f}x ({min(ratios):.2f} .. {max(ratios):.2f})"
        print(f"| {n} | {med[n] * 1e3:.0f} | {cell} |")
    return stalled


def prefill_by_cache_size(model, ids, new, rounds):
    """The prefill of ids onto caches of config.max_len positions and onto caches sized to the request (len(ids) +
    new), taking turns -> per round {capacity: seconds}. Run it with NUMPY_MADVISE_HUGEPAGE=0 to see how much of the
    gap is the transparent huge pages numpy asks for on arrays of 4 MB or more."""
    sizes, rows = (model.config.max_len, len(ids) + new), []
    for r in range(rounds):
        row = {}
        for capacity in sizes if r % 2 == 0 else sizes[::-1]:
            t = time.perf_counter()
            model.forward(ids, model.new_cache(capacity=capacity))
            row[capacity] = time.perf_counter() - t
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description="lesson 14's clock: prompt lookup against plain decoding, fairly")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
    ap.add_argument("--new", type=int, default=40, help="new tokens per run (lesson 14: 40)")
    ap.add_argument("--ks", type=int, nargs="*", default=[3, 7], help="drafts per round for prompt lookup")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numpy's BLAS")
    args = ap.parse_args(argv)

    model = llama.load()
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "(numpy's default)")
    print(f"#### lesson 14's clock, {datetime.date.today()}, {os.cpu_count()} cores ({platform.machine()}), numpy "
          f"{np.__version__}, OpenBLAS threads {blas}; SmolLM2-135M float32, greedy, {args.new} new tokens, prefill "
          f"included; one warm-up run each, then {args.rounds} interleaved rounds (order rotating)")
    any_stall = False
    for name, ids in prompts(model).items():
        print(f"\n{name} ({len(ids)} prompt tokens):", flush=True)
        any_stall |= bool(table(name, measure(contenders(model, ids, args.new, args.ks), args.rounds)))
    ids = prompts(model)["chat"]
    rows = prefill_by_cache_size(model, ids, args.new, args.rounds)
    big, small = model.config.max_len, len(ids) + args.new
    ratios = [row[big] / row[small] for row in rows]
    print(f"\nthe chat prompt's prefill ({len(ids)} tokens), NUMPY_MADVISE_HUGEPAGE="
          f"{os.environ.get('NUMPY_MADVISE_HUGEPAGE', '(unset)')}: onto {big:,}-position caches "
          f"{statistics.median(row[big] for row in rows) * 1e3:.0f} ms, onto {small}-position caches "
          f"{statistics.median(row[small] for row in rows) * 1e3:.0f} ms; ratio {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f} .. {max(ratios):.2f}) over {len(rows)} rounds")
    if any_stall:
        print(f"\nA stalled round (a contender slower than {STALL}x its median) means the machine was busy: re-run "
              "on a quiet one before quoting.")


if __name__ == "__main__":
    main()
