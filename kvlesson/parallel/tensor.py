"""Tensor parallelism (Megatron-LM, Shoeybi et al., arXiv 1909.08053) of the one forward pass: P ranks, one model.

Each rank holds a slice of every layer, as views of the full weights (no copy, and no second layer body):
    Wq [D, H*d]             the columns of its H / P query heads
    Wk, Wv [D, Hkv*d]       the columns of the KV heads its query heads read: with P > Hkv one KV head serves several
                            ranks, and each of them holds a copy of it, in its weights and in its cache
    Wo [H*d, D]             the rows its heads' outputs multiply
    Wgate, Wup [D, hidden]  a slice of the columns (nearly equal slices: hidden need not divide by P);
    Wdown [hidden, D]       the same rows
    the output head [D, vocab]  a slice of the columns: each rank scores its own part of the vocabulary
    the norms and the token table: whole on every rank
A rank's attention output times its rows of Wo is one term of the full product, a sum over heads; so is its
feed-forward output times its rows of Wdown, a sum over the hidden columns. kvlesson.model.forward's `reduce` sums each
over the ranks with one all-reduce before it joins the residual: two all-reduces per layer. The head's slices need no
sum: to pick the next token each rank offers its best (score, token) and one all-gather of those P pairs decides.

    mpiexec -n 3 python -m kvlesson.parallel.tensor --ids 1,2,3 --new-tokens 8
"""
import argparse
import dataclasses
import time

import numpy as np

from kvlesson import model as _model
from kvlesson import validate
from kvlesson.parallel import launch


def check(cfg, P):
    """ValueError unless P ranks can share cfg's heads: P divides the H query heads, and P divides the Hkv KV heads or
    is a multiple of them (then each KV head is copied to P / Hkv ranks)."""
    P = validate.integer("P", P, minimum=1)
    if cfg.H % P:
        raise ValueError(f"P={P} ranks cannot share {cfg.H} query heads evenly: P must divide H={cfg.H}")
    if cfg.Hkv % P and P % cfg.Hkv:
        raise ValueError(f"P={P} ranks cannot share {cfg.Hkv} KV heads: P must divide Hkv={cfg.Hkv} or be a multiple "
                         "of it (each KV head then copied to P / Hkv ranks)")
    return P


def heads(cfg, rank, P):
    """-> (query heads, KV heads) of `rank` among P, as ranges. Query head h reads KV head h // G (G = H / Hkv), so
    the KV heads a rank needs are those of its first and last query heads and every one between."""
    P = check(cfg, P)
    rank = validate.integer("rank", rank)
    if rank >= P:
        raise ValueError(f"rank={rank} is not one of the P={P} ranks")
    n, G = cfg.H // P, cfg.H // cfg.Hkv
    first = rank * n
    return range(first, first + n), range(first // G, (first + n - 1) // G + 1)


def columns(hidden, rank, P):
    """-> range: the feed-forward's hidden columns of `rank`, P nearly equal slices in order."""
    return range(rank * hidden // P, (rank + 1) * hidden // P)


def shard(cfg, w, rank, P):
    """-> (cfg, weights) of one rank: its heads and columns as views of `w`, the config they make (H, Hkv and hidden
    of the slice). kvlesson.model.forward runs it like any model, and its caches hold only its KV heads."""
    q_heads, kv_heads = heads(cfg, rank, P)
    if "blk.0.attn_qkv.weight" in w:
        raise ValueError("shard takes the model's plain weights; fused ones (Model.fused) mix Q, K and V columns")
    d, cols = cfg.d, columns(cfg.hidden, rank, P)
    q, kv = slice(q_heads.start * d, q_heads.stop * d), slice(kv_heads.start * d, kv_heads.stop * d)
    c = slice(cols.start, cols.stop)
    mine = {}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        mine |= {b + "attn_norm.weight": w[b + "attn_norm.weight"], b + "ffn_norm.weight": w[b + "ffn_norm.weight"],
                 b + "attn_q.weight": w[b + "attn_q.weight"][:, q],  # [D, H/P * d]
                 b + "attn_k.weight": w[b + "attn_k.weight"][:, kv],  # [D, its KV heads * d]
                 b + "attn_v.weight": w[b + "attn_v.weight"][:, kv],
                 b + "attn_output.weight": w[b + "attn_output.weight"][q],  # [H/P * d, D]
                 b + "ffn_gate.weight": w[b + "ffn_gate.weight"][:, c],  # [D, its columns]
                 b + "ffn_up.weight": w[b + "ffn_up.weight"][:, c],
                 b + "ffn_down.weight": w[b + "ffn_down.weight"][c]}  # [its columns, D]
    words = columns(cfg.vocab, rank, P)
    mine |= {"token_embd.weight": w["token_embd.weight"], "output_norm.weight": w["output_norm.weight"],
             "output.weight": w["output.weight"][:, words.start : words.stop]}  # [D, its slice of the vocabulary]
    return dataclasses.replace(cfg, H=len(q_heads), Hkv=len(kv_heads), hidden=len(cols)), mine


def all_reduce(comm):
    """-> reduce(partial) -> full: the sum of every rank's partial [T, D], the same on every rank."""
    def reduce(partial):
        full = np.empty_like(partial)
        comm.Allreduce(np.ascontiguousarray(partial), full)
        return full
    return reduce


def generate(comm, cfg, w, ids, new_tokens, reduce=None):
    """Greedy decoding on P ranks -> (new token ids, this rank's slice of the prompt's logits [T, its vocabulary],
    this rank's caches). Each rank runs the one forward pass on its shard."""
    local, mine = shard(cfg, w, comm.rank, comm.size)
    caches = _model.new_cache(_model.with_max_len(local, len(ids) + new_tokens))
    reduce = reduce or all_reduce(comm)
    logits = _model.forward(local, mine, ids, caches, reduce=reduce)  # [T, this rank's slice of the vocabulary]
    prompt_logits, out = logits, []
    while len(out) < new_tokens:
        out.append(argmax(comm, logits[-1], columns(cfg.vocab, comm.rank, comm.size).start))
        if len(out) < new_tokens:
            logits = _model.forward(local, mine, out[-1:], caches, reduce=reduce)
    return out, prompt_logits, caches


def argmax(comm, scores, first):
    """The token with the highest score over every rank's slice of the vocabulary (this rank's starts at token
    `first`), the same on every rank: each offers its best (score, token), one all-gather, the highest wins, the
    lowest token on a tie, as np.argmax over the whole row would choose."""
    i = int(np.argmax(scores))
    offers = np.empty((comm.size, 2))  # [P, (score, token)]: float64 holds every float32 score and token id exactly
    comm.Allgather(np.array([scores[i], first + i], np.float64), offers)
    best = offers[:, 0].max()
    return int(offers[offers[:, 0] == best, 1].min())


def program(comm, args):
    """One run: load, check that the ranks agree, generate, and gather what each rank holds and sent."""
    ids = [int(i) for i in args.ids.split(",")] if args.ids else []
    new_tokens = validate.integer("--new-tokens", args.new_tokens)
    cfg, w = launch.load_weights(comm)
    check(cfg, comm.size)
    launch.agree(comm, "the prompt's token ids", ids)
    launch.agree(comm, "the number of new tokens", new_tokens)
    if not ids:
        raise ValueError("--ids is empty: give the prompt's token ids, comma-separated")
    start = time.perf_counter()
    tokens, logits, caches = generate(comm, cfg, w, ids, new_tokens)
    seconds = time.perf_counter() - start
    q_heads, kv_heads = heads(cfg, comm.rank, comm.size)
    mine = {"q_heads": list(q_heads), "kv_heads": list(kv_heads), "cache_bytes": sum(c.nbytes for c in caches),
            "positions": len(ids) + new_tokens, "ledger": comm.ledger(), "seconds": seconds,
            "waiting": dict(comm.seconds)}
    ranks = comm.allgather(mine)
    slices = comm.comm.gather(logits, root=0)  # the prompt's logits, to check them: not part of the method
    whole = np.concatenate(slices, axis=-1) if comm.rank == 0 else None  # [T, vocab]
    return {"tokens": tokens, "logits": whole, "P": comm.size, "ranks": ranks}


def arguments():
    parser = argparse.ArgumentParser(description="SmolLM2, greedy, on P ranks by tensor parallelism")
    parser.add_argument("--ids", default="", help="the prompt's token ids, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=8)
    return parser


if __name__ == "__main__":
    launch.main(program, arguments())
