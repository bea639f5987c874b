"""One Llama-style transformer, two sizes: a tiny random one for the lessons, SmolLM2-135M for the capstone.

The forward pass is the whole model: per layer, RMSNorm, attention over a cache with GQA and RoPE, a residual,
RMSNorm, a SwiGLU feed-forward, a residual. `block` is that layer body, written once for every way the model runs:
  - one sequence on a cache per layer (lesson 03's caches), attention by kvlesson.layer.attend, step's second half;
  - the same with fused weights (kvlesson.weights.layout.fuse): Q, K and V come from one product, gate and up from
    another, and nothing else changes;
  - a batch of sequences on one paged pool (kvlesson.serving.forward), each bringing any number of new tokens: the
    caches are views of the pool and `attend` is the batch's own, which reads each sequence's pages;
  - one shard of the heads on each of several processes (kvlesson.parallel): the weights are a view of each rank's
    heads, and `reduce` sums the partial products of attention's output and the feed-forward's down projection
    across the ranks (an all-reduce) before each is added to the residual.
A forward pass is all or nothing: if it is cut short (Ctrl-C, an error), every cache is put back as it was.
Weights are a dict keyed by the GGUF tensor names (blk.0.attn_q.weight, ...), each matrix stored [in, out] so every
projection is x @ W.
"""
import dataclasses
from collections.abc import Callable, Sequence, Sized

import numpy as np
from numpy.typing import ArrayLike

from kvlesson import atomic, validate
from kvlesson.cache import Cache, CacheLike, KVCache, StaticKVCache, checkpoint
from kvlesson.configs import Config
from kvlesson.layer import attend, project
from kvlesson.sample import GREEDY, Sampling, sample, seeded

Reduce = Callable[[np.ndarray], np.ndarray]  # [T, D] this process's partial sum -> [T, D] the sum over all of them
Attend = Callable[..., np.ndarray]  # (q, k, v, cache, rope_base=, interleaved=) -> [T, H*d], as layer.attend


def forward(cfg: Config, w: dict, ids: ArrayLike, caches: list, *, attend: Attend = attend,
            rows: np.ndarray | None = None, reduce: Reduce | None = None) -> np.ndarray:
    """[T] token ids -> [T, vocab] logits, appending the T new tokens to `caches` (one per layer).

    attend(q, k, v, cache, rope_base=, interleaved=) -> [T, H*d] is how attention reads a cache: kvlesson.layer.attend
    (the default) for one sequence, kvlesson.serving.forward.attend for a batch on a paged pool. rows: only these rows'
    logits (a batch wants each sequence's last), so the [T, vocab] product is never made for the rest. reduce: how a
    layer's two output products are summed over the processes that each hold some of its heads (None: one process).
    """
    x = w["token_embd.weight"][_checked(cfg, ids, caches)]  # [T, D]
    with atomic.undo_on_error(*map(checkpoint, caches)):
        for i, cache in enumerate(caches):
            x = block(cfg, w, i, x, cache, attend, reduce)
    x = rms_norm(x if rows is None else x[rows], w["output_norm.weight"], cfg.norm_eps)
    return x @ w["output.weight"]  # [T, vocab]; tied models share token_embd, transposed


def block(cfg: Config, w: dict, i: int, x: np.ndarray, cache: CacheLike, attend: Attend = attend,
          reduce: Reduce | None = None) -> np.ndarray:
    """[T, D] -> [T, D]: layer i. Attention over the cache, then the feed-forward, each added to the residual."""
    b = f"blk.{i}."
    summed = reduce or (lambda partial: partial)
    h = rms_norm(x, w[b + "attn_norm.weight"], cfg.norm_eps)
    q, k, v = qkv(cfg, w, b, h)  # [H, T, d], [Hkv, T, d], [Hkv, T, d]: the new tokens only
    a = attend(q, k, v, cache, rope_base=cfg.rope_base, interleaved=cfg.rope_interleaved)  # [T, H*d]
    x = x + summed(a @ w[b + "attn_output.weight"])
    h = rms_norm(x, w[b + "ffn_norm.weight"], cfg.norm_eps)
    return x + summed(swiglu(w, b, h) @ w[b + "ffn_down.weight"])


def _checked(cfg, ids, caches):
    """-> int64 [T] ids, each in [0, vocab), after checking there is one cache per layer and that the caches agree
    on how many positions they hold (a pass cut short by something kvlesson could not undo leaves them disagreeing)."""
    if not isinstance(caches, (list, tuple)) or len(caches) != cfg.n_layers:
        of = f" of {len(caches)}" if isinstance(caches, (list, tuple)) else ""
        raise TypeError(f"caches must be a list of {cfg.n_layers} caches, one per layer (new_cache(cfg)); got "
                        f"{type(caches).__name__}{of}")
    held = [len(c) for c in caches if isinstance(c, Sized)]  # a paged step's layer views hold many sequences
    if len(set(held)) > 1:
        raise ValueError(f"the layer caches disagree on how many positions they hold: {held}; make new ones")
    return validate.token_ids("ids", ids, cfg.vocab)  # a negative id would read the token table from its end


def qkv(cfg: Config, w: dict, b: str, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, D] normed -> q [H, T, d], k and v [Hkv, T, d]: step's projections, or one product when the layer's weights
    are fused ([Wq | Wk | Wv] side by side, kvlesson.weights.layout.fuse)."""
    fused = w.get(b + "attn_qkv.weight")
    if fused is None:
        return project(h, w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"], cfg.H, cfg.Hkv)
    H, Hkv = cfg.H, cfg.Hkv
    heads = (h @ fused).reshape(h.shape[0], H + 2 * Hkv, cfg.d).transpose(1, 0, 2)  # [H + 2 Hkv, T, d]
    return heads[:H], heads[H : H + Hkv], heads[H + Hkv :]


def swiglu(w: dict, b: str, h: np.ndarray) -> np.ndarray:
    """[T, D] normed -> [T, hidden]: silu(h Wgate) * (h Wup), from one product when gate and up are fused."""
    fused = w.get(b + "ffn_gate_up.weight")
    if fused is None:
        return silu(h @ w[b + "ffn_gate.weight"]) * (h @ w[b + "ffn_up.weight"])
    gu = h @ fused  # [T, 2 hidden]
    hidden = gu.shape[1] // 2
    return silu(gu[:, :hidden]) * gu[:, hidden:]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """[T, D], [D] -> [T, D]: scale each row to unit root-mean-square, then by w."""
    # sum / D is what np.mean computes, bit for bit, without its Python-level wrapper (61 calls per decode step)
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) / x.shape[-1] + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def with_max_len(cfg: Config, max_len: int) -> Config:
    """The same config with another context length (how many positions a StaticKVCache preallocates)."""
    return dataclasses.replace(cfg, max_len=max_len)


def new_cache(cfg: Config, dtype: np.dtype = np.float32, static: bool = True) -> list[Cache]:
    """One cache per layer. The model's position lives in the caches: len(caches[0])."""
    if static:
        return [StaticKVCache(cfg.Hkv, cfg.d, cfg.max_len, dtype) for _ in range(cfg.n_layers)]
    return [KVCache(cfg.Hkv, cfg.d, dtype) for _ in range(cfg.n_layers)]


def generate(cfg: Config, w: dict, ids: Sequence[int], max_new_tokens: int, use_cache: bool = True,
             dtype: np.dtype = np.float32,
             sampling: Sampling = GREEDY) -> list[int]:
    """Decoding, greedy unless `sampling` says otherwise (kvlesson.sample). Returns the new token ids only.

    With the cache, the prompt is prefilled once and each step feeds one token, on caches sized to what the request
    can reach: caches for the model's whole context would make every call allocate, and fault in, far more memory
    than it uses (lesson 14's clock once measured that instead of speculation). Without it, each step re-runs the
    whole sequence through fresh caches (recompute). A sampling without a seed gets a fresh one (sample.seeded).
    """
    ids = [int(i) for i in ids]
    sampling = seeded(sampling)
    out = []
    caches = new_cache(with_max_len(cfg, len(ids) + max_new_tokens), dtype)
    logits = forward(cfg, w, ids, caches)  # prefill
    for _ in range(max_new_tokens):
        out.append(sample(logits[-1], sampling, position=len(out), history=ids + out))
        if len(out) == max_new_tokens:
            break
        if use_cache:
            logits = forward(cfg, w, [out[-1]], caches)
        else:
            logits = forward(cfg, w, ids + out, new_cache(with_max_len(cfg, len(ids) + len(out)), dtype))
    return out


def tiny_config(**overrides) -> Config:
    """A small model for the lessons: same architecture, a few layers, a toy vocabulary."""
    base = dict(name="tiny", D=64, n_layers=4, H=4, Hkv=2, d=16, hidden=172, vocab=256, max_len=1024)
    return Config(**{**base, **overrides})


def random_weights(cfg: Config, seed: int = 0, dtype: np.dtype = np.float32) -> dict[str, np.ndarray]:
    """Seeded random weights under the GGUF names, scaled so activations stay near unit size."""
    rng = np.random.default_rng(seed)

    def mat(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)

    w = {"token_embd.weight": rng.standard_normal((cfg.vocab, cfg.D)).astype(dtype),
         "output_norm.weight": np.ones(cfg.D, dtype)}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = np.ones(cfg.D, dtype)
        w[b + "ffn_norm.weight"] = np.ones(cfg.D, dtype)
        w[b + "attn_q.weight"] = mat(cfg.D, cfg.H * cfg.d)
        w[b + "attn_k.weight"] = mat(cfg.D, cfg.Hkv * cfg.d)
        w[b + "attn_v.weight"] = mat(cfg.D, cfg.Hkv * cfg.d)
        w[b + "attn_output.weight"] = mat(cfg.H * cfg.d, cfg.D)
        w[b + "ffn_gate.weight"] = mat(cfg.D, cfg.hidden)
        w[b + "ffn_up.weight"] = mat(cfg.D, cfg.hidden)
        w[b + "ffn_down.weight"] = mat(cfg.hidden, cfg.D)
    # untied here: a tied random model mostly echoes its last token, which would hide cache bugs
    w["output.weight"] = mat(cfg.D, cfg.vocab) * 4
    return w
