"""Perplexity: how surprised a model is by a text, the ruler for every change to the cache.

For ids x_0 .. x_N, the model predicts each next token from the ones before it. The mean negative log
likelihood is NLL = -(1/N) sum_t log p(x_{t+1} | x_0 .. x_t), and perplexity is exp(NLL): a model that spread
its bets evenly over k tokens at every step would score k. Lower is better.

The text goes through the model in chunks onto one set of caches (chunked prefill), so any cache that follows
the protocol, quantized or windowed, can be measured the same way.

One stretch of text is one sample. A change to the cache that costs 2% on one window can cost 10% on the next, so
`windows` cuts the text into several evenly spaced windows, `window_nll` runs each on fresh caches, and a change is
judged by its spread over the windows, not by one number.
"""
import math

import numpy as np

from kvlesson import validate


def token_nll(model, ids, caches=None, chunk=256):
    """-> float64 [len(ids) - 1]: -log p(ids[t + 1] | ids[:t + 1]) for every t, in nats.

    caches: one cache per layer, empty (default: model.new_cache(capacity=len(ids))).
    """
    ids = list(ids)
    chunk = validate.integer("chunk", chunk, minimum=1)
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens to predict one; got {len(ids)}")
    caches = model.new_cache(capacity=len(ids)) if caches is None else caches
    nll = []
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start : min(start + chunk, len(ids) - 1)]  # the last token is only ever a target
        logits = model.forward(piece, caches).astype(np.float64)  # [T, vocab]
        top = logits.max(axis=-1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))  # log-sum-exp, [T]
        targets = np.asarray(ids[start + 1 : start + 1 + len(piece)])
        nll.append(log_z - logits[np.arange(len(piece)), targets])
    return np.concatenate(nll)


def perplexity(model, ids, caches=None, chunk=256):
    """-> exp(mean NLL) of the model over ids (see token_nll)."""
    return math.exp(token_nll(model, ids, caches, chunk).mean())


def windows(ids, n, length):
    """-> n lists of length + 1 ids (length predictions each), evenly spaced over ids: the first starts at the first
    token, the last ends at the last one. They overlap only when the text is shorter than n * (length + 1)."""
    ids = list(ids)
    n, length = validate.integer("n", n, minimum=1), validate.integer("length", length, minimum=1)
    if len(ids) < length + 1:
        raise ValueError(f"a window of length={length} predictions needs {length + 1} ids; the text has {len(ids)}")
    starts = np.linspace(0, len(ids) - length - 1, n).round().astype(int)  # [n]
    return [ids[s : s + length + 1] for s in starts]


def window_nll(model, windows, new_caches, chunk=256):
    """-> float64 [n, length]: token_nll of each window, each read through fresh caches from new_caches(capacity).

    new_caches(capacity) -> one empty cache per layer that can hold `capacity` positions (the caller picks the
    kind: quantized, windowed, the model's own)."""
    if not windows or len({len(w) for w in windows}) != 1:
        raise ValueError(f"need one or more windows of equal length; got lengths {[len(w) for w in windows]}")
    return np.stack([token_nll(model, w, new_caches(len(w) - 1), chunk) for w in windows])
