"""Real config.json files, and their cache priced from the raw fields: the reference for the drill's pricing.

A config.json describes the cache in Hugging Face's field names, and three of them hide traps:

    num_hidden_layers     n_layers      every layer keeps its own K and V
    num_attention_heads   H             query heads: never cached
    num_key_value_heads   Hkv           KV heads: what the cache stores
    head_dim              d             set on its own in some configs; only when absent is it hidden_size // H
    sliding_window        W             a window, but on which layers? layer_types says, when the config has it;
    layer_types                         without it the window is on every layer, unless use_sliding_window is false

    num_local_experts     E         a mixture of experts: routed experts per layer, of which each token uses
    num_experts_per_tok   k         k; a step of B tokens reads the union of theirs

`spec(config)` turns the raw dict into a kvlesson.configs.Config, and the prices come from kvlesson.costs.memory, so the
drill has no formula of its own: bytes per token, bytes one sequence holds at a context (a windowed layer holds
min(context, W) positions, the peak of a decode step, as lesson 05 counts it) and the decode floor. The floor also
needs the parameter counts, which no config.json holds: `params(name)` gives them as Params(active, experts).

Every dict below keeps the file's own field names and values; only fields that were checked are copied. Each names
its source, and tests/test_teaching_drill.py checks that the shapes agree with kvlesson.configs.MODELS. CONFIGS are
the ones the lesson prints; HELD_OUT are two more that only the checkers use, so that an answer fitted to the five it
has seen still meets a config it has not: one without head_dim whose head dim is not 128, with a sliding_window its
use_sliding_window switches off, and a second mixture of experts.
"""
import copy
import math
from numbers import Integral, Real
from typing import NamedTuple

import ml_dtypes
import numpy as np

from kvlesson.configs import ACCELERATORS, MODELS, Config
from kvlesson.costs import memory

__all__ = ["CONFIGS", "HELD_OUT", "SOURCES", "config", "spec", "kv_bytes_per_token", "kv_bytes_at",
           "decode_floor_ms", "Params", "params", "price", "Price", "DTYPES"]

_HF = "https://huggingface.co/"

# name -> the config.json fields that were checked, verbatim (JSON true/false/null as Python True/False/None)
CONFIGS = {
    # meta-llama/Llama-3.1-8B config.json, as mirrored in github.com/citsjtu2020/LLM-Prof (sglang/Model_Config.md):
    # no head_dim field, so d = 4096 / 32 = 128.
    "Llama 3.1 8B": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 128256,
    },
    # Qwen/Qwen3-32B config.json, as mirrored in github.com/citsjtu2020/LLM-Prof (sglang/Model_Config.md): head_dim
    # 128 set on its own (5120 / 64 would be 80), and a sliding_window of null with use_sliding_window false.
    "Qwen3-32B": {
        "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 5120, "intermediate_size": 25600,
        "max_position_embeddings": 40960, "max_window_layers": 64, "model_type": "qwen3", "num_attention_heads": 64,
        "num_hidden_layers": 64, "num_key_value_heads": 8, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
    },
    # mistralai/Mistral-7B-v0.1 config.json (the same fields in every copy the search found, e.g. the one quoted in
    # full with that URL as its source): sliding_window 4096 and no layer_types, so every layer is windowed.
    "Mistral 7B v0.1": {
        "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 32000,
    },
    # openai/gpt-oss-120b config.json (raw/main/config.json, quoted in full in a public test suite of the kiln engine):
    # head_dim 64 (2880 / 64 would be 45), sliding_window 128 on the 18 "sliding_attention" entries of layer_types.
    "gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"], "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
        "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "num_local_experts": 128, "rope_theta": 150000, "sliding_window": 128,
        "tie_word_embeddings": False, "vocab_size": 201088,
    },
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json (the fields every copy of it agrees on): the series' own model.
    "SmolLM2-135M": {
        "architectures": ["LlamaForCausalLM"], "head_dim": 64, "hidden_size": 576, "intermediate_size": 1536,
        "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "rope_theta": 100000, "tie_word_embeddings": True, "vocab_size": 49152,
    },
}

HELD_OUT = {
    # Qwen/Qwen2.5-0.5B config.json (as mirrored, quoted in full, in a public model-notes repository): no head_dim
    # field, and 896 / 14 = 64; a sliding_window of 32,768, its whole trained context, which use_sliding_window false
    # switches off, so it matters only past 32,768 tokens (a context RoPE scaling stretches to; lesson 11).
    "Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
    },
    # mistralai/Mixtral-8x7B-v0.1 config.json (the fields every quoted copy the search found agrees on): 8 experts
    # per layer, 2 per token, no head_dim (4096 / 32 = 128) and no window.
    "Mixtral 8x7B v0.1": {
        "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "vocab_size": 32000,
    },
}

SOURCES = {
    "Llama 3.1 8B": _HF + "meta-llama/Llama-3.1-8B/blob/main/config.json",
    "Qwen3-32B": _HF + "Qwen/Qwen3-32B/blob/main/config.json",
    "Mistral 7B v0.1": _HF + "mistralai/Mistral-7B-v0.1/blob/main/config.json",
    "gpt-oss-120b": _HF + "openai/gpt-oss-120b/blob/main/config.json",
    "SmolLM2-135M": _HF + "HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json",
    "Qwen2.5-0.5B": _HF + "Qwen/Qwen2.5-0.5B/blob/main/config.json",
    "Mixtral 8x7B v0.1": _HF + "mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
}


class Params(NamedTuple):
    """The parameter counts a decode floor needs, which a config.json does not hold."""

    active: float  # parameters one token reads: all of them for a dense model; for a mixture of experts, what every
    # token reads plus its k experts (the model card's "active parameters")
    experts: float = 0  # parameters of all routed experts together, every layer (0 for a dense model)


_HELD_OUT_PARAMS = {
    # counted from the config's shapes as kvlesson.configs counts a dense model (Qwen2 has q, k, v biases; tied):
    # 494,032,768, the model card's 0.49B (0.36B without the embedding)
    "Qwen2.5-0.5B": Params(Config(n_layers=24, H=14, Hkv=2, d=64, D=896, hidden=4864, vocab=151936, tied=True,
                                  qkv_bias=True).params),
    # active: "12.9B parameters per token", Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts);
    # experts counted from the config: 32 layers x 8 experts x 3 matrices [4096, 14336] (w1, w2, w3, no biases)
    "Mixtral 8x7B v0.1": Params(12.9e9, 32 * 8 * 3 * 4096 * 14336),
}

# bytes per element -> the numpy dtype kvlesson.costs.memory prices: float32, bfloat16, fp8, packed int4
DTYPES = {4: np.dtype(np.float32), 2: memory.BF16, 1: np.dtype(ml_dtypes.float8_e4m3fn), 0.5: np.dtype(ml_dtypes.int4)}


def config(name):
    """A fresh copy of one published config.json dict (a caller may change it without touching the library)."""
    library = CONFIGS | HELD_OUT
    if name not in library:
        raise ValueError(f"no config named {name!r}; the library has {sorted(library)}")
    return copy.deepcopy(library[name])


def params(name):
    """Params(active, experts) of a library model: kvlesson.configs.MODELS' counts (from the shapes for a dense
    model, the model card's active parameters and the experts counted from the shapes for gpt-oss-120b)."""
    if name in _HELD_OUT_PARAMS:
        return _HELD_OUT_PARAMS[name]
    if name not in MODELS:
        raise ValueError(f"no parameter counts for {name!r}; the library has {sorted(MODELS)}")
    model = MODELS[name]
    if model.experts is None:
        return Params(model.params if model.active_params is None else model.active_params)
    return Params(model.active_params, model.expert_params)


def spec(config, *, params=None, name=""):
    """A config.json dict -> a kvlesson.configs.Config with the fields the cache depends on.

    params: Params(active, experts), or one number for a dense model's parameters; only the decode floor needs it.
    Left out, the weights count as infinite, so a weight count made from this spec is never a wrong finite number:
    the cache's price does not depend on it. A mixture of experts (num_local_experts in the config) needs Params
    whose experts are counted.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a config.json dict; got {type(config).__name__}")
    n_layers = _count(config, "num_hidden_layers")
    H = _count(config, "num_attention_heads")
    Hkv = _count(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else H  # pre-GQA
    if H % Hkv:
        raise ValueError(f"num_attention_heads={H} must be a multiple of num_key_value_heads={Hkv}")
    window, window_layers = _windows(config, n_layers)
    shape = dict(name=name, n_layers=n_layers, H=H, Hkv=Hkv, d=_head_dim(config, H), window=window,
                 window_layers=window_layers)
    if params is None:
        return Config(**shape, total_params=math.inf)
    active, experts = _params(params)
    if "num_local_experts" not in config:
        if experts:
            raise ValueError(f"params has {experts:g} expert parameters, but the config has no num_local_experts")
        return Config(**shape, total_params=active)
    if not experts:
        raise ValueError("a mixture of experts (num_local_experts in the config) needs Params(active, experts) with "
                         "its experts' parameters counted")
    E, k = _count(config, "num_local_experts"), _count(config, "num_experts_per_tok")
    held = active + experts * (E - k) / E  # every weight a step can read (the token table's unread rows left out)
    return Config(**shape, total_params=held, active_params=active, experts=E, experts_per_token=k,
                  expert_params=experts)


def kv_bytes_per_token(config, bytes_per_element=2):
    """Bytes one token adds to the cache while every layer still grows: 2 x n_layers x Hkv x d x bytes."""
    return memory.kv_bytes_per_token(spec(config), _dtype(bytes_per_element))


def kv_bytes_at(config, context, bytes_per_element=2):
    """Bytes one sequence holds after `context` tokens; a windowed layer holds min(context, W) positions."""
    return memory.kv_bytes_per_sequence(spec(config), context, _dtype(bytes_per_element))


def decode_floor_ms(config, params, accel, context, batch=1):
    """Milliseconds per decode step at best, weights and cache in bf16: (weight bytes + KV bytes) / bandwidth.

    params: Params(active, experts), as params(name) gives them. A mixture of experts reads what every token reads
    and, in each layer, the experts at least one of the batch's tokens routes to: E (1 - (1 - k/E)^batch) of them
    under uniform routing (kvlesson.costs.memory.experts_read). accel: a kvlesson.configs.Accelerator.
    """
    return memory.decode_floor(spec(config, params=params), accel, context, batch) * 1e3


class Price(NamedTuple):
    """One model's cache in bf16 at a context, and the decode floor of a batch of such sequences."""

    bytes_per_token: float
    bytes_at_context: float
    floor_ms: float


def price(name, context, accelerator="H100 SXM", batch=1):
    """A library model's cache in bf16 -> Price(bytes per token, bytes of one sequence at `context`, decode floor ms
    for `batch` such sequences on `accelerator`, a key of kvlesson.configs.ACCELERATORS)."""
    raw = config(name)
    return Price(kv_bytes_per_token(raw), kv_bytes_at(raw, context),
                 decode_floor_ms(raw, params(name), ACCELERATORS[accelerator], context, batch))


def _params(given):
    """Params, or one number for a dense model -> (active, experts), each checked."""
    active, experts = given if isinstance(given, tuple) else (given, 0)
    for field, n, low in (("active", active, 0), ("experts", experts, -1)):
        if isinstance(n, bool) or not isinstance(n, Real) or not n > low or not math.isfinite(n):
            raise ValueError(f"params.{field} must be a {'positive' if low == 0 else 'non-negative'} number of "
                             f"parameters; got params={given!r}")
    return active, experts


def _count(config, field):
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"config[{field!r}] must be a positive integer; got {value!r}")
    return int(value)


def _head_dim(config, H):
    """head_dim when the config sets it; else hidden_size // H, which must divide evenly."""
    if config.get("head_dim") is not None:
        return _count(config, "head_dim")
    D = _count(config, "hidden_size")
    if D % H:
        raise ValueError(f"no head_dim, and hidden_size={D} is not a multiple of num_attention_heads={H}")
    return D // H


def _windows(config, n_layers):
    """-> (window, windowed layers): (None, 0) when no layer is windowed."""
    W, types = config.get("sliding_window"), config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(f"layer_types must list one type per layer ({n_layers}); got {types!r:.80}")
        unknown = set(types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise ValueError(f"layer_types holds types this drill does not price: {sorted(unknown)}")
        windowed = types.count("sliding_attention")
        if windowed and W is None:
            raise ValueError("layer_types names sliding_attention layers but sliding_window is null")
        return (_count(config, "sliding_window"), windowed) if windowed else (None, 0)
    if W is None or config.get("use_sliding_window") is False:
        return None, 0
    if config.get("use_sliding_window") is True and "max_window_layers" in config:
        raise ValueError("use_sliding_window with max_window_layers (Qwen2's rule) is not priced by this drill")
    return _count(config, "sliding_window"), n_layers  # Mistral's convention: the window is on every layer


def _dtype(bytes_per_element):
    for size, dtype in DTYPES.items():
        if not isinstance(bytes_per_element, bool) and bytes_per_element == size:
            return dtype
    raise ValueError(f"bytes_per_element must be one of {sorted(DTYPES)} (fp32, bf16, fp8, int4); got "
                     f"{bytes_per_element!r}")
