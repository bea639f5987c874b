"""Ring attention (context parallelism; Liu, Zaharia and Abbeel, arXiv 2310.01889): one sequence's keys and values
split over P ranks, each rank keeping its queries while the blocks of keys and values travel round a ring.

At step s of P, rank r holds the block that started on rank (r - s) mod P. It scores its queries against that block,
folds the partial (out, lse) into its running one with lesson 10's merge (kvlesson.online.merge_partials), and passes
the block on to rank r + 1 while it takes the next from rank r - 1: one Sendrecv a step. After P steps every rank has
met every block, so its queries' attention is over the whole sequence, as in one process.

The mask is lesson 04's offset mask, once more, now per block: a block holds the positions of the rank it started
on, layout[src], not 0 .. len - 1, and each query sits at its own position. Mask a block by local index (the bug)
and a query sees its own future on some blocks and loses its past on others.

Which positions each rank holds is the layout:
  contiguous  rank r holds the r-th run of about S / P positions. Under the causal mask rank 0's queries see only
              its own block and rank P - 1's see all P: the first rank idles while the last one works.
  zigzag      the sequence cut into 2P chunks; rank r holds chunk r and chunk 2P - 1 - r, one early and one late,
              so that every rank scores about the same number of keys.
Queries: with T < S new queries (a chunk after a cached prefix) each rank keeps the queries at the positions it
holds. For decode (a few queries over a long sharded cache) moving the cache round a ring is the wrong trade:
`split_kv` sends every rank the queries instead, each attends over its own keys, and the P partials are merged:
flash-decoding's split-KV, across devices.

    mpiexec -n 4 python -m kvlesson.parallel.ring --cases 5 --layout zigzag
"""
import argparse

import numpy as np

from kvlesson import validate
from kvlesson.online import merge_partials, partial_attention
from kvlesson.parallel import launch

LAYOUTS = ("contiguous", "zigzag")
MASKS = ("absolute", "local")  # "local": the bug, on purpose, for the lesson and the tests to watch fail


def layout(S, P, kind="contiguous"):
    """-> [P arrays of int positions]: the positions of the S keys (and of the queries among them) each rank holds."""
    S, P = validate.integer("S", S), validate.integer("P", P, minimum=1)
    if kind == "contiguous":
        return np.array_split(np.arange(S), P)
    if kind == "zigzag":
        chunks = np.array_split(np.arange(S), 2 * P)
        return [np.concatenate([chunks[r], chunks[2 * P - 1 - r]]) for r in range(P)]
    raise ValueError(f"layout must be one of {LAYOUTS}; got {kind!r}")


def ring_attention(comm, q, k, v, pos_q, held, *, mask="absolute"):
    """This rank's queries over every rank's keys -> (out [H, Tr, d], lse [H, Tr], scores computed at each step).

    q [H, Tr, d] at positions pos_q [Tr]; k, v [Hkv, Sr, d], this rank's block; held: every rank's positions, the
    layout (each rank knows the others' sizes from it, so no block needs a header). Of each block only the rectangle
    that some query can see is scored: the queries at or after its first key, against the keys at or before its last
    query. A block wholly in this rank's future is passed on unscored; that is where a contiguous layout idles rank 0,
    and zigzag's half-blocks are where it balances.
    """
    r, P = comm.rank, comm.size
    H, Tr, d = q.shape
    Hkv = k.shape[0]
    out, lse = np.zeros_like(q), np.full((H, Tr), -np.inf, np.result_type(q.dtype, np.float32))  # the merge's identity
    block = np.ascontiguousarray(np.stack([k, v]))  # [2, Hkv, Sr, d]: one message a step (stack keeps k's order)
    work = []
    if mask == "local":  # the bug: every block masked as if it were the diagonal one, j <= i by index
        pos_q = np.arange(Tr)
    for s in range(P):
        src = (r - s) % P  # where the block in hand started
        pos_k = held[src] if mask == "absolute" else np.arange(len(held[src]))  # its own positions, or the bug's
        rows = pos_q >= (pos_k.min() if len(pos_k) else np.inf)  # [Tr] queries that see some key of the block
        cols = pos_k <= (pos_q.max() if Tr else -1)  # keys that some query sees
        if rows.any():  # score only that rectangle: the rest is masked for every query
            part = partial_attention(q[:, rows], block[0][:, cols], block[1][:, cols], pos_q[rows], pos_k[cols])
            out[:, rows], lse[:, rows] = merge_partials(np.stack([out[:, rows], part[0]]),
                                                        np.stack([lse[:, rows], part[1]]))
        work.append(int(rows.sum() * cols.sum()))  # scores computed at this step
        if s < P - 1:  # pass it on, take the next: the block that started on rank (r - s - 1) mod P
            incoming = np.empty((2, Hkv, len(held[(src - 1) % P]), d), block.dtype)
            comm.Sendrecv(block, dest=(r + 1) % P, recv=incoming, source=(r - 1) % P)
            block = incoming
    return out, lse, work


def split_kv(comm, q, k, v, pos_q, pos_k):
    """Decode over a sharded cache: the same queries on every rank, each over its own keys -> on rank 0, (out, lse)
    merged from the P partials (None elsewhere). Moves P partials of q's size (plus one lse a row), not the cache."""
    H, T, d = q.shape
    if len(pos_k):
        out, lse = partial_attention(q, k, v, pos_q, pos_k)  # [H, T, d], [H, T]
    else:  # a rank that holds no key (S < P) contributes the merge's identity
        out, lse = np.zeros_like(q), np.full((H, T), -np.inf, np.result_type(q.dtype, np.float32))
    P = comm.size
    outs = np.empty((P, *out.shape), out.dtype) if comm.rank == 0 else None
    lses = np.empty((P, *lse.shape), lse.dtype) if comm.rank == 0 else None
    comm.Gather(np.ascontiguousarray(out), outs)
    comm.Gather(np.ascontiguousarray(lse), lses)
    return merge_partials(outs, lses) if comm.rank == 0 else None


def case(seed, max_S=40):
    """The same random case on every rank from one seed: q [H, T, d], k, v [Hkv, S, d] in float64; T = S half the
    time, else any T from 1 to S."""
    rng = np.random.default_rng(seed)
    Hkv, G, d = (int(x) for x in rng.integers(1, [4, 4, 9]))
    S = int(rng.integers(1, max_S + 1))
    T = S if rng.random() < 0.5 else int(rng.integers(1, S + 1))
    q = rng.standard_normal((Hkv * G, T, d))  # [H, T, d]
    k, v = rng.standard_normal((2, Hkv, S, d))  # [Hkv, S, d] each
    return q, k, v


def program(comm, args):
    """args.cases random cases (or one of the given shape), each by ring attention (or split-KV); rank 0 returns every
    case's inputs' shapes, the whole output put back in position order, and each rank's work."""
    if args.layout not in LAYOUTS or args.mask not in MASKS:
        raise ValueError(f"--layout must be one of {LAYOUTS} and --mask one of {MASKS}")
    launch.agree(comm, "the run's settings", (args.seed, args.cases, args.layout, args.mask, args.split_kv, args.S,
                                               args.T))
    results = []
    for i in range(validate.integer("--cases", args.cases, minimum=1)):
        q, k, v = case(args.seed + i) if args.S is None else given(args, i)
        launch.agree(comm, "the shapes of q, k and v", (q.shape, k.shape))
        results.append(one(comm, q, k, v, args))
    return {"P": comm.size, "cases": results, "ledger": comm.comm.gather(comm.ledger())}


def given(args, i):
    """A case of the given sizes: H = 4 query heads on 2 KV heads of d = 16, seeded."""
    S, T = validate.integer("--S", args.S, minimum=1), validate.integer("--T", args.T or args.S, minimum=1)
    if T > S:
        raise ValueError(f"--T={T} queries cannot follow --S={S} keys: T <= S")
    rng = np.random.default_rng(args.seed + i)
    return rng.standard_normal((4, T, 16)), *rng.standard_normal((2, 2, S, 16))


def one(comm, q, k, v, args):
    """One case on every rank; -> on rank 0 the case's result dict (None elsewhere)."""
    (H, T, d), S = q.shape, k.shape[1]
    held = layout(S, comm.size, args.layout)
    mine = held[comm.rank]
    if args.split_kv:
        merged = split_kv(comm, q, k[:, mine], v[:, mine], np.arange(S - T, S), mine)
        return None if merged is None else {"S": S, "T": T, "q": q, "k": k, "v": v, "out": merged[0]}
    ask = mine[mine >= S - T]  # the queries this rank holds: those at its positions, among the last T
    out, _, work = ring_attention(comm, q[:, ask - (S - T)], k[:, mine], v[:, mine], ask, held, mask=args.mask)
    parts = comm.comm.gather((ask, out, work), root=0)  # collecting the answer to check it, not part of the method
    if comm.rank:
        return None
    whole = np.empty((H, T, d), q.dtype)
    for ask_r, out_r, _ in parts:
        whole[:, ask_r - (S - T)] = out_r
    return {"S": S, "T": T, "q": q, "k": k, "v": v, "out": whole, "work": [w for _, _, w in parts]}


def arguments():
    parser = argparse.ArgumentParser(description="ring attention on P ranks, checked against one process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=1, help="random cases, seeds seed, seed + 1, ...")
    parser.add_argument("--S", type=int, default=None, help="keys: one case of this size instead of random ones")
    parser.add_argument("--T", type=int, default=None, help="queries, the last T positions (default: S)")
    parser.add_argument("--layout", default="contiguous", help=" or ".join(LAYOUTS))
    parser.add_argument("--mask", default="absolute", help="absolute, or local: the bug, masking by local index")
    parser.add_argument("--split-kv", action="store_true", help="decode: queries to every rank, partials merged")
    return parser


if __name__ == "__main__":
    launch.main(program, arguments())
