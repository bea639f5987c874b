"""What does batching buy? `python scripts/bench_batch.py` (the transformers column needs requirements-reference.txt)

Measured side by side in one run on SmolLM2-135M-Instruct, float32, on prompts built from the chat template and
the shipped text:
  - batched decode (kvlesson.serving.forward.decode_step over paged pools) at batch 1 to 64: time per step and
    tokens/s, each batch against batch 1 of the same round, and batch 1 against the plain model.forward decode step
    of lesson 08;
  - the batched step's attention vectorised across sequences (one gather through the block tables) against a Python
    loop over the sequences;
  - prefill against decode, and time to first token against time per output token for requests that arrive at once;
  - kvlesson's generate_batch against transformers' own batched generate (left-padded, its own KV cache) on the same
    16 prompts, with the same number of threads;
  - this machine's GEMV bandwidth and GEMM FLOP/s, and the batch at which decode turns compute-bound, here and on an
    H100 SXM (datasheet figures in kvlesson.configs).
Rounds interleave the contenders. The tables give medians over rounds and the min..max spread of each ratio. A round
in which any timing exceeds 1.5x that timing's median over all rounds is flagged as stalled and left out.
"""
import argparse
import ctypes
import datetime
import glob
import os
import platform
import statistics
import sys
import time
from unittest import mock

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count()))  # before numpy loads OpenBLAS
import hf_reference  # noqa: E402  (imports torch only when asked to load)
import numpy as np  # noqa: E402
from bench import kvlesson_decode  # noqa: E402  lesson 08's batch-1 decode step, timed as bench.py times it

from kvlesson import configs, llama  # noqa: E402
from kvlesson.costs import roofline
from kvlesson.sdpa import attention  # noqa: E402
from kvlesson.serving import batch
from kvlesson.serving.forward import decode_step, model_pool, prefill_step
from kvlesson.serving.paged import read_pages, request_blocks
from kvlesson.text import long_text  # noqa: E402

THREADS = int(os.environ["OPENBLAS_NUM_THREADS"])
STALL = 1.5  # a timing this many times its median over rounds marks its round as stalled


def openblas_threads():
    """The thread count numpy's OpenBLAS reports, or None where it cannot be asked."""
    for lib in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*.so")):
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            fn = getattr(ctypes.CDLL(lib), name, None)
            if fn is not None:
                return int(fn())
    return None


def prompts(model, n, seed=0):
    """n chat prompts whose user turns are passages of the shipped text, 16 to 96 tokens long (seeded)."""
    tok, text = model.tokenizer, model.tokenizer.encode(long_text())
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(16, 97))
        start = int(rng.integers(0, len(text) - length))
        out.append(tok.encode(model.chat_prompt("Summarise: " + tok.decode(text[start:start + length]))))
    return out


class Prefilled:
    """Prompts prefilled once into one model-wide pool. Each measurement forks the first B of them (nothing is
    copied until a fork writes into a shared block), decodes the forks and frees them: every round starts from the
    same contexts without prefilling again."""

    def __init__(self, model, ids, room):
        self.cfg, self.w = model.config, model.weights
        need = sum(-(-len(p) // 16) + -(-room // 16) + 2 for p in ids)  # prompt, then each fork's copy and growth
        self.pool = model_pool(self.cfg, need)
        self.seqs = [self.pool.new_sequence() for _ in ids]
        self.first = prefill_step(self.cfg, self.w, self.pool, self.seqs, ids).argmax(axis=-1).tolist()

    def decode(self, B, steps):
        """Median seconds of one batched decode step of the first B sequences."""
        forks = [self.pool.fork(s) for s in self.seqs[:B]]
        tokens, times = self.first[:B], []
        for _ in range(steps):
            t = time.perf_counter()
            logits = decode_step(self.cfg, self.w, self.pool, forks, tokens)
            times.append(time.perf_counter() - t)
            tokens = logits.argmax(axis=-1).tolist()
        for s in forks:
            self.pool.free(s)
        return statistics.median(times)

def loop_decode_attention(q, K, V, tables, lengths):
    """decode_attention as a Python loop over the sequences: each gathers its own pages (paged.read_pages) and calls
    kvlesson.attention, one sequence at a time (the projections stay one product per weight for all)."""
    out = np.empty_like(q)  # [H, B, d]
    for b, (table, L) in enumerate(zip(tables, lengths, strict=True)):
        Kb, Vb = read_pages(K, V, table[None], L)  # [Hkv, 1, L, d]
        out[:, b : b + 1] = attention(q[:, b : b + 1], Kb[:, 0], Vb[:, 0])
    return out


def chunk_seconds(model, tokens):
    """Seconds of lesson 08's model.forward over `tokens` as one fresh sequence, logits for every row: what the
    weights allow at that many rows when nothing is per sequence (the issue's plain chunked forward pass)."""
    t = time.perf_counter()
    model.forward(tokens)
    return time.perf_counter() - t


def prefill_seconds(model, ids):
    cache = model.new_cache(capacity=len(ids))
    t = time.perf_counter()
    model.forward(ids, cache)
    return time.perf_counter() - t


def latencies(model, ids, n, max_batch):
    """Requests submitted together -> (time to first token of each, time per output token of each), seconds."""
    cfg = model.config
    n_blocks = sum(request_blocks(len(p), n, 16) for p in ids)
    engine = batch.Batcher(cfg, model.weights, n_blocks=n_blocks, max_batch=max_batch)
    reqs = [engine.submit(p, n) for p in ids]
    first, last, t0 = {}, {}, time.perf_counter()
    while not engine.done:
        new = engine.step()
        now = time.perf_counter() - t0
        for r, _ in new:
            first.setdefault(r, now)
            last[r] = now
    return [first[r] for r in reqs], [(last[r] - first[r]) / (n - 1) for r in reqs]


def transformers_generate(hf, ids, n, pad_id):
    """Seconds for transformers' generate on the left-padded batch, and its new tokens."""
    import torch

    T = max(map(len, ids))
    input_ids = torch.tensor([[pad_id] * (T - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in ids])
    t = time.perf_counter()
    out = hf_reference.greedy(hf, input_ids, mask, n, pad_id)  # no end token: n tokens per row, as kvlesson
    seconds = time.perf_counter() - t
    return seconds, out.tolist()


def settle(seconds=0.3):
    """Let the other library's worker threads stop spinning (OpenBLAS and OpenMP both busy-wait after a call)."""
    time.sleep(seconds)


def stalled(rounds):
    """Indices of rounds in which some timing exceeds STALL x its median over rounds."""
    keys = rounds[0].keys()
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    return {i for i, r in enumerate(rounds) if any(r[k] > STALL * med[k] for k in keys)}


def summary(rounds, label):
    """Drop stalled rounds (say so) -> the rounds to quote."""
    bad = stalled(rounds) if len(rounds) > 2 else set()
    if bad:
        print(f"({label}: round{'s' if len(bad) > 1 else ''} {', '.join(str(i + 1) for i in sorted(bad))} of "
              f"{len(rounds)} flagged as stalled and left out)")
    kept = [r for i, r in enumerate(rounds) if i not in bad]
    return kept or rounds


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))} .. {fmt(max(values))})"


def main(argv=None):
    ap = argparse.ArgumentParser(description="kvlesson batched decoding, side by side")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per batch per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loop-batches", type=int, nargs="*", default=[16, 64], help="batches for the attention loop")
    ap.add_argument("--requests", type=int, default=16, help="requests that arrive together, for TTFT and TPOT")
    ap.add_argument("--request-tokens", type=int, default=16, help="new tokens per request, for TTFT and TPOT")
    ap.add_argument("--hf-prompts", type=int, default=16)
    ap.add_argument("--hf-tokens", type=int, default=32, help="new tokens per prompt in the generate comparison")
    ap.add_argument("--hf-rounds", type=int, default=3)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--generate-only", action="store_true", help="only the comparison with transformers' generate")
    args = ap.parse_args(argv)

    model = llama.load()
    ids = prompts(model, max(args.batches + [args.hf_prompts, args.requests]))
    ref = None
    if not args.no_transformers:
        ref = hf_reference.load(threads=THREADS)
    print(f"### kvlesson batched decode benchmark, {datetime.date.today()}, {os.cpu_count()} cores "
          f"({platform.machine()}, {platform.processor() or 'cpu'}), Python {sys.version.split()[0]}, "
          f"numpy {np.__version__}" + (f", {ref[2]}" if ref else ""))
    torch_threads = None
    if ref:
        import torch
        torch_threads = torch.get_num_threads()
    print(f"threads: numpy's OpenBLAS {openblas_threads()}" + (f", torch {torch_threads}" if ref else "")
          + f"; load average at start {os.getloadavg()[0]:.2f}")
    print(f"{len(ids)} chat prompts of {min(map(len, ids))} to {max(map(len, ids))} tokens (seed 0)\n", flush=True)

    # ---- the machine's roofline
    bw, fl = roofline.matvec_bandwidth(), roofline.matmul_flops()
    h100 = configs.ACCELERATORS["H100 SXM"]
    print(f"GEMV bandwidth {bw / 1e9:.1f} GB/s (8192 x 8192 float32 matvec), GEMM {fl / 1e9:.0f} GFLOP/s "
          f"(1536^3 float32): ridge {roofline.ridge(fl, bw):.1f} FLOP/B; float32 weights (4 B) turn compute-bound "
          f"near batch {roofline.crossover_batch(fl, bw, 4):.0f}")
    print(f"H100 SXM: {h100.bf16_flops / 1e12:.1f} TFLOP/s / {h100.bandwidth / 1e12:.2f} TB/s = "
          f"{roofline.ridge(h100.bf16_flops, h100.bandwidth):.0f} FLOP/B; bf16 weights (2 B) turn compute-bound near "
          f"batch {roofline.crossover_batch(h100.bf16_flops, h100.bandwidth, 2):.0f}\n", flush=True)

    if not args.generate_only:
        decode_tables(model, ids, args)
    if ref:
        generate_table(model, ref, ids, args)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} (1 minute; this machine has {os.cpu_count()} cores)")


def decode_tables(model, ids, args):
    """Decode throughput against batch size, the attention loop, prefill, and time to first token."""
    pre = Prefilled(model, ids[: max(args.batches)], room=args.steps + max(args.batches) + 1)
    text = model.tokenizer.encode(long_text())
    rounds = []
    for r in range(args.rounds):
        row = {"plain": kvlesson_decode(model, ids[0], args.steps)}
        for B in args.batches:
            row[B] = pre.decode(B, args.steps)
            row[f"chunk {B}"] = chunk_seconds(model, text[:B])
        for B in args.loop_batches:
            if B <= max(args.batches):
                with mock.patch("kvlesson.serving.forward.decode_attention", loop_decode_attention):
                    row[f"loop {B}"] = pre.decode(B, args.steps)
        row["prefill"] = prefill_seconds(model, model.tokenizer.encode(long_text())[:128])
        rounds.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k}: {v * 1e3:.0f} ms" for k, v in row.items()), flush=True)
    kept = summary(rounds, "decode")
    one = [r[1] for r in kept] if 1 in args.batches else None
    print(f"\nSmolLM2-135M-Instruct, float32, {args.steps} decode steps per batch per round, {len(kept)} of "
          f"{len(rounds)} rounds; medians, ratios as median (min .. max) over rounds.\n")
    print("| batch | time per step | tokens/s | tokens/s vs batch 1 | ceiling: B tokens as one sequence's forward |")
    print("|---|---|---|---|---|")
    plain = [r["plain"] for r in kept]
    print(f"| 1, plain model.forward | {statistics.median(plain) * 1e3:.1f} ms | {1 / statistics.median(plain):.1f} | "
          + (spread([p / o for p, o in zip(plain, one, strict=True)], lambda x: f"{x:.2f}x") if one else "") + " | |")
    for B in args.batches:
        t, c = [r[B] for r in kept], [r[f"chunk {B}"] for r in kept]
        ratio = spread([B * o / x for x, o in zip(t, one, strict=True)], lambda x: f"{x:.1f}x") if one else ""
        ceiling = spread([B * o / x for x, o in zip(c, one, strict=True)], lambda x: f"{x:.1f}x") if one else ""
        print(f"| {B} | {statistics.median(t) * 1e3:.1f} ms | {B / statistics.median(t):.0f} | {ratio} | "
              f"{statistics.median(c) * 1e3:.1f} ms, {ceiling} |")
    for B in args.loop_batches:
        if f"loop {B}" in kept[0]:
            t, v = [r[f"loop {B}"] for r in kept], [r[B] for r in kept]
            print(f"\nbatch {B}: attention as a loop over sequences {statistics.median(t) * 1e3:.1f} ms per step, "
                  f"vectorised {statistics.median(v) * 1e3:.1f} ms: the loop takes "
                  + spread([a / b for a, b in zip(t, v, strict=True)], lambda x: f"{x:.2f}x") + " as long")
    p = statistics.median(r["prefill"] for r in kept)
    print(f"\nprefill of 128 tokens in one pass: {p * 1e3:.0f} ms, {128 / p:.0f} tokens/s")
    if one:
        top = max(args.batches)
        print(f"decode at batch 1: {1 / statistics.median(one):.0f} tokens/s; at batch {top}: "
              f"{top / statistics.median(r[top] for r in kept):.0f} tokens/s")

    # ---- time to first token against time per output token
    n, many = args.request_tokens, args.requests
    for mb in (many, max(many // 4, 1)):
        first, per = latencies(model, ids[:many], n, mb)
        print(f"{many} requests at once, {n} new tokens each, max_batch {mb}: time to first token median "
              f"{statistics.median(first):.2f} s (first {min(first):.2f} s, last {max(first):.2f} s); time per output "
              f"token median {statistics.median(per) * 1e3:.0f} ms", flush=True)

def generate_table(model, ref, ids, args):
    """kvlesson's generate_batch against transformers' generate on the same prompts, interleaved rounds."""
    hf_ids = ids[: args.hf_prompts]
    pad = model.tokenizer.encode("<|im_end|>")[0]
    rows, ours, theirs = [], None, None
    for _ in range(args.hf_rounds):
        settle()
        t = time.perf_counter()
        ours = model.generate_batch(hf_ids, args.hf_tokens)
        mine = time.perf_counter() - t
        settle()
        secs, theirs = transformers_generate(ref[0], hf_ids, args.hf_tokens, pad)
        rows.append({"kvlesson": mine, "transformers": secs})
        print(f"generate round: kvlesson {mine:.2f} s, transformers {secs:.2f} s", flush=True)
    kept = summary(rows, "generate")
    total = len(hf_ids) * args.hf_tokens
    k_tps = [total / r["kvlesson"] for r in kept]
    t_tps = [total / r["transformers"] for r in kept]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"\n| {len(hf_ids)} prompts x {args.hf_tokens} new tokens, greedy | tokens/s (median of {len(kept)}) |")
    print("|---|---|")
    print(f"| kvlesson generate_batch (paged, continuous batching) | {statistics.median(k_tps):.0f} |")
    print(f"| transformers generate (left-padded, its own cache) | {statistics.median(t_tps):.0f} |")
    print("| ratio | kvlesson " + spread([a / b for a, b in zip(k_tps, t_tps, strict=True)],
                                       lambda x: f"{x:.2f}x") + " |")
    print(f"\nthe same {args.hf_tokens} tokens from both for {same} of {len(hf_ids)} prompts")


if __name__ == "__main__":
    main()
