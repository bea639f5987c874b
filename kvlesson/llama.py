"""SmolLM2-135M-Instruct from its GGUF file, running on kvlesson.model.forward.

    model = load()                        # fetched once, checked by sha256 (kvlesson.fetch)
    ids = model.tokenizer.encode("The capital of France is")
    new = model.generate(ids, 20)         # greedy, on one KV cache per layer
    print(model.tokenizer.decode(new))

Nothing here computes attention: the config and weights go into the same forward pass that
lesson 02 runs with a tiny random model. This module only reads the file:
  - the config from the GGUF metadata (llama.block_count, llama.attention.head_count, ...);
  - the weights, dequantized once from Q4_1/Q8_0 to float32 with gguf, under the file's tensor names;
  - the byte-level BPE tokenizer, rebuilt with Hugging Face `tokenizers` from the stored vocabulary and merges.
The float32 arrays and the tokenizer are cached as .npy/.json files in the user cache, beside the fetched
file, so a second load() maps them from disk (read-only) instead of dequantizing again.
"""
import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvlesson import fetch
from kvlesson import model as _model

# How each architecture pairs the dimensions RoPE rotates. llama.cpp's llama_model_rope_type gives
# LLM_ARCH_LLAMA the "normal" rope, which rotates adjacent pairs (2m, 2m + 1); its converter permutes
# the rows of the Q and K weights so that this matches the half-split pairs of the Hugging Face checkpoint.
_ROPE_INTERLEAVED = {"llama": True}

# tokenizer.ggml.pre names a pre-tokenizer; llama.cpp (src/llama-vocab.cpp) splits "smollm" text with
# two regexes in turn: every digit alone (\p{N}), then GPT-2's word/number/punctuation/space pattern.
_PRE_TOKENIZERS = {"smollm": "digits+gpt2"}

_CONTROL = 3  # tokenizer.ggml.token_type of special tokens such as <|im_start|>

# How far a chunked prefill may drift from one pass, in logits. float32 sums the same products in another
# order when tokens arrive in chunks (matrix-matrix instead of matrix-vector products), through 30 layers:
# we measure about 1e-4 on logits of size ~40, some twenty float32 steps (4e-6 apart at that size).
# A wrong mask or RoPE position moves logits by whole units, four orders of magnitude more.
CHUNK_TOL = 1e-3
_CACHE_VERSION = "2"  # bump when the layout of the cached .npy files changes


class Tokenizer:
    """Text <-> token ids with the model's own byte-level BPE (special tokens like <|im_end|> kept)."""

    def __init__(self, hf_tokenizer, eos_id):
        self.hf = hf_tokenizer  # a tokenizers.Tokenizer
        self.eos_id = eos_id

    def encode(self, text):
        """str -> list[int]. No BOS is added (the file says add_bos_token = False)."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        """list[int] -> str, the exact inverse of encode."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def __len__(self):
        return self.hf.get_vocab_size()


class Model:
    """A config, a dict of float32 weights and a tokenizer; the computation is kvlesson.model.forward."""

    def __init__(self, config, weights, tokenizer, chat_template=None):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.chat_template = chat_template  # the Jinja template stored in the file, for reference

    def new_cache(self, capacity=None, static=True):
        """One empty cache per layer; float32 StaticKVCache of `capacity` positions (default config.max_len).

        static=False gives growing KVCache objects instead. The model's position is len(cache[0]).
        """
        cfg = self.config
        if static and capacity is not None:
            cfg = _replace_max_len(cfg, capacity)
        return _model.new_cache(cfg, np.float32, static=static)

    def forward(self, ids, cache=None):
        """[T] token ids -> float32 [T, vocab] logits.

        With a cache (from new_cache()), the T tokens are appended to it, at positions len(cache[0]) onward.
        With cache=None, the ids are run as one fresh sequence and nothing is kept.
        """
        ids = self._check_ids(ids)
        if cache is None:
            cache = self.new_cache(capacity=len(ids))
        if len(cache) != self.config.n_layers:
            raise ValueError(f"need one cache per layer ({self.config.n_layers}); got {len(cache)}")
        return _model.forward(self.config, self.weights, ids, cache)

    def generate(self, ids, max_new_tokens, use_cache=True):
        """Greedy decoding -> the max_new_tokens new token ids (the prompt is not repeated).

        use_cache=False recomputes the whole sequence for every new token, to compare against.
        """
        ids = self._check_ids(ids)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(ids) == 0:
            raise ValueError("need at least one prompt token to predict the next one")
        if len(ids) + max_new_tokens > self.config.max_len:
            raise ValueError(f"{len(ids)} prompt + {max_new_tokens} new tokens exceed the context of "
                             f"{self.config.max_len} positions")
        if max_new_tokens == 0:
            return []
        return _model.generate(self.config, self.weights, ids, max_new_tokens, use_cache=use_cache)

    def chat_prompt(self, user, system=None):
        """The ChatML text SmolLM2-Instruct was tuned on, written out by hand (the file's template renders the same).

        One system turn (the template's default when none is given), one user turn, then the opening
        of the assistant's turn, which the model completes.
        """
        system = system or "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        return (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n"
                f"<|im_start|>assistant\n")

    def _check_ids(self, ids):
        ids = np.asarray(ids)
        if ids.size == 0:
            return []
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"need a flat list of integer token ids; got shape {ids.shape}, dtype {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= self.config.vocab)]
        if bad.size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab}); got {bad[:5].tolist()}")
        return ids.tolist()

    def __repr__(self):
        c = self.config
        return (f"Model({c.n_layers} layers, D={c.D}, H={c.H}, Hkv={c.Hkv}, d={c.d}, hidden={c.hidden}, "
                f"vocab={c.vocab}, rope_base={c.rope_base:g}, interleaved={c.rope_interleaved})")


def load(path=None, *, sha256=fetch.SHA256, f32_cache=True):
    """-> Model. SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once into the user cache when no path is given.

    path may be a GGUF file or a folder holding it ($KVLESSON_MODEL works too); it is checked by sha256
    (sha256=None accepts another GGUF you chose on purpose). Failures raise fetch.ModelFileError
    with what happened and what to run. With f32_cache, the dequantized weights are kept as .npy
    files in the user cache and memory-mapped on the next load.
    """
    gguf_path, digest = fetch.model_file(path, sha256)
    cached = _cache_folder(gguf_path, digest) if f32_cache else None
    if cached is not None and (cached / "done").is_file():
        try:
            return _load_cached(cached)
        except (OSError, ValueError, KeyError):  # a damaged cache is rebuilt, never half used
            pass
    config, stored, tokenizer, template, tok_data = _read_gguf(gguf_path)
    weights = _as_matmul_weights(stored)
    if cached is not None:
        _write_cache(cached, config, weights, tok_data, template)
    return Model(config, weights, tokenizer, template)


def _read_gguf(path):
    """GGUF file -> (Config, {name: float32 [out, in] as stored}, Tokenizer, chat template, tokenizer data)."""
    import gguf
    from gguf.quants import dequantize

    try:
        reader = gguf.GGUFReader(path)
        meta = {name: field.contents() for name, field in reader.fields.items()}
    except (ValueError, OSError, IndexError) as e:  # only reachable for a file accepted with sha256=None
        raise fetch.ModelFileError(f"{path} is not a GGUF file gguf can read ({e})") from None
    config = config_from_metadata(meta)
    weights = {}
    for t in reader.tensors:
        a = dequantize(t.data, t.tensor_type)  # numpy shape is GGUF's reversed: [out, in], rows contiguous
        if a.dtype != np.float32:
            raise ValueError(f"{t.name} dequantized to {a.dtype}; the model runs in float32 only")
        weights[t.name] = a
    tok_data = {key: meta[key] for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                           "tokenizer.ggml.token_type", "tokenizer.ggml.pre",
                                           "tokenizer.ggml.eos_token_id")}
    return config, weights, build_tokenizer(tok_data), meta.get("tokenizer.chat_template"), tok_data


def config_from_metadata(meta):
    """GGUF metadata (key -> value) -> kvlesson.model.Config, every number read from the file."""
    arch = meta["general.architecture"]
    if arch not in _ROPE_INTERLEAVED:
        raise ValueError(f"architecture {arch!r} is not a Llama-style model this loader knows")

    def get(key):
        return meta[f"{arch}.{key}"]

    D, H = int(get("embedding_length")), int(get("attention.head_count"))
    d = int(meta.get(f"{arch}.attention.key_length", D // H))
    if int(meta.get(f"{arch}.rope.dimension_count", d)) != d:
        raise ValueError(f"RoPE rotates {get('rope.dimension_count')} of d={d} dims; partial RoPE is not supported")
    return _model.Config(
        D=D, n_layers=int(get("block_count")), H=H, Hkv=int(get("attention.head_count_kv")), d=d,
        hidden=int(get("feed_forward_length")),
        vocab=int(meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
        rope_base=float(get("rope.freq_base")), rope_interleaved=_ROPE_INTERLEAVED[arch],
        norm_eps=float(get("attention.layer_norm_rms_epsilon")), max_len=int(get("context_length")))


def build_tokenizer(tok):
    """Vocabulary, merges and token types from the file -> Tokenizer (Hugging Face `tokenizers`, byte-level BPE)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if _PRE_TOKENIZERS.get(tok["tokenizer.ggml.pre"]) != "digits+gpt2":
        raise ValueError(f"unknown pre-tokenizer {tok['tokenizer.ggml.pre']!r}")
    tokens = list(tok["tokenizer.ggml.tokens"])
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in tok["tokenizer.ggml.merges"]]  # "Ġ t" -> ("Ġ", "t")
    hf = HFTokenizer(models.BPE(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, tok["tokenizer.ggml.token_type"], strict=True) if kind == _CONTROL]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return Tokenizer(hf, int(tok["tokenizer.ggml.eos_token_id"]))


def _as_matmul_weights(stored):
    """{name: [out, in] as in the file} -> {name: [in, out]} for x @ W, as kvlesson.model expects.

    The shape is [in, out] for every matrix; the memory order is chosen for the matrix-vector product
    of a decode step, which OpenBLAS streams faster (kvlesson.bench times both orders per shape):
      - narrow matrices (out < in: K, V, ffn_down) stay as the file's contiguous rows, seen transposed;
      - square and wide ones (Q, attn_output, ffn_gate, ffn_up) are copied once into contiguous [in, out];
      - the tied output layer is the token table transposed once into [D, vocab], and token_embd.weight
        becomes a [vocab, D] view of that same memory, so the table is stored once.
    """
    w = {}
    for name, a in stored.items():
        if a.ndim != 2 or name == "token_embd.weight":
            w[name] = a
        else:
            n_out, n_in = a.shape
            w[name] = np.ascontiguousarray(a.T) if n_out >= n_in else a.T
    if "output.weight" not in w:  # tied embeddings: the file stores one table for both ends
        w["output.weight"] = np.ascontiguousarray(w["token_embd.weight"].T)  # [D, vocab]
        w["token_embd.weight"] = w["output.weight"].T  # [vocab, D], no copy
    return w


def long_text():
    """-> (name, text): a long real English text for experiments.

    The GPL-3 licence text ships with every Debian-like system; elsewhere we fall back to a short
    essay that ships with kvlesson (written for the project, Apache-2.0 like the rest).
    """
    gpl = Path("/usr/share/common-licenses/GPL-3")
    if gpl.is_file():
        return "GPL-3", gpl.read_text(encoding="utf-8")
    return "fallback_text.txt", (Path(__file__).parent / "data" / "fallback_text.txt").read_text(encoding="utf-8")


def _replace_max_len(cfg, capacity):
    return replace(cfg, max_len=int(capacity))


# ---- the float32 cache beside the model: config.json, tokenizer.json, one .npy per tensor, then "done"


def _cache_folder(gguf_path, digest):
    """The folder of dequantized arrays for this exact file (keyed by its sha256), in the user cache."""
    return fetch.cache_dir() / f"{gguf_path.stem}.{digest[:16]}.f32"


def _write_cache(folder, config, weights, tok_data, template):
    """Save the model's arrays as they are (memory order included), into a temporary folder renamed into
    place at the end: a crash never leaves a half cache."""
    tied = np.shares_memory(weights["token_embd.weight"], weights["output.weight"])
    names = sorted(n for n in weights if not (tied and n == "token_embd.weight"))
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".f32-"))
        for name in names:
            np.save(tmp / f"{name}.npy", weights[name])  # a transposed view is saved in Fortran order, no copy
        meta = {"version": _CACHE_VERSION, "config": config.__dict__, "chat_template": template,
                "tensors": names, "tied": tied}
        (tmp / "config.json").write_text(json.dumps(meta))
        (tmp / "tokenizer.json").write_text(json.dumps({k: _plain(v) for k, v in tok_data.items()}))
        (tmp / "done").write_text("")
        if folder.exists():  # an older or damaged cache: this one replaces it
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except OSError:  # a read-only or full disk only costs speed next time
        pass


def _load_cached(folder):
    """The arrays memory-mapped read-only, in the order _write_cache saved them."""
    meta = json.loads((folder / "config.json").read_text())
    if meta.get("version") != _CACHE_VERSION:
        raise ValueError("old cache layout")
    config = _model.Config(**meta["config"])
    tokenizer = build_tokenizer(json.loads((folder / "tokenizer.json").read_text()))
    w = {name: np.asarray(np.load(folder / f"{name}.npy", mmap_mode="r")) for name in meta["tensors"]}
    if any(a.dtype != np.float32 for a in w.values()):
        raise ValueError("the cache holds a non-float32 array")
    if meta["tied"]:
        w["token_embd.weight"] = w["output.weight"].T
    return Model(config, w, tokenizer, meta["chat_template"])


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) else v
