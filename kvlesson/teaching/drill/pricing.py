"""Real config.json files, and their cache priced from the raw fields: the reference for the drill's pricing.

A config.json describes the cache in Hugging Face's field names, and three of them hide traps:

    num_hidden_layers     n_layers      every layer keeps its own K and V
    num_attention_heads   H             query heads: never cached
    num_key_value_heads   Hkv           KV heads: what the cache stores
    head_dim              d             set on its own in some configs; only when absent is it hidden_size // H
    sliding_window        W             a window, but on which layers? layer_types says, when the config has it;
    layer_types                         without it the window is on every layer, unless use_sliding_window is false

`spec(config)` turns the raw dict into a kvlesson.configs.Config, and the prices come from kvlesson.costs.memory, so the
drill has no formula of its own: bytes per token, bytes one sequence holds at a context (a windowed layer holds
min(context, W) positions, the peak of a decode step, as lesson 05 counts it) and the decode floor.

Every dict below keeps the file's own field names and values; only fields that were checked are copied. Each names
its source, and tests/test_drill.py checks that the shapes agree with kvlesson.configs.MODELS.
"""
import copy
import math
from numbers import Integral, Real
from typing import NamedTuple

import ml_dtypes
import numpy as np

from kvlesson.configs import ACCELERATORS, MODELS, Config
from kvlesson.costs import memory

__all__ = ["CONFIGS", "SOURCES", "config", "spec", "kv_bytes_per_token", "kv_bytes_at", "decode_floor_ms",
           "active_params", "price", "Price", "DTYPES"]

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

SOURCES = {
    "Llama 3.1 8B": _HF + "meta-llama/Llama-3.1-8B/blob/main/config.json",
    "Qwen3-32B": _HF + "Qwen/Qwen3-32B/blob/main/config.json",
    "Mistral 7B v0.1": _HF + "mistralai/Mistral-7B-v0.1/blob/main/config.json",
    "gpt-oss-120b": _HF + "openai/gpt-oss-120b/blob/main/config.json",
    "SmolLM2-135M": _HF + "HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json",
}

# bytes per element -> the numpy dtype kvlesson.costs.memory prices: float32, bfloat16, fp8, packed int4
DTYPES = {4: np.dtype(np.float32), 2: memory.BF16, 1: np.dtype(ml_dtypes.float8_e4m3fn), 0.5: np.dtype(ml_dtypes.int4)}


def config(name):
    """A fresh copy of one published config.json dict (a caller may change it without touching the library)."""
    if name not in CONFIGS:
        raise ValueError(f"no config named {name!r}; the library has {sorted(CONFIGS)}")
    return copy.deepcopy(CONFIGS[name])


def active_params(name):
    """Parameters one token reads, from kvlesson.configs.MODELS (counted from shapes, or the model card for MoE)."""
    model = MODELS[name]
    return model.active_params if model.active_params is not None else model.params


def spec(config, *, params=None, name=""):
    """A config.json dict -> a kvlesson.configs.Config with the fields the cache depends on.

    params: the parameters one decode step reads (all of them for a dense model, the active ones for a mixture of
    experts); only the decode floor needs it. Left out, it is infinite, so a weight count made from this spec is
    never a wrong finite number: the cache's price does not depend on it.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a config.json dict; got {type(config).__name__}")
    n_layers = _count(config, "num_hidden_layers")
    H = _count(config, "num_attention_heads")
    Hkv = _count(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else H  # pre-GQA
    if H % Hkv:
        raise ValueError(f"num_attention_heads={H} must be a multiple of num_key_value_heads={Hkv}")
    window, window_layers = _windows(config, n_layers)
    if params is None:
        params = math.inf
    elif isinstance(params, bool) or not isinstance(params, Real) or not params > 0:
        raise ValueError(f"params must be a positive number of parameters; got params={params!r}")
    return Config(name=name, n_layers=n_layers, H=H, Hkv=Hkv, d=_head_dim(config, H), window=window,
                  window_layers=window_layers, total_params=params)


def kv_bytes_per_token(config, bytes_per_element=2):
    """Bytes one token adds to the cache while every layer still grows: 2 x n_layers x Hkv x d x bytes."""
    return memory.kv_bytes_per_token(spec(config), _dtype(bytes_per_element))


def kv_bytes_at(config, context, bytes_per_element=2):
    """Bytes one sequence holds after `context` tokens; a windowed layer holds min(context, W) positions."""
    return memory.kv_bytes_per_sequence(spec(config), context, _dtype(bytes_per_element))


def decode_floor_ms(config, active_params, accel, context, batch=1):
    """Milliseconds per decode step at best, weights and cache in bf16: (weight bytes + KV bytes) / bandwidth.

    active_params: the parameters one token reads (a mixture of experts reads only its routed experts).
    accel: a kvlesson.configs.Accelerator, e.g. ACCELERATORS["H100 SXM"].
    """
    return memory.decode_floor(spec(config, params=active_params), accel, context, batch) * 1e3


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
                 decode_floor_ms(raw, active_params(name), ACCELERATORS[accelerator], context, batch))


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
