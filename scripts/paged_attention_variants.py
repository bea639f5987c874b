"""Can numpy read 64 sequences' pages fast enough? `python scripts/paged_attention_variants.py`

Issue 19 asks batched decode for at least 10x batch 1 at 64 sequences, within 90% of the ceiling (B tokens through
one sequence's forward, where attention costs almost nothing). The gap between the two is the decode step's attention
over every sequence's pages, so this script times that attention alone, on the inputs of a real step: SmolLM2, the
64 chat prompts of scripts/bench_batch.py prefilled into one pool, every layer's queries and pool captured from one
decode step. Three ways to do it, each checked against the others:
  - gathered: kvlesson.serving.forward.decode_attention, which copies each sequence's pages into one padded array;
  - in place: each block of the pool against its own sequence's queries where it lies (no copy of K or V), one
    partial softmax per block, merged per sequence by a 0/1 matrix product (flash-decoding over pages);
  - two threads: the gathered way on each half of the sequences at once (numpy lets go of the GIL in its loops).
It prints each one's time per decode step (all 30 layers), as a median over rounds, beside the budget the target
leaves: the step's ceiling time x (1/0.9 - 1).
"""
import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count()))  # before numpy loads OpenBLAS
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
from bench_batch import Prefilled, chunk_seconds, prompts  # noqa: E402

from kvlesson import llama  # noqa: E402
from kvlesson.serving.forward import decode_attention, decode_step  # noqa: E402
from kvlesson.text import long_text  # noqa: E402


class InPlace:
    """What the in-place way needs, worked out once per step from the block tables: the run of pool blocks the step's
    sequences read, which sequence reads each (B: none), which of its slots hold positions, and the 0/1 matrix that
    sums blocks into sequences. Needs every block to be read by one sequence at most (no shared prefix)."""

    def __init__(self, tables, lengths, bs):
        B = len(lengths)
        n = -(-lengths // bs)  # [B] blocks each sequence holds
        blocks = np.concatenate([t[:k] for t, k in zip(tables, n, strict=True)])  # [P] in sequence order
        seq = np.repeat(np.arange(B), n)  # [P]
        if len(np.unique(blocks)) != len(blocks):
            raise ValueError("a block read by two sequences: the in-place way needs them unshared")
        self.lo, hi = blocks.min(), blocks.max() + 1
        self.at = blocks - self.lo  # [P] each pair's block within the run
        self.starts = np.concatenate([[0], np.cumsum(n)[:-1]])  # [B] each sequence's first pair
        self.reader = np.full(hi - self.lo, B)  # [R]
        self.reader[self.at] = seq
        slot = (np.arange(len(blocks)) - self.starts[seq])[:, None] * bs + np.arange(bs)  # [P, bs] positions
        self.valid = np.ones((hi - self.lo, bs), bool)  # [R, bs]; unread blocks stay valid: their query is 0
        self.valid[self.at] = slot < lengths[seq][:, None]
        self.sums = np.zeros((B, hi - self.lo), np.float32)  # [B, R]
        self.sums[seq, self.at] = 1
        self.hi = hi


def in_place(q, K, V, pages):
    """[H, B, d] queries, one layer's pool K, V [Hkv, n_blocks, bs, d] -> [H, B, d], reading K and V where they lie."""
    H, B, d = q.shape
    Hkv = K.shape[0]
    G = H // Hkv
    qz = np.zeros((Hkv, B + 1, G, d), q.dtype)  # a zero query for blocks nobody reads
    qz[:, :B] = q.reshape(Hkv, G, B, d).transpose(0, 2, 1, 3)
    Kr, Vr = K[:, pages.lo : pages.hi], V[:, pages.lo : pages.hi]  # [Hkv, R, bs, d] views: nothing copied
    s = np.matvec(Kr[:, :, None], qz[:, pages.reader])  # [Hkv, R, G, bs]
    s *= 1 / math.sqrt(d)
    s = np.where(pages.valid[:, None], s, -np.inf)
    m = s.max(axis=-1)  # [Hkv, R, G]: each block's own max
    s -= m[..., None]
    p = np.exp(s, out=s)
    o = np.vecmat(p, Vr[:, :, None])  # [Hkv, R, G, d]: each block's unnormalised output
    top = np.maximum.reduceat(m[:, pages.at], pages.starts, axis=1)  # [Hkv, B, G]: each sequence's max
    w = np.exp(m - np.concatenate([top, np.zeros((Hkv, 1, G), m.dtype)], axis=1)[:, pages.reader])  # [Hkv, R, G]
    o *= w[..., None]
    num = pages.sums @ o.reshape(Hkv, -1, G * d)  # [Hkv, B, G*d]
    den = pages.sums @ (w * p.sum(axis=-1))  # [Hkv, B, G]
    return (num.reshape(Hkv, B, G, d) / den[..., None]).transpose(0, 2, 1, 3).reshape(H, B, d)


def two_threads(pool):
    def attend(q, K, V, tables, lengths):
        h = q.shape[1] // 2
        a = pool.submit(decode_attention, q[:, :h], K, V, tables[:h], lengths[:h])
        b = pool.submit(decode_attention, q[:, h:], K, V, tables[h:], lengths[h:])
        return np.concatenate([a.result(), b.result()], axis=1)
    return attend


def captured(pre, B):
    """Every layer's decode_attention arguments from one decode step of the first B prefilled sequences."""
    calls, real = [], decode_attention

    def grab(*args):
        calls.append(args)
        return real(*args)

    forks = [pre.pool.fork(s) for s in pre.seqs[:B]]
    with mock.patch("kvlesson.serving.forward.decode_attention", grab):
        decode_step(pre.cfg, pre.w, pre.pool, forks, pre.first[:B])
    return calls  # the forks are kept: their pages are what the calls read


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    model = llama.load()
    ids = prompts(model, args.batch)
    pre = Prefilled(model, ids, room=args.batch + 2)
    calls = captured(pre, args.batch)
    plans = [InPlace(tables, lengths, K.shape[2]) for _, K, _, tables, lengths in calls]
    threads = ThreadPoolExecutor(2)
    ways = {"gathered": lambda i: decode_attention(*calls[i]),
            "in place": lambda i: in_place(*calls[i][:3], plans[i]),
            "two threads": lambda i: two_threads(threads)(*calls[i])}
    ref = [ways["gathered"](i) for i in range(len(calls))]
    for name, way in ways.items():
        worst = max(float(np.abs(way(i) - ref[i]).max()) for i in range(len(calls)))
        print(f"{name}: largest difference from gathered {worst:.1e}")
    text = model.tokenizer.encode(long_text())
    rows = []
    for _ in range(args.rounds):
        row = {"ceiling": chunk_seconds(model, text[: args.batch])}
        for name, way in ways.items():
            t = time.perf_counter()
            for i in range(len(calls)):
                way(i)
            row[name] = time.perf_counter() - t
        rows.append(row)
        print(", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    lens = [int(c) for c in calls[0][4]]
    print(f"\nbatch {args.batch}, contexts {min(lens)} to {max(lens)} positions, {len(calls)} layers, {args.rounds} "
          f"rounds, {os.environ['OPENBLAS_NUM_THREADS']} BLAS threads; medians (min .. max):")
    budget = med["ceiling"] * (1 / 0.9 - 1)
    print(f"ceiling: {args.batch} tokens through one sequence's forward {med['ceiling'] * 1e3:.1f} ms; within 90% "
          f"of it leaves {budget * 1e3:.1f} ms for the step's attention and bookkeeping")
    for name in ways:
        v = [r[name] for r in rows]
        print(f"  {name}: {med[name] * 1e3:.1f} ms per step ({min(v) * 1e3:.1f} .. {max(v) * 1e3:.1f}), "
              f"{med[name] / budget:.1f}x the budget")


if __name__ == "__main__":
    main()
