"""Read a Llama-style GGUF file: its config, its tensors dequantized to float32, and its tokenizer data.

Everything is checked before a single token runs: every metadata key the config needs and each value a model can
run with (a positive epsilon, heads that divide the width, token ids inside the vocabulary, ...), every tensor the
forward pass reads, each tensor's shape against the config, and every weight finite. A file of another shape, or
one that holds a NaN, raises ModelFileError naming the file and the key or tensor, rather than loading and answering
token 0 forever, or failing later inside generate(). A GGUF chosen with sha256=None meets the same checks.

GGUF lists each tensor's dimensions innermost first; gguf's reader hands back numpy arrays in the usual
order, so a projection from `in` to `out` features arrives as [out, in], one row per output feature.
"""
import dataclasses
from dataclasses import dataclass

import numpy as np

from kvlesson import validate
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
    config = config_from_metadata(meta, path)
    missing = [key for key in TOKENIZER_KEYS if key not in meta]
    if missing:
        raise ModelFileError(f"{path} has no tokenizer metadata {missing}")
    check_token_ids(meta, len(meta["tokenizer.ggml.tokens"]), path)
    stored = {t.name: t for t in reader.tensors}
    check_shapes(config, {name: tuple(int(n) for n in reversed(t.shape)) for name, t in stored.items()}, path)
    tensors, types = {}, {}
    for name, t in stored.items():
        tensors[name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        types[name] = gguf.GGMLQuantizationType(t.tensor_type).name
        _check_finite(name, tensors[name], path)
    tok = {key: _plain(meta[key]) for key in TOKENIZER_KEYS}
    config = dataclasses.replace(config, tied="output.weight" not in stored)  # one table for both ends
    return ModelFile(config, tensors, tok, meta.get("tokenizer.chat_template"), types)


def storage_summary(path):
    """-> [(tensor name, storage type, elements, bytes in the file)], read from the file's index alone."""
    import gguf

    reader = _reader(path)
    return [(t.name, gguf.GGMLQuantizationType(t.tensor_type).name, int(t.n_elements), int(t.n_bytes))
            for t in reader.tensors]


def config_from_metadata(meta, where="the file"):
    """GGUF metadata (key -> value) -> Config, every number read from the file and checked: ModelFileError naming
    `where` and the key of the first value no model can run with."""
    arch = meta.get("general.architecture")
    if arch not in _ROPE_INTERLEAVED:
        raise ModelFileError(f"{where}: architecture {arch!r} is not a Llama-style model this loader knows "
                             f"(known: {sorted(_ROPE_INTERLEAVED)})")

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFileError(f"{where}: its metadata has no {arch}.{key}")
        return value

    def count(key, default=None):
        return _checked(where, validate.integer, f"{arch}.{key}", get(key, default), 1)

    def positive(key):
        return _checked(where, validate.positive, f"{arch}.{key}", get(key))

    D, H, Hkv = count("embedding_length"), count("attention.head_count"), count("attention.head_count_kv")
    if H % Hkv:
        raise ModelFileError(f"{where}: {arch}.attention.head_count={H} is not a multiple of "
                             f"{arch}.attention.head_count_kv={Hkv}: each KV head serves a whole group of heads")
    if f"{arch}.attention.key_length" not in meta and D % H:
        raise ModelFileError(f"{where}: {arch}.embedding_length={D} does not split into {arch}.attention.head_count="
                             f"{H} heads, and no {arch}.attention.key_length gives the head dim")
    d = count("attention.key_length", D // H)
    if count("attention.value_length", d) != d:
        raise ModelFileError(f"{where}: {arch}.attention.value_length={get('attention.value_length')} differs from "
                             f"the key length d={d}; this loader runs one head dim for keys and values")
    if count("rope.dimension_count", d) != d:
        raise ModelFileError(f"{where}: RoPE rotates {get('rope.dimension_count')} of d={d} dims; partial RoPE is "
                             "not supported")
    if d % 2:
        raise ModelFileError(f"{where}: the head dim d={d} is odd, and RoPE rotates pairs of dims")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None and f"{arch}.vocab_size" not in meta:
        raise ModelFileError(f"{where}: its metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    vocab = count("vocab_size", len(tokens or ()))
    if tokens is not None and len(tokens) > vocab:
        raise ModelFileError(f"{where}: tokenizer.ggml.tokens lists {len(tokens)} tokens, more than the "
                             f"{arch}.vocab_size={vocab} rows of the token table")
    return Config(D=D, n_layers=count("block_count"), H=H, Hkv=Hkv, d=d, hidden=count("feed_forward_length"),
                  vocab=vocab, rope_base=positive("rope.freq_base"), rope_interleaved=_ROPE_INTERLEAVED[arch],
                  norm_eps=positive("attention.layer_norm_rms_epsilon"), max_len=count("context_length"),
                  name=str(meta.get("general.name", arch)))


def check_token_ids(meta, vocab, where="the file"):
    """Raise ModelFileError unless the end (and, if given, beginning) token ids are among the `vocab` tokens."""
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"):
        if key in meta:
            i = _checked(where, validate.integer, key, meta[key], 0)
            if i >= vocab:
                raise ModelFileError(f"{where}: {key}={i} is outside the vocabulary of {vocab} tokens")


def _checked(where, check, key, *args):
    """validate's check(key, *args), its TypeError or ValueError turned into a ModelFileError that names the file."""
    try:
        return check(key, *args)
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{where}: {e}") from None


def _check_finite(name, a, where):
    """A NaN or inf weight would run, and every logit would come out NaN (greedy decoding then answers token 0)."""
    if not np.isfinite(a).all():
        bad = a.size - int(np.isfinite(a).sum())
        raise ModelFileError(f"{where}: tensor {name} holds {bad:,} NaN or inf values of {a.size:,}; "
                             "no model runs with them")


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
