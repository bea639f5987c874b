"""Multi-head latent attention (MLA, DeepSeek-V2 arXiv 2405.04434, DeepSeek-V3 arXiv 2412.19437), small, in numpy.

Per token, the cache holds one latent vector c [r] and one RoPE key k_rope [dr], both shared by all H heads:

    c = x @ W_dkv                      [T, r]     r = kv_lora_rank
    k_rope = rope(x @ W_kr)            [T, dr]    dr = qk_rope_head_dim
    head h:  k_h = [c @ W_uk_h, k_rope]           dn + dr    (dn = qk_nope_head_dim)
             v_h = c @ W_uv_h                     dv         (dv = v_head_dim)

naive     expand every head's K and V from the cached latents, then attend as usual;
absorbed  never expand: q_h . (c W_uk_h) = (q_h W_uk_h^T) . c, so W_uk_h folds into the query projection, and
          p (c W_uv_h) W_o_h = (p c)(W_uv_h W_o_h), so W_uv_h folds into the output projection.
The RoPE part cannot fold: rotating c W_uk_h by the key's position would put a matrix that depends on both
positions between q_h and c. So position rides on the one small key shared by every head.
DeepSeek also compresses the query through a rank-1536 latent and normalises c; neither touches the cache, so
this small layer leaves them out.
"""
import math
from dataclasses import dataclass

import numpy as np

from kvlesson import validate
from kvlesson.rope import apply_rope
from kvlesson.sdpa import causal_mask, weighted_values

# DeepSeek-V3, config.json at huggingface.co/deepseek-ai/DeepSeek-V3 (the same figures are in the repository's
# inference/configs/config_671B.json). Only the fields the cache depends on.
DEEPSEEK_V3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def bytes_per_token(config, bytes_per_element=2):
    """A config.json dict of an MLA model -> cache bytes one token adds: layers x (kv_lora_rank + qk_rope_head_dim).

    One latent and one RoPE key per token and layer, shared by every head; no factor 2, there is no separate V.
    bytes_per_element may be fractional: 0.5 for 4-bit codes, 34 / 32 for int8 with one 16-bit scale per 32.
    """
    layers, r, dr = _fields(config, "num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim")
    return _whole(layers * (r + dr) * _element(bytes_per_element))


def mha_bytes_per_token(config, bytes_per_element=2, kv_heads=None):
    """The same model if it cached every head's K (dn + dr) and V (dv): kv_heads of them (default: all heads)."""
    layers, H, dn, dr, dv = _fields(config, "num_hidden_layers", "num_attention_heads", "qk_nope_head_dim",
                                    "qk_rope_head_dim", "v_head_dim")
    heads = H if kv_heads is None else validate.integer("kv_heads", kv_heads, minimum=1)
    return _whole(layers * heads * (dn + dr + dv) * _element(bytes_per_element))


def decode_flops(config, S):
    """-> {"expand": ..., "absorbed": ...}: the FLOPs (2 per multiply-add) one decode step spends in one layer's
    attention over S cached tokens, from the latents on (the query and output projections, the same in both, left
    out).

    expand    re-expand every cached latent into 128 heads' K and V (S x r x H x (dn + dv)), then attend (S x H x
              (dn + dr) for scores, S x H x dv for outputs);
    absorbed  multi-query attention with one KV head of width r + dr: scores S x H x (r + dr), outputs S x H x r, plus
              folding the new query into latent space and the output back (H x dn x r and H x r x dv, once a step).
    """
    H, r, dn, dr, dv = _fields(config, "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                               "v_head_dim")
    S = validate.integer("S", S)
    expand = S * r * H * (dn + dv) + S * H * (dn + dr) + S * H * dv
    absorbed = S * H * (r + dr) + S * H * r + H * dn * r + H * r * dv
    return {"expand": 2 * expand, "absorbed": 2 * absorbed}


def _fields(config, *names):
    """-> the named config.json fields as ints; a missing or non-integer one is named in the error."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a config.json dict; got {type(config).__name__}")
    missing = [n for n in names if n not in config]
    if missing:
        raise ValueError(f"config has no {', '.join(missing)}: is it an MLA model's config.json?")
    return [validate.integer(f"config[{n!r}]", config[n]) for n in names]


def _element(b):
    """-> float: the bytes of one cached number, a finite number above 0 (a fraction for packed codes)."""
    return validate.positive("bytes_per_element", b)


def _whole(x):
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class MLAConfig:
    D: int  # model width
    H: int  # query heads
    r: int  # kv_lora_rank: width of the cached latent
    dn: int  # qk_nope_head_dim: per-head query/key width that carries no position
    dr: int  # qk_rope_head_dim: width of the shared RoPE key (0: no RoPE part at all)
    dv: int  # v_head_dim
    rope_base: float = 10000.0

    def __post_init__(self):
        for name in ("D", "H", "r", "dn", "dv"):
            validate.integer(name, getattr(self, name), minimum=1)
        validate.integer("dr", self.dr)
        validate.positive("rope_base", self.rope_base)
        if self.dr % 2:
            raise ValueError(f"RoPE rotates pairs, so dr must be even; got dr={self.dr}")


def random_weights(cfg, seed=0, dtype=np.float64):
    """Seeded weights for one MLA layer, each [in, out], scaled so activations stay near unit size."""
    rng = np.random.default_rng(seed)

    def mat(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)).astype(dtype)

    H = cfg.H
    return {"Wq": mat(cfg.D, H * cfg.dn), "Wq_rope": mat(cfg.D, H * cfg.dr), "W_dkv": mat(cfg.D, cfg.r),
            "W_kr": mat(cfg.D, cfg.dr), "W_uk": mat(cfg.r, H * cfg.dn), "W_uv": mat(cfg.r, H * cfg.dv),
            "Wo": mat(H * cfg.dv, cfg.D)}


def absorb(w, cfg):
    """Naive weights -> absorbed: Wq_lat_h = Wq_h @ W_uk_h^T [D, r] and Wo_lat_h = W_uv_h @ Wo_h [r, D], per head.

    Done once, offline. (Engines may keep the factors apart when r > dn, to save FLOPs; the algebra is the same.)
    """
    H, D, r = cfg.H, cfg.D, cfg.r
    Wq = w["Wq"].reshape(D, H, cfg.dn)  # [D, H, dn]
    W_uk = w["W_uk"].reshape(r, H, cfg.dn)  # [r, H, dn]
    W_uv = w["W_uv"].reshape(r, H, cfg.dv)  # [r, H, dv]
    Wo = w["Wo"].reshape(H, cfg.dv, D)  # [H, dv, D]
    return {"Wq_lat": np.einsum("dhn,rhn->dhr", Wq, W_uk).reshape(D, H * r),
            "Wo_lat": np.einsum("rhv,hvd->hrd", W_uv, Wo).reshape(H * r, D),
            "Wq_rope": w["Wq_rope"], "W_dkv": w["W_dkv"], "W_kr": w["W_kr"]}


class LatentCache:
    """What an MLA layer caches: latents c [S, r] and RoPE keys k_rope [S, dr], grown by concatenation."""

    def __init__(self, r, dr, dtype=np.float64):
        self.r, self.dr = validate.integer("r", r, minimum=1), validate.integer("dr", dr)
        self.c = np.zeros((0, r), dtype)  # [S, r]
        self.k_rope = np.zeros((0, dr), dtype)  # [S, dr]

    def __len__(self):
        return self.c.shape[0]

    def append(self, c_new, kr_new):
        """[T, r], [T, dr] -> (c [S, r], k_rope [S, dr]), every token so far, oldest first."""
        c_new, kr_new = validate.floats("c_new", c_new), validate.floats("kr_new", kr_new)
        T = c_new.shape[0] if c_new.ndim == 2 else -1
        if c_new.shape != (T, self.r) or kr_new.shape != (T, self.dr):
            raise ValueError(f"need c_new [T, r={self.r}] and kr_new [T, dr={self.dr}]; got {c_new.shape}, "
                             f"{kr_new.shape}")
        validate.same_dtype(c_new=c_new, kr_new=kr_new, cache=self.c)
        self.c = np.concatenate([self.c, c_new])
        self.k_rope = np.concatenate([self.k_rope, kr_new])
        return self.c, self.k_rope

    @property
    def nbytes(self):
        return self.c.nbytes + self.k_rope.nbytes


def _shapes(cfg, absorbed):
    """The [in, out] shape of every weight a layer needs, naive or absorbed."""
    H, D, r = cfg.H, cfg.D, cfg.r
    shared = {"Wq_rope": (D, H * cfg.dr), "W_dkv": (D, r), "W_kr": (D, cfg.dr)}
    if absorbed:
        return {**shared, "Wq_lat": (D, H * r), "Wo_lat": (H * r, D)}
    return {**shared, "Wq": (D, H * cfg.dn), "W_uk": (r, H * cfg.dn), "W_uv": (r, H * cfg.dv), "Wo": (H * cfg.dv, D)}


def _check(x, w, cfg, cache, absorbed):
    """Every argument checked before the cache moves."""
    if not isinstance(cfg, MLAConfig):
        raise TypeError(f"cfg must be an MLAConfig; got {type(cfg).__name__}")
    x = validate.floats("x", x)
    if x.ndim != 2 or x.shape[1] != cfg.D:
        raise ValueError(f"x must be [T, D={cfg.D}]; got {x.shape}")
    for name, shape in _shapes(cfg, absorbed).items():
        if name not in w:
            raise ValueError(f"the weights have no {name!r}" + (" (absorbed weights come from absorb(w, cfg))"
                                                                 if absorbed else ""))
        W = validate.floats(name, w[name])
        if W.shape != shape:
            raise ValueError(f"{name} must be {list(shape)} for this MLAConfig; got {W.shape}")
        validate.same_dtype(x=x, **{name: W})
    if not isinstance(cache, LatentCache) or (cache.r, cache.dr) != (cfg.r, cfg.dr):
        raise ValueError(f"cache must be a LatentCache(r={cfg.r}, dr={cfg.dr})")
    if cache.c.dtype != x.dtype:
        raise ValueError(f"the cache holds {cache.c.dtype} but x is {x.dtype} (cast explicitly)")
    return x


def _latent_and_rope(x, w, cfg, cache):
    """Project the new tokens to a latent and a shared RoPE key and cache both; -> (q_rope [H, T, dr], C, KR)."""
    T = x.shape[0]
    positions = np.arange(len(cache), len(cache) + T)  # absolute
    q_rope = (x @ w["Wq_rope"]).reshape(T, cfg.H, cfg.dr).transpose(1, 0, 2)  # [H, T, dr]
    k_rope = x @ w["W_kr"]  # [T, dr], one for all heads
    if cfg.dr:
        q_rope = apply_rope(q_rope, positions, cfg.rope_base)
        k_rope = apply_rope(k_rope, positions, cfg.rope_base)
    C, KR = cache.append(x @ w["W_dkv"], k_rope)  # [S, r], [S, dr]
    return q_rope, C, KR


def _attend(scores, values):
    """[H, T, S] scores, values [H, S, dv] (or [S, r], shared by every head) -> [H, T, dv]: the causal softmax of
    the scores, query i at position S - T + i, weighting the values. A later token's latent, even NaN or inf, never
    reaches an earlier query (kvlesson.sdpa.weighted_values)."""
    T, S = scores.shape[-2:]
    if T == 0:
        return scores @ values  # no queries: nothing to normalise (and an empty max has no value)
    mask = causal_mask(T, S)  # [T, S]; every row sees its own key
    s = np.where(mask, scores, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return weighted_values(p / p.sum(axis=-1, keepdims=True), values, mask)


def naive(x, w, cfg, cache):
    """[T, D] -> [T, D]: expand each head's K [S, dn + dr] and V [S, dv] from the cached latents, then attend."""
    x = _check(x, w, cfg, cache, absorbed=False)
    q_rope, C, KR = _latent_and_rope(x, w, cfg, cache)
    T, S, H = x.shape[0], C.shape[0], cfg.H
    q = (x @ w["Wq"]).reshape(T, H, cfg.dn).transpose(1, 0, 2)  # [H, T, dn]
    k = (C @ w["W_uk"]).reshape(S, H, cfg.dn).transpose(1, 0, 2)  # [H, S, dn]: expanded, S x H x dn numbers
    v = (C @ w["W_uv"]).reshape(S, H, cfg.dv).transpose(1, 0, 2)  # [H, S, dv]
    scores = q @ k.transpose(0, 2, 1) + q_rope @ KR.T  # [H, T, S]: the two parts of [q, q_rope] . [k, k_rope]
    out = _attend(scores * (1 / math.sqrt(cfg.dn + cfg.dr)), v)  # [H, T, dv]
    return out.transpose(1, 0, 2).reshape(T, H * cfg.dv) @ w["Wo"]


def absorbed(x, wa, cfg, cache):
    """[T, D] -> [T, D] with absorbed weights (see absorb): scores and outputs straight from the latents."""
    x = _check(x, wa, cfg, cache, absorbed=True)
    q_rope, C, KR = _latent_and_rope(x, wa, cfg, cache)
    T, H = x.shape[0], cfg.H
    q_lat = (x @ wa["Wq_lat"]).reshape(T, H, cfg.r).transpose(1, 0, 2)  # [H, T, r]: a query in latent space
    scores = q_lat @ C.T + q_rope @ KR.T  # [H, T, S]
    o_lat = _attend(scores * (1 / math.sqrt(cfg.dn + cfg.dr)), C)  # [H, T, r]: weighted latents per head
    return o_lat.transpose(1, 0, 2).reshape(T, H * cfg.r) @ wa["Wo_lat"]
