"""Batch-1 decode, kvlesson against llama.cpp on the same bytes, measured side by side.

    /path/to/reference-venv/bin/python scripts/bench_llamacpp.py                 # 1 and 2 threads, 11 rounds each
    /path/to/reference-venv/bin/python scripts/bench_llamacpp.py --threads 2 --rounds 21

llama-cpp-python comes from requirements-llamacpp.txt (built from source; the file says how). llama.cpp's own quantizer
(llama_model_quantize with LLAMA_FTYPE_ALL_F32 and allow_requantize) turns SmolLM2's Q4_1 file into an all-float32
GGUF once, kept in the user cache: then llama.cpp streams the same 538 MB of float32 weights a kvlesson step does.
Four contenders take turns within every round, on the same 128-token prompt (the shipped text), the same number of
threads (numpy's OpenBLAS and llama.cpp's own pool), each timed over the same decode steps:
  - kvlesson plain (kvlesson.model.forward with the loaded weights, the pass the lessons teach)
  - kvlesson fused (Model.fused(): Q/K/V and gate/up in one product each)
  - llama.cpp on the float32 copy, and on the Q4_1 file itself (98 MB against 540: 5.5x fewer bytes)
  - the fused step's 121 matrix-vector products alone, back to back (bench.matvecs_only): what the fused step would
    take if everything else in it cost nothing, so the fused target is out of reach while this is slower than
    llama.cpp's whole step
and the bandwidth floor of the round: the float32 weight bytes over the bandwidth of one 8192 x 8192 float32
matrix-vector product. Each round reports each contender's median step; the table gives medians over rounds with the
min .. max of each ratio, and a round in which a contender took more than 1.5x its median is flagged as stalled and
left out of the spread. Each thread count runs in a process of its own (OpenBLAS reads its thread count at start).
"""
# ruff: noqa: E402  (the imports below must wait until the thread count is in the environment)
import os
import sys

if __name__ == "__main__" and "--child" in sys.argv:
    threads = sys.argv[sys.argv.index("--threads") + 1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads

import argparse
import ctypes
import datetime
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
from bench import decode_bytes, kvlesson_decode, matvec_bandwidth, matvecs_only, rounds_table, settle

from kvlesson import llama
from kvlesson.text import NAME as text_name
from kvlesson.text import long_text
from kvlesson.weights import fetch


def needs_llama_cpp():
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("scripts/bench_llamacpp.py needs llama-cpp-python: see requirements-llamacpp.txt for the build flags "
              "and how long the build takes", file=sys.stderr)
        sys.exit(2)


def f32_copy(q41, threads):
    """The all-float32 GGUF made from the Q4_1 file by llama.cpp's quantizer, once; -> its path."""
    from llama_cpp import llama_cpp as lc

    out = fetch.cache_dir() / "llama.cpp" / (q41.stem + ".F32.gguf")
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = threads
    partial = out.with_suffix(".partial")
    rc = lc.llama_model_quantize(str(q41).encode(), str(partial).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    os.replace(partial, out)
    return out


def load_llamacpp(path, threads, context):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 verbose=False)


def llamacpp_decode(llm, prompt, steps):
    """Median seconds of one llama.cpp decode step (llama_decode of one token, its logits copied out)."""
    llm.reset()
    llm.eval(prompt)
    times = []
    for _ in range(steps):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t = time.perf_counter()
        llm.eval([nxt])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def child(args):
    """One thread count, in this process: -> the rounds as JSON on stdout."""
    needs_llama_cpp()
    threads = int(args.threads)
    model = llama.load()
    fast = model.fused()
    q41, _ = fetch.model_file()
    f32 = f32_copy(q41, threads)
    prompt = model.tokenizer.encode(long_text())[: args.prompt]
    context = args.prompt + args.steps + 8
    engines = {"llama.cpp F32": load_llamacpp(f32, threads, context),
               "llama.cpp Q4_1": load_llamacpp(q41, threads, context)}
    nbytes = decode_bytes(model)
    rows = []
    for _ in range(args.rounds):
        settle()
        row = {"floor": nbytes / matvec_bandwidth(), "kvlesson plain": kvlesson_decode(model, prompt, args.steps)}
        settle()
        row["kvlesson fused"] = kvlesson_decode(fast, prompt, args.steps)
        row["fused products alone"] = matvecs_only(fast)
        for name, llm in engines.items():
            settle()
            row[name] = llamacpp_decode(llm, prompt, args.steps)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)  # progress
    print(json.dumps({"rows": rows, "bytes": nbytes, "f32_bytes": f32.stat().st_size, "q41_bytes": q41.stat().st_size}))


def table(threads, result, args):
    rows = result["rows"]
    names = ["kvlesson plain", "kvlesson fused", "fused products alone", "llama.cpp F32", "llama.cpp Q4_1", "floor"]
    med, stalled = rounds_table(rows, names)
    quiet = [r for i, r in enumerate(rows) if i not in stalled] or rows
    label = f"{threads} thread" + ("" if threads == 1 else "s")
    print(f"\n**{label}** ({len(rows)} interleaved rounds of {args.steps} decode steps after a {args.prompt}-token "
          f"prompt; {len(quiet)} quiet)" + (f"; stalled rounds left out: {', '.join(str(i + 1) for i in stalled)}"
                                            if stalled else ""))
    print("\n| contender | median step | vs kvlesson fused (min .. max) | of the floor |")
    print("|---|---|---|---|")
    for n in names:
        ratio = [r["kvlesson fused"] / r[n] for r in quiet]
        floor = [r["floor"] / r[n] for r in quiet]
        rel = "" if n == "kvlesson fused" else \
            f"{statistics.median(ratio):.2f}x ({min(ratio):.2f} .. {max(ratio):.2f})"
        print(f"| {n} | {med[n] * 1e3:.1f} ms | {rel} | "
              f"{'' if n == 'floor' else f'{statistics.median(floor):.0%} ({min(floor):.0%} .. {max(floor):.0%})'} |")
    print(f"\n(a ratio above 1 means that contender is faster than kvlesson fused; the floor is "
          f"{result['bytes'] / 1e6:.0f} MB of float32 weights over the round's 8192 x 8192 matvec bandwidth; the F32 "
          f"file holds {result['f32_bytes'] / 1e6:.0f} MB, the Q4_1 file {result['q41_bytes'] / 1e6:.0f} MB)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", nargs="+", default=["1", "2"])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.threads = args.threads[0]
        return child(args)
    needs_llama_cpp()
    import llama_cpp

    print(f"#### kvlesson against llama.cpp, {datetime.date.today()}, {os.cpu_count()} cores ({platform.machine()}), "
          f"numpy {np.__version__}, llama-cpp-python {llama_cpp.__version__}; SmolLM2-135M-Instruct, batch 1, "
          f"prompt from {text_name}")
    for threads in args.threads:
        run = subprocess.run([sys.executable, __file__, "--child", "--threads", threads, "--rounds", str(args.rounds),
                              "--steps", str(args.steps), "--prompt", str(args.prompt)],
                             stdout=subprocess.PIPE, text=True)
        if run.returncode:
            print(f"\n{threads} threads: the run failed (exit {run.returncode})")
            continue
        table(int(threads), json.loads(run.stdout.strip().splitlines()[-1]), args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
