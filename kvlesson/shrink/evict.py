"""Evicting tokens by the attention they received: H2O (arXiv 2306.14048) and SnapKV (arXiv 2404.14469).

A window with sinks keeps positions for where they are. These caches keep the ones attention has used:
  H2OKVCache    heavy hitters: after every token, the position that has received the least attention so far
                (summed over every query that saw it, all query heads) leaves, unless it is one of the `recent`
                newest; between steps it holds heavy + recent positions, whatever the length of the text;
  SnapKVCache   a prompt compressed once: its last `voters` queries (the observation window) vote with their
                attention, smoothed over neighbouring positions by an average of width `pool`; the keep - voters
                earlier positions with the most votes stay beside the window itself, and every later token is kept.
Both decide from the attention that tokens so far have paid, so a token no query has needed yet goes first,
however much a later query will need it.

These caches need the queries as well as the keys and values. The cache protocol's optional observe(q) brings
them: kvlesson.layer.attend (so step and every model's forward pass) hands each append's queries over, rotated as they
will attend, just before the append. An append without its queries is refused by name.
Each cache evicts a position from every KV head at once, ranked by all H query heads together, because one
bool [T, S] mask serves all heads; the papers rank per head. Kept keys stay at their text positions.
"""
import math

import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache

__all__ = ["ScoredKVCache", "H2OKVCache", "SnapKVCache"]


class ScoredKVCache(Cache):
    """A cache that watches attention: it keeps every token and records what each query paid to each key.

    observe(q) q [H, T, d], the rotated queries of the next append (kvlesson.layer.attend hands them over)
    held       int [m], the text positions of the keys it holds, oldest first
    received   float64 [m]: the attention each held key has received, summed over queries and query heads
    weights    float64 [H, T, S]: the attention of the last append's queries over the keys it handed back
    A subclass evicts by overriding _rule.
    """

    appends = "new arrays"  # an append keeps what it selects as new arrays

    def __init__(self, Hkv, d, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.held = np.zeros(0, np.int64)  # [m]
        self.k = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, m, d]
        self.v = np.zeros((Hkv, 0, d), self.dtype)
        self.received = np.zeros(0)  # [m]
        self.weights = np.zeros((Hkv, 0, 0))
        self._queries = None
        self._last = None  # what the last append decided: (start, positions [S], received before it [S], mask, floor)

    def observe(self, q):
        """q [H, T, d]: the queries of the next append, rotated at their positions."""
        q = validate.floats("q", q)
        if q.ndim != 3 or q.shape[0] % self.Hkv or q.shape[2] != self.d:
            raise ValueError(f"q must be [H, T, d={self.d}] with H a multiple of Hkv={self.Hkv}; got q {q.shape}")
        if q.dtype != self.dtype:
            raise ValueError(f"this cache holds {self.dtype}; got q {q.dtype} (cast explicitly)")
        self._queries = q

    def append(self, k_new, v_new):
        """[Hkv, T, d] each -> (K, V) [Hkv, m + T, d]: the held keys, then the new ones (mask(T) says who sees what)."""
        k_new, v_new, T = self._check(k_new, v_new)
        q = self._queries
        if q is None or q.shape[1] != T:
            got = "none were" if q is None else f"queries of T={q.shape[1]} tokens were"
            raise ValueError(f"{type(self).__name__} ranks keys by attention, so it needs the queries of these T={T} "
                             f"tokens before their keys ({got} observed): kvlesson.layer.attend hands them "
                             "over; appending by hand, call observe(q) first")
        n = self._seen
        K = np.concatenate([self.k, k_new], axis=1)  # [Hkv, S, d]
        V = np.concatenate([self.v, v_new], axis=1)
        positions = np.concatenate([self.held, np.arange(n, n + T)])  # [S]
        before = np.concatenate([self.received, np.zeros(T)])  # [S]
        mask, keep, weights, floor = self._rule(_scores(q, K), positions)
        received = _accumulate(before, weights)
        # only now, with everything decided, does the state move
        self.k, self.v, self.held, self.received = K[:, keep], V[:, keep], positions[keep], received[keep]
        self.weights, self._queries = weights, None
        self._last = (n, positions, before, mask, floor)
        self._seen += T
        return K, V

    def _rule(self, scores, positions):
        """scores [H, T, S] of the new queries, positions [S] of the keys -> (mask [T, S], keep bool [S], weights
        [H, T, S], floor: the furthest back truncate may go afterwards). Here: plain causal, and everything stays."""
        n, T, S = self._seen, scores.shape[1], scores.shape[2]
        mask = positions[None, :] <= np.arange(n, n + T)[:, None]
        return mask, np.ones(S, bool), _softmax(scores, mask), n

    def mask(self, T):
        """-> bool [T, S]: which of the keys the last append handed back each of its T queries saw."""
        T = validate.integer("T", T)
        if self._last is None or self._last[3].shape[0] != T:
            if T == 0:
                return np.zeros((0, self.held.size), bool)
            raise ValueError(f"mask(T={T}) answers for the last append of {type(self).__name__}, which brought "
                             f"{0 if self._last is None else self._last[3].shape[0]} tokens")
        return self._last[3]

    def truncate(self, n):
        """Keep the first n positions, back to the start of the last append at most: what a kept key has received
        depends on every query after it, and only the last append's are still known. A cache that evicted during
        that append can go back only to just after its last eviction."""
        n = self._check_truncate(n, 0 if self._last is None else self._last[4])
        if self._last is None or n == self._seen:
            return
        start, positions, before, mask, floor = self._last
        rows = n - start  # the last append's queries that stay
        received = _accumulate(before, self.weights[:, :rows])  # [S]
        keep = np.isin(positions, self.held) & (positions < n)
        self.k, self.v = self.k[:, self.held < n].copy(), self.v[:, self.held < n].copy()
        self.held, self.received = positions[keep], received[keep]
        self.weights = self.weights[:, :rows, : mask.shape[1] - (self._seen - n)]
        self._last = (start, positions[: positions.size - (self._seen - n)], before[: before.size - (self._seen - n)],
                      mask[:rows, : mask.shape[1] - (self._seen - n)], floor)
        self._seen = n

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class H2OKVCache(ScoredKVCache):
    """Heavy hitters plus a recent window: at most heavy + recent positions between steps.

    Token by token (a chunk of T is decided as T single steps, so any chunking gives the same result): query p sees
    what the cache held after step p - 1, and itself; each key it sees adds its attention weights (summed over query
    heads) to what it has received; then, if more than heavy + recent positions are held, the one that has received
    least leaves, among all but the `recent` newest (of equals, the oldest).
    """

    def __init__(self, Hkv, d, heavy, recent, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.heavy, self.recent = validate.integer("heavy", heavy), validate.integer("recent", recent)
        if heavy + recent < 1:
            raise ValueError(f"H2OKVCache must keep at least one position; got heavy={heavy}, recent={recent}")
        self.budget = heavy + recent

    def _rule(self, scores, positions):
        H, T, S = scores.shape
        n = self._seen
        alive, floor = np.ones(S, bool), n
        mask = np.zeros((T, S), bool)
        weights = np.zeros((H, T, S))
        received = np.zeros(S)
        received[: S - T] = self.received
        for i in range(T):
            p = n + i
            seen = alive & (positions <= p)
            mask[i] = seen
            w = _softmax(scores[:, i, seen], True)  # [H, |seen|]
            weights[:, i, seen] = w
            received[seen] += w.sum(axis=0)
            if seen.sum() > self.budget:
                candidates = np.flatnonzero(seen & (positions <= p - self.recent))
                alive[candidates[np.argmin(received[candidates])]] = False  # argmin: the first (oldest) of equals
                floor = p + 1
        return mask, alive, weights, floor


class SnapKVCache(ScoredKVCache):
    """A prompt compressed once by its own last queries, then every later token kept.

    The first append that brings tokens is the prompt; its queries attend over all of it (causal). If it is longer
    than `keep`, its last `voters` queries (SnapKV's observation window) vote: the attention each earlier position
    received from them, summed over query heads and averaged over `pool` neighbouring positions (SnapKV's pooling,
    so a kept token keeps some of its neighbours), and the keep - voters earlier positions with the most votes stay
    (of equals, the earlier), with the observation window itself. Later appends are kept in full, as in the paper:
    the cache grows again.
    """

    def __init__(self, Hkv, d, keep, voters=16, pool=5, dtype=np.float64):
        super().__init__(Hkv, d, dtype)
        self.keep = validate.integer("keep", keep, minimum=1)
        self.voters = validate.integer("voters", voters, minimum=1)
        self.pool = validate.integer("pool", pool, minimum=1)
        if self.voters > self.keep:
            raise ValueError(f"SnapKVCache keeps its observation window: need voters <= keep; got voters={voters}, "
                             f"keep={keep}")
        if self.pool % 2 == 0:
            raise ValueError(f"pool averages a window centred on each position, so it must be odd; got pool={pool}")
        self.prompt = None  # the prompt's length, once it has come
        self.votes = None  # float64 [prompt - voters]: the smoothed votes, when the prompt was compressed

    def _rule(self, scores, positions):
        mask, keep, weights, floor = super()._rule(scores, positions)
        T, S = mask.shape
        if self.prompt is None and T and S > self.keep:
            votes = weights[:, -self.voters :, : S - self.voters].sum(axis=(0, 1))  # [S - voters]
            pad = self.pool // 2
            smooth = np.convolve(np.pad(votes, pad, mode="edge"), np.ones(self.pool) / self.pool, mode="valid")
            chosen = np.argsort(-smooth, kind="stable")[: self.keep - self.voters]
            keep = np.zeros(S, bool)
            keep[chosen] = True
            keep[S - self.voters :] = True
            self.votes, floor = smooth, S  # decided before the state moves, and nothing after can fail
        return mask, keep, weights, floor

    def append(self, k_new, v_new):
        K, V = super().append(k_new, v_new)
        if self.prompt is None and len(self):
            self.prompt = len(self)
        return K, V

    def truncate(self, n):
        super().truncate(n)
        if self.prompt is not None and n < self.prompt:
            self.prompt = n or None  # a prompt short enough to keep whole: its first n tokens are the prompt now


def _scores(q, K):
    """q [H, T, d], K [Hkv, S, d] -> float64 [H, T, S]: q . k / sqrt(d), query head h against KV head h // G."""
    H, T, d = q.shape
    Hkv, S, _ = K.shape
    qg = q.astype(np.float64).reshape(Hkv, H // Hkv * T, d)
    return (qg @ K.astype(np.float64).transpose(0, 2, 1)).reshape(H, T, S) / math.sqrt(d)


def _accumulate(received, weights):
    """received [S] + weights [H, T, S], summed over heads one query at a time, in order: the same additions in the
    same order whatever the chunking, so a chunked prefill ranks keys exactly as token-by-token decode does."""
    received = received.copy()
    for i in range(weights.shape[1]):
        received += weights[:, i].sum(axis=0)
    return received


def _softmax(scores, mask):
    """[..., S] scores, a bool mask that broadcasts to them -> the weights over the keys it lets through (0 elsewhere).
    Every row sees at least one key (its own)."""
    if scores.size == 0:
        return np.zeros(scores.shape)
    s = np.where(mask, scores, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
