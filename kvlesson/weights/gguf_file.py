"""Read a Llama-style GGUF file: its config, its tensors dequantized to float32, and its tokenizer data.

Everything is checked before a single token runs: every metadata key the config needs, every tensor the
forward pass reads, and each tensor's shape against the config. A file of another shape raises
ModelFileError naming what is missing or wrong, rather than failing later inside generate().

GGUF lists each tensor's dimensions innermost first; gguf's reader hands back numpy arrays in the usual
order, so a projection from `in` to `out` features arrives as [out, in], one row per output feature.
"""
import dataclasses
from dataclasses import dataclass

import numpy as np

from kvlesson.configs import Config
from kvlesson.weights.fetch import ModelFileError

# How each architecture pairs the dimensions RoPE rotates. llama.cpp's llama_model_rope_type gives
# LLM_ARCH_LLAMA the "normal" rope, which rotates adjacent pairs (2m, 2m + 1); its converter permutes
# the rows of the Q and K weights so that this matches the half-split pairs of the Hugging Face checkpoint.
_ROPE_INTERLEAVED = {"llama": True}

TOKENIZER_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id")


@dataclass
class ModelFile:
    config: Config
    tensors: dict  # name -> float32 array as stored: [out, in] for matrices, [D] for norms
    tokenizer: dict  # the TOKENIZER_KEYS, as plain Python values
    chat_template: str | None
    types: dict  # name -> the tensor's storage type in the file ("Q4_1", "Q8_0", "F32", ...)


def read(path):
    """GGUF file -> ModelFile, every tensor dequantized to float32 and checked against the config."""
    import gguf
    from gguf.quants import dequantize

    reader = _reader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    config = config_from_metadata(meta)
    missing = [key for key in TOKENIZER_KEYS if key not in meta]
    if missing:
        raise ModelFileError(f"{path} has no tokenizer metadata {missing}")
    stored = {t.name: t for t in reader.tensors}
    check_shapes(config, {name: tuple(int(n) for n in reversed(t.shape)) for name, t in stored.items()}, path)
    tensors, types = {}, {}
    for name, t in stored.items():
        tensors[name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        types[name] = gguf.GGMLQuantizationType(t.tensor_type).name
    tok = {key: _plain(meta[key]) for key in TOKENIZER_KEYS}
    config = dataclasses.replace(config, tied="output.weight" not in stored)  # one table for both ends
    return ModelFile(config, tensors, tok, meta.get("tokenizer.chat_template"), types)


def storage_summary(path):
    """-> [(tensor name, storage type, elements, bytes in the file)], read from the file's index alone."""
    import gguf

    reader = _reader(path)
    return [(t.name, gguf.GGMLQuantizationType(t.tensor_type).name, int(t.n_elements), int(t.n_bytes))
            for t in reader.tensors]


def config_from_metadata(meta):
    """GGUF metadata (key -> value) -> Config, every number read from the file."""
    arch = meta.get("general.architecture")
    if arch not in _ROPE_INTERLEAVED:
        raise ModelFileError(f"architecture {arch!r} is not a Llama-style model this loader knows "
                             f"(known: {sorted(_ROPE_INTERLEAVED)})")

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFileError(f"the file's metadata has no {arch}.{key}")
        return value

    D, H = int(get("embedding_length")), int(get("attention.head_count"))
    d = int(get("attention.key_length", D // H))
    if int(get("rope.dimension_count", d)) != d:
        raise ModelFileError(f"RoPE rotates {get('rope.dimension_count')} of d={d} dims; partial RoPE is not "
                             "supported")
    if "tokenizer.ggml.tokens" not in meta and f"{arch}.vocab_size" not in meta:
        raise ModelFileError(f"the file's metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    vocab = int(meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"]))
    return Config(D=D, n_layers=int(get("block_count")), H=H, Hkv=int(get("attention.head_count_kv")), d=d,
                  hidden=int(get("feed_forward_length")), vocab=vocab, rope_base=float(get("rope.freq_base")),
                  rope_interleaved=_ROPE_INTERLEAVED[arch], norm_eps=float(get("attention.layer_norm_rms_epsilon")),
                  max_len=int(get("context_length")), name=str(meta.get("general.name", arch)))


def expected_shapes(config):
    """name -> shape of every tensor the forward pass reads, as gguf hands it back ([out, in] for a matrix).

    output.weight is optional: a tied model reads the token embedding twice.
    """
    c = config
    shapes = {"token_embd.weight": (c.vocab, c.D), "output_norm.weight": (c.D,)}
    for i in range(c.n_layers):
        b = f"blk.{i}."
        shapes |= {b + "attn_norm.weight": (c.D,), b + "ffn_norm.weight": (c.D,),
                   b + "attn_q.weight": (c.H * c.d, c.D), b + "attn_k.weight": (c.Hkv * c.d, c.D),
                   b + "attn_v.weight": (c.Hkv * c.d, c.D), b + "attn_output.weight": (c.D, c.H * c.d),
                   b + "ffn_gate.weight": (c.hidden, c.D), b + "ffn_up.weight": (c.hidden, c.D),
                   b + "ffn_down.weight": (c.D, c.hidden)}
    return shapes


def check_shapes(config, shapes, where="the file"):
    """Raise ModelFileError naming the first tensor that is missing or has the wrong shape for `config`."""
    want = expected_shapes(config)
    missing = sorted(set(want) - set(shapes))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelFileError(f"{where} lacks tensors the model needs: {', '.join(missing[:3])}{more}")
    if "output.weight" in shapes:
        want["output.weight"] = (config.vocab, config.D)
    for name, shape in want.items():
        if shapes[name] != shape:
            raise ModelFileError(f"{where}: {name} has shape {list(shapes[name])}; the config "
                                 f"(D={config.D}, H={config.H}, Hkv={config.Hkv}, d={config.d}, "
                                 f"hidden={config.hidden}, vocab={config.vocab}) needs {list(shape)}")


def _reader(path):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise ModelFileError(f"{path} is not a GGUF file gguf can read ({e})") from None


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) else v
