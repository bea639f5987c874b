"""Where decoding turns from bandwidth-bound to compute-bound: the roofline, measured on this machine.

A decode step at batch B multiplies a [B, D] matrix by every weight matrix. Each weight is read once and used in B
multiply-adds, 2 B FLOPs per weight, so the step does 2 B / (bytes per weight) FLOPs per byte it reads. A machine
that moves `bandwidth` bytes and does `flops` FLOPs per second keeps its arithmetic busy only above

    flops / bandwidth   FLOP per byte (the ridge point)

so weights stop being the bottleneck, and arithmetic starts to be, at B = ridge x bytes per weight / 2. The KV cache
is left out: every sequence reads its own, so it adds bytes that batching never shares (lesson 05).
"""
import statistics
import time

import numpy as np

from kvlesson import validate


def matvec_bandwidth(n=8192, repeats=5):
    """Bytes per second one float32 matrix-vector product streams, x [1, n] @ W [n, n] (the n*n*4-byte matrix
    dominates): the memory bandwidth a batch-1 decode step can hope for. Both memory orders of W are timed (BLAS
    streams one faster than the other) and the faster counts, so the floor it sets is the stricter one. Median over
    repeats."""
    n, repeats = validate.integer("n", n, minimum=1), validate.integer("repeats", repeats, minimum=1)
    W, x = np.ones((n, n), np.float32), np.ones((1, n), np.float32)
    return max(W.nbytes / _median_seconds(lambda M=M: x @ M, repeats) for M in (W, W.T))


def matmul_flops(n=1536, repeats=5):
    """FLOP/s of one large float32 matrix product, [n, n] @ [n, n] (2 n^3 FLOPs). Median over repeats."""
    n, repeats = validate.integer("n", n, minimum=1), validate.integer("repeats", repeats, minimum=1)
    A = np.ones((n, n), np.float32)
    return 2 * n**3 / _median_seconds(lambda: A @ A, repeats)


def ridge(flops, bandwidth):
    """FLOP per byte a machine must do on each byte it reads to keep its arithmetic busy."""
    return validate.positive("flops", flops) / validate.positive("bandwidth", bandwidth)


def crossover_batch(flops, bandwidth, bytes_per_weight):
    """The batch at which a decode step's weight traffic and its arithmetic take equal time: 2 B / bytes per weight
    FLOP per byte meets the ridge. Below it, adding sequences is almost free; above it, each costs its FLOPs."""
    return ridge(flops, bandwidth) * validate.positive("bytes_per_weight", bytes_per_weight) / 2


def _median_seconds(fn, repeats):
    fn()  # first touch: page faults and thread start-up are not the steady state
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
