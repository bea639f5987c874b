"""How fast does kvlesson decode SmolLM2-135M, and against what?

    python scripts/bench.py [--rounds 11] [--threads 2]          # numpy only
    /path/to/reference-venv/bin/python scripts/bench.py            # adds transformers (requirements-reference.txt)

Everything is measured side by side in one run, batch 1, float32, on the same 128-token prompt:
  - kvlesson's decode step (one token onto its KV cache), plain (kvlesson.model.forward, the pass the lessons
    teach) and fused (Model.fused(), kvlesson.weights.layout.fuse: Q/K/V and gate/up in one product each);
  - Hugging Face transformers decoding with its own KV cache (PyTorch, CPU), when it is installed;
  - the memory-bandwidth floor: a decode step must stream every weight once, so it takes at least
    weight bytes / bandwidth, with the bandwidth measured on a large float32 matrix-vector product in the
    same round;
  - cached against uncached generation at a few context lengths, against the FLOP ratio of lesson 02.
Both libraries get the same number of threads (--threads, default: every core), and the table says how many.
A shared machine makes single timings noisy, so the contenders take turns within each round, each round
reports the median of its steps, and the table gives the median over rounds with the min .. max spread.
A round in which any contender took more than STALL times its own median is flagged as stalled and left out
of the spread (it is listed, never quoted as the result).
"""
# ruff: noqa: E402  (the imports below must wait until the thread count is in the environment)
import os
import sys


def _threads_from_argv(argv):
    """--threads must reach OpenBLAS before numpy loads, so it is read here, ahead of argparse."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return str(os.cpu_count())


if __name__ == "__main__":
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = _threads_from_argv(sys.argv[1:])

import argparse
import datetime
import platform
import statistics
import time

import hf_reference
import numpy as np

from kvlesson import llama
from kvlesson.costs import flops
from kvlesson.costs.roofline import matvec_bandwidth
from kvlesson.text import NAME as text_name
from kvlesson.text import long_text


def layout_check(model, repeats=5):
    """[(matrix, shape, order the loader chose, its time, the other order's time)], over all layers.

    Backs the memory orders in kvlesson.weights.layout.matmul_weights with a measurement on this machine.
    """
    w, rows = model.weights, []
    groups = {n: [w[f"blk.{i}.{n}.weight"] for i in range(model.config.n_layers)]
              for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    groups["output"] = [w["output.weight"]]
    for name, mats in groups.items():
        other = [np.ascontiguousarray(M) if not M.flags.c_contiguous else np.asfortranarray(M) for M in mats]
        x = np.ones((1, mats[0].shape[0]), np.float32)
        times = {0: [], 1: []}
        for _ in range(repeats):
            for k, group in enumerate((mats, other)):
                t = time.perf_counter()
                for M in group:
                    x @ M
                times[k].append((time.perf_counter() - t) / len(group))
        chosen = "rows of [in, out]" if mats[0].flags.c_contiguous else "rows of [out, in]"
        rows.append((name, mats[0].shape, chosen, statistics.median(times[0]), statistics.median(times[1])))
    return rows


def settle(seconds=0.3):
    """Let the other library's worker threads stop spinning (OpenBLAS and OpenMP both busy-wait after a call),
    so that on 2 cores each contender starts with the machine to itself."""
    time.sleep(seconds)


def decode_bytes(model):
    """Weight bytes one decode step reads: every matrix and norm once. The token table is read whole as the
    (tied) output layer; its lookup at the bottom reads one row, so token_embd.weight is not counted again."""
    return sum(a.nbytes for name, a in model.weights.items() if name != "token_embd.weight")


def matvecs_only(model, repeats=5):
    """Median seconds of one decode step's matrix-vector products alone, back to back: every weight matrix
    once, in the model's memory order, with nothing else in between. The most any numpy code calling
    BLAS once per matrix could hope for."""
    mats = [a for name, a in model.weights.items() if a.ndim == 2 and name != "token_embd.weight"]
    xs = {n: np.ones((1, n), np.float32) for n in {M.shape[0] for M in mats}}
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for M in mats:
            xs[M.shape[0]] @ M
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def kvlesson_decode(model, prompt, steps):
    """Median seconds of one decode step after the prompt, on a StaticKVCache."""
    cache = model.new_cache(capacity=len(prompt) + steps)
    logits = model.forward(prompt, cache)
    times = []
    for _ in range(steps):
        nxt = int(logits[-1].argmax())
        t = time.perf_counter()
        logits = model.forward([nxt], cache)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def transformers_decode(hf, prompt, steps):
    """Median seconds of one decode step with transformers' own KV cache (DynamicCache), no generate() overhead."""
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache()
        logits = hf(torch.tensor([prompt]), cache=cache, use_cache=True).logits
        times = []
        for _ in range(steps):
            nxt = logits[0, -1].argmax().reshape(1, 1)
            t = time.perf_counter()
            logits = hf(nxt, cache=cache, use_cache=True).logits
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def cached_vs_uncached(model, ids, context, repeats=3):
    """(seconds of one cached step at position `context`, seconds of recomputing all context + 1 tokens)."""
    cache = model.new_cache(capacity=context + repeats)
    model.forward(ids[:context], cache)
    cached = []
    for i in range(repeats):
        t = time.perf_counter()
        model.forward(ids[context + i : context + i + 1], cache)
        cached.append(time.perf_counter() - t)
    t = time.perf_counter()
    model.forward(ids[: context + 1])
    return statistics.median(cached), time.perf_counter() - t


STALL = 1.5  # a round slower than this times the contender's median is flagged


def rounds_table(rows, names):
    """rows: per round {name: seconds}. -> (median per name, rounds flagged as stalled)."""
    med = {n: statistics.median(r[n] for r in rows) for n in names}
    stalled = [i for i, r in enumerate(rows) if any(r[n] > STALL * med[n] for n in names)]
    return med, stalled


def spread(values):
    return f"{min(values):.2f} .. {max(values):.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description="kvlesson decode speed, side by side")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before decoding")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numpy's BLAS and for torch")
    ap.add_argument("--contexts", type=int, nargs="*", default=[32, 128, 512], help="for cached vs uncached")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers column")
    args = ap.parse_args(argv)

    model = llama.load()
    fast = model.fused()
    ids = model.tokenizer.encode(long_text())
    prompt = ids[: args.prompt]
    ref = None if args.no_transformers else hf_reference.load(threads=args.threads)
    nbytes = decode_bytes(model)
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "(numpy's default)")

    names = ["plain", "fused", "floor", "bare"] + (["transformers"] if ref else [])
    rows = []
    for r in range(args.rounds):
        settle()
        bw = matvec_bandwidth()
        row = {"floor": nbytes / bw, "bare": matvecs_only(model),
               "plain": kvlesson_decode(model, prompt, args.steps), "fused": kvlesson_decode(fast, prompt, args.steps)}
        if ref:
            settle()
            row["transformers"] = transformers_decode(ref[0], prompt, args.steps)
        rows.append(row)
        print(f"round {r + 1:2d}: " + ", ".join(f"{n} {row[n] * 1e3:.1f} ms" for n in names), flush=True)

    med, stalled = rounds_table(rows, names)
    quiet = [row for i, row in enumerate(rows) if i not in stalled] or rows
    of_floor = {n: [row["floor"] / row[n] for row in quiet] for n in ("plain", "fused", "bare")}
    print(f"\n#### kvlesson decode benchmark, {datetime.date.today()}, {os.cpu_count()} cores "
          f"({platform.machine()}), numpy {np.__version__}" + (f", {ref[2]}" if ref else ""))
    threads = f"{args.threads} thread" + ("" if str(args.threads) == "1" else "s")
    print(f"\nSmolLM2-135M-Instruct, float32, batch 1, {args.prompt}-token prompt ({text_name}), {args.rounds} "
          f"interleaved rounds of {args.steps} decode steps; {threads} for each library (OpenBLAS "
          f"{blas}); medians over rounds, spread over the {len(quiet)} rounds that did not stall.\n")
    if stalled:
        print(f"Stalled rounds, left out of the spread: {', '.join(str(i + 1) for i in stalled)} "
              f"(a contender took more than {STALL}x its median).\n")
    print("| measure | median | ratio (min .. max over rounds) |")
    print("|---|---|---|")
    print(f"| bandwidth floor: {nbytes / 1e6:.0f} MB of weights / measured GB/s (8192 x 8192 matvec) | "
          f"{med['floor'] * 1e3:.1f} ms | |")
    for n, label in (("plain", "kvlesson decode step, plain (the lessons' forward pass)"),
                     ("fused", "kvlesson decode step, fused Q/K/V and gate/up"),
                     ("bare", f"the plain step's {sum(a.ndim == 2 for a in model.weights.values()) - 1} "
                              "matrix-vector products alone, back to back")):
        f = of_floor[n]
        print(f"| {label} | {med[n] * 1e3:.1f} ms | {statistics.median(f):.0%} of the floor "
              f"({min(f):.0%} .. {max(f):.0%}) |")
    if ref:
        for n in ("plain", "fused"):
            ratio = [row["transformers"] / row[n] for row in quiet]
            print(f"| transformers decode step (own KV cache) vs kvlesson {n} | {med['transformers'] * 1e3:.1f} ms | "
                  f"kvlesson {statistics.median(ratio):.2f}x faster ({spread(ratio)}) |")

    print("\n| context P | cached step | uncached step (P + 1 tokens) | measured speed-up | FLOP ratio, lesson 02 |")
    print("|---|---|---|---|---|")
    for P in args.contexts:
        if P + 4 > len(ids):
            continue
        c, u = cached_vs_uncached(model, ids, P)
        print(f"| {P} | {c * 1e3:.1f} ms | {u * 1e3:.0f} ms | {u / c:.1f}x | {flops.flop_ratio(P, 1):.0f}x |")
    print("\nThe FLOP ratio counts 2N per token (kvlesson.costs.flops; adding the attention scores, which a re-run "
          "computes in full,\nleaves it at P + 1). The uncached step runs its P + 1 tokens as one matrix-matrix "
          "pass, at far more FLOP/s than the\nbandwidth-bound matrix-vector step, so the measured speed-up stays "
          "below the FLOP ratio.")

    print("\n| matrix (x 30 layers) | shape [in, out] | order the loader keeps | its matvec | other order |")
    print("|---|---|---|---|---|")
    for name, shape, chosen, t_ours, t_other in layout_check(model):
        print(f"| {name} | {shape[0]} x {shape[1]} | {chosen} | {t_ours * 1e6:.0f} us | {t_other * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
