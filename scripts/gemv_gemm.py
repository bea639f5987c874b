"""Why does batch 2 cost so much more than batch 1? The weight products and the decode step at 1, 2 and 16 rows,
under several OpenBLAS kernels, one BLAS thread each.

    python scripts/gemv_gemm.py                       # the default kernel, then Haswell, SkylakeX, Prescott
    python scripts/gemv_gemm.py --kernels Haswell --rounds 9

numpy hands a product with one row to BLAS's GEMV and one with more rows to GEMM, and OpenBLAS's kernels (chosen by
OPENBLAS_CORETYPE, read when numpy loads, so each runs in its own process) do each in their own way. For each kernel
this times, on SmolLM2-135M in float32:
  - products: the 210 weight matrices of the 30 layers, each multiplied by 1, 2 and 16 rows, back to back;
  - steps: one decode step of kvlesson.serving.batch for 1, 2 and 16 sequences on a paged pool (16 chat prompts
    prefilled once, forked for each round so every batch starts from the same contexts, one untimed step first).
Rounds interleave the sizes; the table gives each ratio's median over rounds and its min .. max. A round in which a
timing took more than 1.5x its median over all rounds is counted as stalled and left out of the spread and median.
Lesson 09 (section 5) quotes this table.
"""
# ruff: noqa: E402  (the thread count must reach OpenBLAS before numpy loads)
import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
import argparse
import json
import statistics
import subprocess
import sys
import time

SIZES = (1, 2, 16)
STALL = 1.5


def measure(rounds):
    """In this process: -> {"kernel": ..., "products": [[s per size] per round], "steps": [...]}."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from kvlesson import llama
    from kvlesson.serving.forward import decode_step, model_pool, prefill_step

    blas = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    model = llama.load()
    cfg, w, tok = model.config, model.weights, model.tokenizer
    mats = [w[f"blk.{i}.{name}.weight"] for i in range(cfg.n_layers)
            for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    rng = np.random.default_rng(0)
    rows = {n: rng.standard_normal((16, n)).astype(np.float32) for n in (cfg.D, cfg.hidden)}  # [16, D], [16, hidden]

    def products(B):
        start = time.perf_counter()
        for m in mats:
            rows[m.shape[0]][:B] @ m
        return time.perf_counter() - start

    pool = model_pool(cfg, n_blocks=128)
    prompts = [tok.encode(model.chat_prompt(f"Tell me fact number {i + 1} about the sea.")) for i in range(16)]
    seqs = [pool.new_sequence() for _ in prompts]
    firsts = prefill_step(cfg, w, pool, seqs, prompts).argmax(axis=-1).tolist()

    def step(B):
        forks = [pool.fork(s) for s in seqs[:B]]
        tokens = firsts[:B]
        tokens = decode_step(cfg, w, pool, forks, tokens).argmax(axis=-1).tolist()  # untimed
        start = time.perf_counter()
        decode_step(cfg, w, pool, forks, tokens)
        seconds = time.perf_counter() - start
        for s in forks:
            pool.free(s)
        return seconds

    products(2)  # warm-up: GEMM's buffers, the weights' first touch
    result = {"kernel": blas[0].get("architecture") if blas else "not OpenBLAS", "products": [], "steps": []}
    for _ in range(rounds):
        result["products"].append([products(B) for B in SIZES])
        result["steps"].append([step(B) for B in SIZES])
    return result


def ratios(times):
    """[[s per size] per round] -> (quiet rounds, {label: (median, min, max)}) of 2 vs 1, 16 vs 1 and 16 vs 2 rows."""
    medians = [statistics.median(r[j] for r in times) for j in range(len(SIZES))]
    quiet = [r for r in times if all(t <= STALL * m for t, m in zip(r, medians, strict=True))]
    out = {}
    for label, (a, b) in {"2 vs 1": (1, 0), "16 vs 1": (2, 0), "16 vs 2": (2, 1)}.items():
        rs = [r[a] / r[b] for r in quiet]
        out[label] = (statistics.median(rs), min(rs), max(rs)) if rs else (float("nan"),) * 3
    return len(quiet), out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", nargs="+", default=["default", "Haswell", "SkylakeX", "Prescott"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.rounds)))
        return 0
    print(f"one BLAS thread; {args.rounds} interleaved rounds per kernel; ratio: median (min .. max) over quiet rounds")
    print("| OPENBLAS_CORETYPE | kernel that ran | what | quiet rounds | 2 rows vs 1 | 16 rows vs 1 | 16 rows vs 2 |")
    print("|---|---|---|---|---|---|---|")
    for kernel in args.kernels:
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        if kernel != "default":
            env["OPENBLAS_CORETYPE"] = kernel
        run = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds)], env=env,
                             capture_output=True, text=True)
        if run.returncode:
            print(f"| {kernel} | failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]} | | | | | |")
            continue
        result = json.loads(run.stdout.strip().splitlines()[-1])
        for what in ("products", "steps"):
            n, r = ratios(result[what])
            cells = " | ".join(f"{m:.1f}x ({lo:.1f} .. {hi:.1f})" for m, lo, hi in r.values())
            print(f"| {kernel} | {result['kernel']} | {what} | {n} of {args.rounds} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
