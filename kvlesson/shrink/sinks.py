"""Attention sinks (StreamingLLM, arXiv 2309.17453): keep the first few tokens for ever, plus a sliding window.

A query at position p sees key j when

    j <= p   and   (j < sinks   or   j > p - window)

so the cache holds at most `sinks` + `window` - 1 positions between steps, whatever the length of the text.

Two ways to place the kept keys in RoPE's geometry:
  SinkKVCache           keys keep the positions they had in the text (what kvlesson.step does anyway: it rotates
                        q and k at absolute positions), so a sink sits p - j positions behind query p;
  StreamingSinkKVCache  positions within the cache, as the paper assigns them: the sinks sit right before the
                        window, so a sink is never more than sinks + window - 1 positions behind its query.
Inside the window both agree: the window is contiguous in the text and in the cache alike.
"""
import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache
from kvlesson.rope import apply_rope


class SinkKVCache(Cache):
    """The first `sinks` positions, kept for ever, plus a ring of the most recent `window` - 1.

    append(k_new, v_new) hands back the held sinks, the held recent keys and the T new ones, oldest first;
    mask(T) says which of them each of the T newest queries may see, and kvlesson.step reads it, so it needs no
    window. Both follow from len(cache) and T alone (`key_positions(T)` lists the keys' positions). `slack` more ring
    slots let truncate roll back by up to `slack` positions, as in WindowKVCache.
    """

    def __init__(self, Hkv, d, sinks, window, dtype=np.float64, *, slack=0):
        super().__init__(Hkv, d, dtype)
        self.sinks = validate.integer("sinks", sinks)
        self.window = validate.integer("window", window, minimum=1)
        self.slack = validate.integer("slack", slack)
        self.slots = self.window - 1 + self.slack  # ring slots for positions >= sinks: position p in slot p % slots
        self.sink_k = np.zeros((Hkv, self.sinks, d), self.dtype)  # [Hkv, sinks, d]
        self.sink_v = np.zeros((Hkv, self.sinks, d), self.dtype)
        self.k = np.zeros((Hkv, self.slots, d), self.dtype)  # [Hkv, W - 1 + slack, d], ring order
        self.v = np.zeros((Hkv, self.slots, d), self.dtype)
        self._oldest = 0  # the furthest back truncate may go

    def _held(self, n):
        """-> the positions attended over after n tokens, oldest first: the sinks seen so far, then the last W - 1."""
        return np.concatenate([np.arange(min(n, self.sinks)), np.arange(max(self.sinks, n - self.window + 1), n)])

    def key_positions(self, T):
        """-> int [S]: the positions of the keys that the append of the T newest tokens handed back."""
        T = validate.integer("T", T)
        n = len(self) - T
        if n < 0:
            raise ValueError(f"T={T}: the cache has seen only {len(self)} tokens")
        return np.concatenate([self._held(n), np.arange(n, len(self))])

    def append(self, k_new, v_new):
        """[Hkv, T, d] each -> (K, V) [Hkv, S, d]: held sinks, held recent keys, then the T new ones."""
        k_new, v_new, T = self._check(k_new, v_new)
        n = self._seen
        held = self._held(n)
        ring = held[held >= self.sinks] % max(self.slots, 1)
        n_sinks = int((held < self.sinks).sum())
        K = np.concatenate([self.sink_k[:, :n_sinks], self.k[:, ring], k_new], axis=1)  # [Hkv, S, d]
        V = np.concatenate([self.sink_v[:, :n_sinks], self.v[:, ring], v_new], axis=1)
        # only now, with K and V assembled, may the new block overwrite ring slots
        new = np.arange(n, n + T)
        first = new[new < self.sinks]  # new tokens that are sinks: kept for ever
        self.sink_k[:, first], self.sink_v[:, first] = k_new[:, first - n], v_new[:, first - n]
        later = new[new >= self.sinks]
        recent = later[max(0, later.size - self.slots) :]  # only the last `slots` of them stay in the ring
        if self.slots and recent.size:
            self.k[:, recent % self.slots] = k_new[:, recent - n]
            self.v[:, recent % self.slots] = v_new[:, recent - n]
        self._seen += T
        if self._seen - self.sinks > self.slots:  # the ring has overwritten positions a rollback would need
            self._oldest = max(self._oldest, self._seen - self.slack)
        return K, V

    def mask(self, T):
        """-> bool [T, S] over the keys the append of the T newest tokens handed back: j <= p, and j is a sink or
        inside the window of the query at p."""
        return sink_mask(self.key_positions(T), np.arange(len(self) - T, len(self)), self.sinks, self.window)

    def truncate(self, n):
        self._seen = self._check_truncate(n, self._oldest)

    @property
    def nbytes(self):
        return self.sink_k.nbytes + self.sink_v.nbytes + self.k.nbytes + self.v.nbytes


def sink_mask(key_positions, query_positions, sinks, window):
    """[S] key positions, [T] query positions -> bool [T, S]: j <= p and (j < sinks or j > p - window)."""
    j = np.asarray(key_positions)[None, :]  # [1, S]
    p = np.asarray(query_positions)[:, None]  # [T, 1]
    return (j <= p) & ((j < sinks) | (j > p - window))


class StreamingSinkKVCache(SinkKVCache):
    """Sinks at positions within the cache, as StreamingLLM assigns them.

    In the paper's decode, the cache holds the sinks and the last window - 1 keys, numbered 0, 1, ... in cache
    order, and the new query comes last: a sink s sits sinks + window - 1 - s positions behind the query, however
    far back it lies in the text. Scores under RoPE depend only on that difference. kvlesson.step has rotated the
    query at its text position p, so this cache hands back each sink rotated once more by
    p - (sinks + window - 1), which puts it exactly that far behind. Queries of one chunk sit at different p, so
    each one that needs it gets its own copy of the sinks, and the mask shows each query only its own copy.
    The cache itself stores keys as step hands them (rotated at text positions): memory stays bounded.
    """

    def __init__(self, Hkv, d, sinks, window, rope_base, *, interleaved=False, dtype=np.float64, slack=0):
        super().__init__(Hkv, d, sinks, window, dtype, slack=slack)
        self.rope_base = validate.positive("rope_base", rope_base)
        self.interleaved = bool(interleaved)
        if d % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions, so d must be even; got d={d}")

    def _copies(self, T):
        """For the append of the T newest tokens -> (positions of the keys in the text [S], the queries that read a
        copy of the sinks [m], how far each copy turns [m * n_sinks], which keys are sinks [S])."""
        positions = self.key_positions(T)
        p = np.arange(len(self) - T, len(self))  # [T] query positions
        shift = np.maximum(p - (self.sinks + self.window - 1), 0)  # how far each query moves its sinks
        movers = np.flatnonzero(shift)  # queries whose sinks sit further back in the text than in the cache
        is_sink = positions < self.sinks
        return positions, movers, np.repeat(shift[movers], int(is_sink.sum())), is_sink

    def append(self, k_new, v_new):
        K, V = super().append(k_new, v_new)  # [Hkv, S, d], keys at their text positions
        _, movers, turns, is_sink = self._copies(k_new.shape[1])
        k_sinks = np.tile(K[:, is_sink], (1, movers.size, 1))  # [Hkv, m * n_sinks, d]
        k_copies = apply_rope(k_sinks, turns, self.rope_base, interleaved=self.interleaved)
        v_copies = np.tile(V[:, is_sink], (1, movers.size, 1))
        return np.concatenate([K, k_copies], axis=1), np.concatenate([V, v_copies], axis=1)

    def mask(self, T):
        """-> bool [T, S + copies]: the sink rule over the keys, except that a query that reads a copy of the sinks
        sees its own copy instead of the originals."""
        positions, movers, _, is_sink = self._copies(T)
        n_sinks = int(is_sink.sum())
        mask = sink_mask(positions, np.arange(len(self) - T, len(self)), self.sinks, self.window)  # [T, S]
        mask[movers[:, None], np.flatnonzero(is_sink)[None, :]] = False  # movers read their own copy instead
        own = np.zeros((T, movers.size * n_sinks), bool)  # [T, m * n_sinks]: query movers[c] sees block c
        own[np.repeat(movers, n_sinks), np.arange(movers.size * n_sinks)] = True
        return np.concatenate([mask, own], axis=1)
