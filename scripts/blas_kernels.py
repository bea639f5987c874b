"""Does a perplexity depend on the CPU? The same measurement under several OpenBLAS kernels, in float32 and float64.

    python scripts/blas_kernels.py                       # Haswell, SkylakeX, Prescott, SandyBridge
    python scripts/blas_kernels.py --kernels Haswell Zen

OpenBLAS picks a kernel for the CPU it finds; OPENBLAS_CORETYPE makes it take another one, whose matrix products add
their terms in another order. Each kernel runs in its own process (the variable is read when numpy loads), and
threadpoolctl reports the kernel that really ran: a CPU that lacks a kernel's instructions may refuse it. The
measurement is lesson 11's first version: SmolLM2 over the first 256 predictions of the shipped text, with KV caches
in int8, and int4 with per-token or per-channel key scales. In float32 the int4 rows move from kernel to kernel;
with the model in float64 they do not, which is why lesson 11 measures in float64.
"""
import argparse
import json
import os
import subprocess
import sys

ROWS = {"int8": dict(bits=8), "int4, per-token keys": dict(bits=4),
        "int4, per-channel keys": dict(bits=4, key_scales="channel")}


def measure():
    """In this process: -> {"kernel": ..., dtype name: {row: perplexity}}."""
    import math

    import numpy as np
    from threadpoolctl import threadpool_info

    from kvlesson import QuantizedKVCache, llama
    from kvlesson.costs.perplexity import token_nll
    from kvlesson.text import long_text

    blas = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    model = llama.load()
    cfg, ids = model.config, model.tokenizer.encode(long_text())[:257]
    result = {"kernel": blas[0].get("architecture") if blas else "not OpenBLAS"}
    for dtype in (np.float32, np.float64):
        m = model if dtype == np.float32 else model.astype(dtype)
        result[np.dtype(dtype).name] = {
            name: math.exp(token_nll(m, ids, [QuantizedKVCache(cfg.Hkv, cfg.d, dtype=dtype, scale_dtype=np.float32,
                                                               **kw) for _ in range(cfg.n_layers)]).mean())
            for name, kw in ROWS.items()}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", nargs="+", default=["Haswell", "SkylakeX", "Prescott", "SandyBridge"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure()))
        return 0
    print(f"| OPENBLAS_CORETYPE | kernel that ran | dtype | {' | '.join(ROWS)} |")
    print("|---|---|---|" + "---|" * len(ROWS))
    for kernel in args.kernels:
        env = dict(os.environ, OPENBLAS_CORETYPE=kernel)
        run = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if run.returncode:
            print(f"| {kernel} | failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]} | | |")
            continue
        result = json.loads(run.stdout.strip().splitlines()[-1])
        for dtype in ("float32", "float64"):
            cells = " | ".join(f"{result[dtype][name]:.2f}" for name in ROWS)
            print(f"| {kernel} | {result['kernel']} | {dtype} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
