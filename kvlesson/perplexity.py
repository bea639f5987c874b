"""Perplexity: how surprised a model is by a text, the ruler for every change to the cache.

For ids x_0 .. x_N, the model predicts each next token from the ones before it. The mean negative log
likelihood is NLL = -(1/N) sum_t log p(x_{t+1} | x_0 .. x_t), and perplexity is exp(NLL): a model that spread
its bets evenly over k tokens at every step would score k. Lower is better.

The text goes through the model in chunks onto one set of caches (chunked prefill), so any cache that follows
the protocol, quantized or windowed, can be measured the same way.
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
