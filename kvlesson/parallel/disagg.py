"""Disaggregated prefill and decode (DistServe, arXiv 2401.09670; Splitwise, arXiv 2311.18677; Mooncake, arXiv
2407.00079): one rank runs the prompt, another writes the answer, and the cache travels between them.

Rank 0, the prefill rank, runs the prompt through the batched forward pass on a paged pool of its own
(kvlesson.serving), picks the first new token, and ships the sequence to rank 1:
    a header       the sequence's length L and the first new token
    its table      the physical blocks that hold its positions, ceil(L / block_size) of them, in order
    the blocks     K and V of those blocks, every layer's KV heads: [2, n_layers * Hkv, n, block_size, d]
Rank 1, the decode rank, takes free blocks of its own pool for them (their numbers differ from rank 0's: the table is
rewritten, the positions are not) and decodes from there; its tokens equal model.generate's. The last block is
partly filled whenever block_size does not divide L, and it must travel too: the newest positions live in it.

With --int8 rank 0 also prices the blocks as lesson 11's 8-bit codes, one scale and one minimum per token and KV head:
their bytes, and whether every number comes back within half a step of its own scale.

    mpiexec -n 2 python -m kvlesson.parallel.disagg --ids 1,2,3 --new-tokens 8
"""
import argparse
import math
import time

import numpy as np

from kvlesson import validate
from kvlesson.parallel import launch
from kvlesson.serving.forward import model_pool, run
from kvlesson.serving.paged import SwappedSequence
from kvlesson.shrink.quant import dequantize, quantize

PREFILL, DECODE = 0, 1  # the ranks' jobs


def blocks_to_ship(pool, seq):
    """-> [n] the physical blocks that hold the sequence's positions, in order: its whole table, the partly filled
    last block included."""
    return np.array(pool.block_table(seq), np.int64)


def ship(comm, pool, seq, first_token):
    """Prefill side: send sequence `seq` of `pool` to the decode rank: header, block table, blocks."""
    L, table = pool.length(seq), blocks_to_ship(pool, seq)  # [n]
    blocks = np.ascontiguousarray(np.stack([pool.k[:, table], pool.v[:, table]]))  # [2, Hkv_all, n, bs, d], a copy
    comm.Send(np.array([L, len(table), first_token], np.int64), DECODE)
    comm.Send(table, DECODE)
    comm.Send(blocks, DECODE)
    return blocks


def receive(comm, pool):
    """Decode side: -> (the id of a new sequence of `pool` holding what arrived, the first new token)."""
    header = np.empty(3, np.int64)
    comm.Recv(header, PREFILL)
    L, n, first_token = (int(x) for x in header)
    table = np.empty(n, np.int64)
    comm.Recv(table, PREFILL)
    blocks = np.empty((2, pool.Hkv, n, pool.block_size, pool.d), pool.dtype)
    comm.Recv(blocks, PREFILL)
    if n != math.ceil(L / pool.block_size):
        raise ValueError(f"the block table holds {n} blocks of {pool.block_size} positions for a sequence of {L}: "
                         f"it needs ceil({L} / {pool.block_size}) = {math.ceil(L / pool.block_size)}")
    return pool.swap_in(SwappedSequence(blocks[0], blocks[1], L)), first_token  # ValueError when it does not fit


def int8_blocks(blocks):
    """[2, Hkv_all, n, bs, d] float32 -> (codes uint8 like it, scale and lo [.., 1] float32): lesson 11's per-token
    8-bit form, one (scale, minimum) per position and KV head."""
    return quantize(blocks, 8, axis=-1, dtype=np.float32)


def program(comm, args):
    """Prefill on rank 0, ship, decode on rank 1; rank 0 returns the tokens and what crossed."""
    if comm.size != 2:
        raise ValueError(f"disaggregation runs on 2 ranks, a prefill rank and a decode rank; got P={comm.size}")
    ids = [int(i) for i in args.ids.split(",")] if args.ids else []
    new_tokens = validate.integer("--new-tokens", args.new_tokens, minimum=1)
    block_size = validate.integer("--block-size", args.block_size, minimum=1)
    launch.agree(comm, "the prompt, the new tokens and the block size", (ids, new_tokens, block_size))
    if not ids:
        raise ValueError("--ids is empty: give the prompt's token ids, comma-separated")
    cfg, w = launch.load_weights(comm)
    pool = model_pool(cfg, math.ceil((len(ids) + new_tokens) / block_size) + 1, block_size)
    start = time.perf_counter()
    report = {}
    if comm.rank == PREFILL:
        seq = pool.new_sequence()
        first = int(np.argmax(run(cfg, w, pool, [seq], [ids])[-1]))
        prefill_seconds = time.perf_counter() - start
        blocks = ship(comm, pool, seq, first)
        report = {"prefill_seconds": prefill_seconds, "shipped_bytes": comm.bytes["Send"],
                  "block_bytes": blocks.nbytes}
        if args.int8:
            codes, scale, lo = int8_blocks(blocks)
            report["int8_bytes"] = codes.nbytes + scale.nbytes + lo.nbytes
            error = np.abs(dequantize(codes, scale, lo) - blocks)  # [2, Hkv_all, n, bs, d]
            # half a step, plus the one float32 rounding of the number that comes back
            bound = scale / 2 + np.finfo(np.float32).eps * np.abs(blocks)
            report["int8_within_half_step"] = bool((error <= bound).all())
    else:
        seq, token = receive(comm, pool)
        tokens = [token]
        while len(tokens) < new_tokens:
            tokens.append(int(np.argmax(run(cfg, w, pool, [seq], [[tokens[-1]]])[-1])))
        report = {"tokens": tokens, "table": pool.block_table(seq), "decode_seconds": time.perf_counter() - start}
    both = comm.allgather(report)
    return {**both[PREFILL], **both[DECODE], "L": len(ids), "block_size": block_size, "ledger": comm.ledger()}


def arguments():
    parser = argparse.ArgumentParser(description="prefill on rank 0, ship the paged blocks, decode on rank 1")
    parser.add_argument("--ids", default="", help="the prompt's token ids, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--int8", action="store_true", help="also price the blocks as 8-bit codes")
    return parser


if __name__ == "__main__":
    launch.main(program, arguments())
