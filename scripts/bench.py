"""How fast does kvlesson decode SmolLM2-135M, and against what? `python scripts/bench.py`

Everything is measured side by side in one run, batch 1, float32, on the same 128-token prompt:
  - kvlesson's decode step (one token onto its KV cache) against Hugging Face transformers decoding
    with its own KV cache (PyTorch, CPU), when those are installed (requirements-reference.txt);
  - against the memory-bandwidth floor: a decode step must stream every weight once, so it can take
    no less than weight bytes / bandwidth, with the bandwidth measured on a large float32
    matrix-vector product in the same run;
  - cached against uncached generation at a few context lengths, against the FLOP ratio of lesson 02
    (kvlesson.flops).
A shared machine makes absolute times noisy, so the rounds interleave the contenders and the table
reports medians over rounds of per-round ratios.
"""
import argparse
import datetime
import os
import platform
import statistics
import time

import hf_reference
import numpy as np

from kvlesson import flops, llama
from kvlesson.text import NAME as text_name
from kvlesson.text import long_text


def matvec_bandwidth(n=8192, repeats=5):
    """Bytes per second a large float32 matrix-vector product streams (the n*n*4-byte matrix dominates).

    Both memory orders are timed and the faster one counts, so the floor it sets is the stricter one.
    """
    W = np.ones((n, n), np.float32)
    x = np.ones((1, n), np.float32)
    best = 0.0
    for M in (W, W.T):  # rows of [in, out], then rows of [out, in]
        x @ M  # first touch
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            x @ M
            times.append(time.perf_counter() - t)
        best = max(best, W.nbytes / statistics.median(times))
    return best


def layout_check(model, repeats=5):
    """[(matrix, shape, order the loader chose, its time, the other order's time)], over all layers.

    Backs the memory orders in kvlesson.layout.matmul_weights with a measurement on this machine.
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


def main(argv=None):
    ap = argparse.ArgumentParser(description="kvlesson decode speed, side by side")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before decoding")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--contexts", type=int, nargs="*", default=[32, 128, 512], help="for cached vs uncached")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers column")
    args = ap.parse_args(argv)

    model = llama.load()
    name = text_name
    ids = model.tokenizer.encode(long_text())
    prompt = ids[: args.prompt]
    ref = None if args.no_transformers else hf_reference.load()
    nbytes = decode_bytes(model)

    rows = []  # per round: kvlesson s, floor s, transformers s, bandwidth, bare matvecs s
    for r in range(args.rounds):
        settle()
        bw = matvec_bandwidth()
        bare = matvecs_only(model)
        ours = kvlesson_decode(model, prompt, args.steps)
        settle()
        theirs = transformers_decode(ref[0], prompt, args.steps) if ref else float("nan")
        rows.append((ours, nbytes / bw, theirs, bw, bare))
        print(f"round {r + 1}: kvlesson {ours * 1e3:.1f} ms/token, floor {nbytes / bw * 1e3:.1f} ms "
              f"({bw / 1e9:.1f} GB/s), bare matvecs {bare * 1e3:.1f} ms, transformers {theirs * 1e3:.1f} ms/token",
              flush=True)

    speedup = [r[2] / r[0] for r in rows]
    of_floor = [r[1] / r[0] for r in rows]
    bare_of_floor = [r[1] / r[4] for r in rows]
    med = statistics.median
    print(f"\n### kvlesson decode benchmark, {datetime.date.today()}, {os.cpu_count()} cores "
          f"({platform.machine()}), numpy {np.__version__}" + (f", {ref[2]}" if ref else ""))
    print(f"\nSmolLM2-135M-Instruct, float32, batch 1, {args.prompt}-token prompt ({name}), "
          f"{args.rounds} interleaved rounds of {args.steps} decode steps; medians over rounds.\n")
    print("| measure | this run | ratio (min .. max over rounds) |")
    print("|---|---|---|")
    print(f"| kvlesson decode step | {med(r[0] for r in rows) * 1e3:.1f} ms | |")
    if ref:
        print(f"| transformers decode step (own KV cache) | {med(r[2] for r in rows) * 1e3:.1f} ms | kvlesson "
              f"{med(speedup):.2f}x faster ({min(speedup):.2f} .. {max(speedup):.2f}) |")
    print(f"| bandwidth floor: {nbytes / 1e6:.0f} MB of weights / {med(r[3] for r in rows) / 1e9:.1f} GB/s "
          f"(8192 x 8192 matvec) | {med(r[1] for r in rows) * 1e3:.1f} ms | kvlesson at {med(of_floor):.0%} of the "
          f"floor ({min(of_floor):.0%} .. {max(of_floor):.0%}) |")
    print(f"| the step's {sum(a.ndim == 2 for a in model.weights.values()) - 1} matrix-vector products alone, back to "
          f"back | {med(r[4] for r in rows) * 1e3:.1f} ms | at {med(bare_of_floor):.0%} of the floor "
          f"({min(bare_of_floor):.0%} .. {max(bare_of_floor):.0%}) |")

    print("\n| context P | cached step | uncached step (P + 1 tokens) | measured speed-up | FLOP ratio, lesson 02 |")
    print("|---|---|---|---|---|")
    for P in args.contexts:
        if P + 4 > len(ids):
            continue
        c, u = cached_vs_uncached(model, ids, P)
        print(f"| {P} | {c * 1e3:.1f} ms | {u * 1e3:.0f} ms | {u / c:.1f}x | {flops.flop_ratio(P, 1):.0f}x |")
    print("\nThe FLOP ratio counts 2N per token (kvlesson.flops; adding the attention scores, which a re-run "
          "computes in full,\nleaves it at P + 1). The uncached step runs its P + 1 tokens as one matrix-matrix "
          "pass, at far more FLOP/s than the\nbandwidth-bound matrix-vector step, so the measured speed-up stays "
          "below the FLOP ratio.")

    print("\n| matrix (x 30 layers) | shape [in, out] | order the loader keeps | its matvec | other order |")
    print("|---|---|---|---|---|")
    for name, shape, chosen, t_ours, t_other in layout_check(model):
        print(f"| {name} | {shape[0]} x {shape[1]} | {chosen} | {t_ours * 1e6:.0f} us | {t_other * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
