"""The elements attention moves between slow memory (a GPU's HBM) and on-chip memory (its SRAM): counted, not timed.
This is the IO argument of FlashAttention (Dao et al., arXiv 2205.14135, Theorem 2).

Standard attention writes the N x N scores S and weights P out to slow memory and reads them back: about
4 N d + 4 N^2 elements. A tiled pass holds one tile of rows on chip and streams the other operand past it, so each
streamed element is read once per resident tile. A tile of M elements holds about M / (2d) rows, so the pass moves
about N^2 d^2 / M elements, times a small constant.

Both passes run here on numpy arrays through a SlowMemory that counts every element read or written, and the tiles
held on chip at once are checked against M. So the counts are what the loops do, not a formula. standard_traffic
and tiled_traffic give the same counts in closed form (tests/test_costs_traffic.py proves they agree), for sizes too
large to run. One head, N queries and N keys, no mask, as in the theorem. Two loop orders:

  "kv"  FlashAttention-1 (its Algorithm 1): the outer loop holds Bc keys and values on chip; the inner loop streams
        every query tile past them, reading its Q, O, l and m and writing O, l and m back, once per key tile.
  "q"   FlashAttention-2 (arXiv 2307.08691): the outer loop holds Br queries and their running state on chip; the
        inner loop streams K and V past them. Q is read once, and O and the log-sum-exp are written once.

On chip at once: a query tile's Q, o, m and l (Br (2d + 2)), a key tile's K and V (2 Bc d), and their scores
(Br Bc). `tiles` makes the resident tile as large as M allows, with a streamed tile of one row, because that
minimises what is moved (real kernels pick tiles of 64 or 128 to keep their tensor cores busy, at some cost in
traffic).
"""
import math
from dataclasses import dataclass

import numpy as np

from kvlesson import validate
from kvlesson.online import empty_state, finish, online_update

__all__ = ["Traffic", "SlowMemory", "standard_attention", "tiled_attention", "standard_traffic", "tiled_traffic",
           "tiles", "on_chip"]

LOOPS = ("kv", "q")


@dataclass(frozen=True)
class Traffic:
    reads: int  # elements read from slow memory
    writes: int  # elements written to it

    @property
    def total(self):
        return self.reads + self.writes


class SlowMemory:
    """Named arrays in slow memory, and a count of every element read from them or written to them."""

    def __init__(self, **arrays):
        self.arrays = {name: np.array(a) for name, a in arrays.items()}  # copies: the caller's arrays stay as they are
        self.reads = self.writes = 0

    def read(self, name, rows):
        tile = self.arrays[name][rows]
        self.reads += tile.size
        return tile.copy()  # on chip now: changing it does not change slow memory

    def write(self, name, rows, tile):
        self.arrays[name][rows] = tile
        self.writes += np.size(tile)

    @property
    def traffic(self):
        return Traffic(self.reads, self.writes)


def standard_attention(q, k, v):
    """q, k, v [N, d] -> (out [N, d], Traffic): S = Q K^T, P = softmax(S), O = P V, each written to slow memory and
    read back by the next step (Algorithm 0 of the FlashAttention paper)."""
    q, k, v, N, d = _checked(q, k, v)
    hbm = SlowMemory(Q=q, K=k, V=v, S=np.zeros((N, N)), P=np.zeros((N, N)), O=np.zeros((N, d)))
    everything = slice(None)
    hbm.write("S", everything, hbm.read("Q", everything) @ hbm.read("K", everything).T / math.sqrt(d))
    s = hbm.read("S", everything)  # [N, N]
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    hbm.write("P", everything, e / e.sum(axis=-1, keepdims=True))
    hbm.write("O", everything, hbm.read("P", everything) @ hbm.read("V", everything))
    return hbm.arrays["O"], hbm.traffic


def tiled_attention(q, k, v, M, *, loop="q", tile=None):
    """q, k, v [N, d] -> (out [N, d], Traffic): the online softmax over tiles that fit in M elements on chip.

    tile: (Br, Bc), query rows and keys per tile (default: `tiles(d, M, loop)`). ValueError when they do not fit.
    """
    q, k, v, N, d = _checked(q, k, v)
    M, loop = validate.integer("M", M, minimum=1), _loop(loop)
    Br, Bc = tiles(d, M, loop) if tile is None else (validate.integer("Br", tile[0], minimum=1),
                                                     validate.integer("Bc", tile[1], minimum=1))
    if on_chip(d, Br, Bc) > M:
        raise ValueError(f"tiles of Br={Br} queries and Bc={Bc} keys hold {on_chip(d, Br, Bc):,} elements on chip "
                         f"at d={d}; M={M:,} is too small")
    hbm = SlowMemory(Q=q, K=k, V=v, O=np.zeros((N, d)), m=np.zeros((N, 1)), l=np.zeros((N, 1)), L=np.zeros(N))
    rows = [slice(i, min(i + Br, N)) for i in range(0, N, Br)]
    keys = [slice(j, min(j + Bc, N)) for j in range(0, N, Bc)]
    if loop == "q":
        for r in rows:
            qi, state = hbm.read("Q", r) / math.sqrt(d), empty_state((r.stop - r.start,), d, np.float64)
            for c in keys:
                state = online_update(*state, qi @ hbm.read("K", c).T, hbm.read("V", c))
            out, lse = finish(*state)
            hbm.write("O", r, out)
            hbm.write("L", r, lse)  # the one number per row that the backward pass needs
    else:
        for r in rows:  # Algorithm 1, line 2: O = 0, l = 0, m = -inf, in slow memory
            m, l, o = empty_state((r.stop - r.start,), d, np.float64)
            hbm.write("O", r, o)
            hbm.write("l", r, l)
            hbm.write("m", r, m)
        for n, c in enumerate(keys):
            kj, vj = hbm.read("K", c), hbm.read("V", c)
            for r in rows:
                qi = hbm.read("Q", r) / math.sqrt(d)
                m, l, o = online_update(hbm.read("m", r), hbm.read("l", r), hbm.read("O", r), qi @ kj.T, vj)
                if n == len(keys) - 1:  # after the last key tile, O is written normalised (o is unnormalised here)
                    o = finish(m, l, o)[0]
                hbm.write("O", r, o)
                hbm.write("l", r, l)
                hbm.write("m", r, m)
    return hbm.arrays["O"], hbm.traffic


def standard_traffic(N, d):
    """-> Traffic of standard_attention on N queries and keys of head dim d: 3Nd + 2N^2 reads, 2N^2 + Nd writes."""
    N, d = validate.integer("N", N, minimum=1), validate.integer("d", d, minimum=1)
    return Traffic(reads=3 * N * d + 2 * N * N, writes=2 * N * N + N * d)


def tiled_traffic(N, d, M, loop="q", tile=None):
    """-> Traffic of tiled_attention, in closed form: what one tile pass moves, times the number of outer tiles."""
    N, d = validate.integer("N", N, minimum=1), validate.integer("d", d, minimum=1)
    M, loop = validate.integer("M", M, minimum=1), _loop(loop)
    Br, Bc = tiles(d, M, loop) if tile is None else tile
    if loop == "q":  # Q once; K and V once per query tile; O and L once
        return Traffic(reads=N * d + math.ceil(N / Br) * 2 * N * d, writes=N * d + N)
    Tc = math.ceil(N / Bc)  # K and V once; Q, O, l, m read and O, l, m written once per key tile, after a first write
    return Traffic(reads=2 * N * d + Tc * N * (2 * d + 2), writes=N * (d + 2) + Tc * N * (d + 2))


def tiles(d, M, loop="q"):
    """-> (Br, Bc): the largest resident tile that fits in M elements beside a streamed tile of one row.

    loop "q" keeps queries resident (Bc = 1), loop "kv" keys (Br = 1): see on_chip."""
    d, M, loop = validate.integer("d", d, minimum=1), validate.integer("M", M, minimum=1), _loop(loop)
    if loop == "q":
        Br, Bc = (M - 2 * d) // (2 * d + 3), 1
    else:
        Br, Bc = 1, (M - 2 * d - 2) // (2 * d + 1)
    if min(Br, Bc) < 1:
        raise ValueError(f"M={M:,} elements cannot hold even one query row and one key at d={d} "
                         f"(that needs {on_chip(d, 1, 1)})")
    return Br, Bc


def on_chip(d, Br, Bc):
    """Elements on chip at once: Q, o, m, l of Br queries, K and V of Bc keys, and their Br x Bc scores."""
    return Br * (2 * d + 2) + 2 * Bc * d + Br * Bc


def _checked(q, k, v):
    q, k, v = (validate.floats(name, a) for name, a in (("q", q), ("k", k), ("v", v)))
    if q.ndim != 2 or q.shape != k.shape or k.shape != v.shape or q.shape[0] == 0 or q.shape[1] == 0:
        raise ValueError(f"need q, k, v of one shape [N, d], N and d at least 1; got {q.shape}, {k.shape}, {v.shape}")
    return q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), *q.shape


def _loop(loop):
    if loop not in LOOPS:
        raise ValueError(f"loop must be 'q' (FlashAttention-2: queries outside) or 'kv' (FlashAttention-1: keys "
                         f"outside); got loop={loop!r}")
    return loop
