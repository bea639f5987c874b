"""SmolLM2-135M-Instruct from its GGUF file, running on kvlesson.model.forward.

    model = load()                        # fetched once, checked by sha256 (kvlesson.weights.fetch)
    ids = model.tokenizer.encode("The capital of France is")
    new = model.generate(ids, 20)         # greedy, on one KV cache per layer
    print(model.tokenizer.decode(new))

Nothing here computes attention: the config and weights go into the same forward pass that lesson 02 runs
with a tiny random model. The jobs around it live in their own modules:
    kvlesson.weights.fetch       get the file once and verify it
    kvlesson.weights.gguf_file   read the config, the tensors (dequantized to float32), the tokenizer data
    kvlesson.weights.tokenizer   the byte-level BPE, rebuilt with Hugging Face `tokenizers`
    kvlesson.weights.layout      the weights as x @ W multiplies them, in the memory order a decode step streams fastest
    kvlesson.weights.f32cache    the float32 copy on disk, checksummed, so a second load maps it instead of dequantizing
"""
import contextlib
import operator
import os
from collections.abc import Sequence

import numpy as np

from kvlesson import model as _model
from kvlesson import validate
from kvlesson.cache import Cache, CacheLike, rules
from kvlesson.configs import Config
from kvlesson.sample import GREEDY, Sampling
from kvlesson.serving import batch
from kvlesson.weights import f32cache, fetch, gguf_file, layout, tokenizer
from kvlesson.weights.fetch import ModelFileError  # noqa: F401  raised by load(); importable from here
from kvlesson.weights.tokenizer import Tokenizer


class Model:
    """A config, a dict of weights (float32 as loaded) and a tokenizer; the computation is kvlesson.model.forward.

    Every method checks what it is given before any cache or pool moves: ids against the vocabulary, lengths against
    the context, caches against each other.
    """

    def __init__(self, config: Config, weights: dict[str, np.ndarray], tokenizer: Tokenizer,
                 chat_template: str | None = None):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.chat_template = chat_template  # the Jinja template stored in the file, for reference

    @property
    def dtype(self) -> np.dtype:
        return self.weights["output.weight"].dtype  # float32 as loaded

    def astype(self, dtype: np.dtype) -> "Model":
        """The same model with every weight cast to `dtype`; its caches, activations and logits follow.

        float64 is for experiments whose result must not depend on the CPU: float32 sums come out in another order
        under another BLAS kernel, and a quantizer's rounding can then go the other way. A tied table stays one
        array. Costs a copy of the weights (1.1 GB for SmolLM2 in float64).
        """
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise TypeError(f"dtype must be a floating dtype such as np.float64; got dtype={dtype}")
        w = {name: a.astype(dtype) for name, a in self.weights.items() if name != "token_embd.weight"}
        tied = layout.is_tied(self.weights)
        w["token_embd.weight"] = w["output.weight"].T if tied else self.weights["token_embd.weight"].astype(dtype)
        return Model(self.config, w, self.tokenizer, self.chat_template)

    def fused(self) -> "Model":
        """The same model with Q/K/V and gate/up fused into one product each (kvlesson.weights.layout.fuse): the
        same forward pass, the same logits up to float32 summation order, faster decoding. Costs a copy of those
        weights (about 280 MB for SmolLM2)."""
        if layout.is_fused(self.weights):
            return self
        return Model(self.config, layout.fuse(self.config, self.weights), self.tokenizer, self.chat_template)

    def new_cache(self, capacity: int | None = None, static: bool = True) -> list[Cache]:
        """One empty cache per layer: a StaticKVCache of `capacity` positions (default config.max_len), in the
        model's dtype.

        static=False gives growing KVCache objects instead. The model's position is len(caches[0]).
        """
        cfg = self.config
        if capacity is not None:
            capacity = validate.integer("capacity", capacity)
            if static:
                cfg = _model.with_max_len(cfg, capacity)
        return _model.new_cache(cfg, self.dtype, static=static)

    def forward(self, ids: Sequence[int], caches: list[CacheLike] | None = None) -> np.ndarray:
        """[T] token ids -> [T, vocab] logits in the model's dtype (float32 as loaded).

        With caches (one per layer, from new_cache()), the T tokens are appended at positions len(caches[0])
        onward. With caches=None, the ids are run as one fresh sequence and nothing is kept.
        """
        ids = self.tokenizer.check_ids(ids)
        if caches is None:
            caches = self.new_cache(capacity=max(len(ids), 1))
        self._check_caches(caches, len(ids))
        if not ids:
            return np.zeros((0, self.config.vocab), self.dtype)
        return _model.forward(self.config, self.weights, ids, caches)

    def generate(self, ids: Sequence[int], max_new_tokens: int, use_cache: bool = True,
                 sampling: Sampling = GREEDY) -> list[int]:
        """Decoding -> the max_new_tokens new token ids (the prompt is not repeated); greedy unless `sampling` (a
        kvlesson.sample.Sampling) says otherwise: the same seed gives the same tokens here and in an Engine.

        use_cache=False recomputes the whole sequence for every new token, to compare against.
        """
        ids, n = self._check_prompt(ids, max_new_tokens)
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a kvlesson.sample.Sampling; got {type(sampling).__name__}")
        if n == 0:
            return []
        return _model.generate(self.config, self.weights, ids, n, use_cache=use_cache, dtype=self.dtype,
                               sampling=sampling)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                       max_batch: int = 64, block_size: int = 16) -> list[list[int]]:
        """Greedy decoding of many prompts together -> one list of new token ids per prompt.

        Continuous batching on a paged KV pool (kvlesson.serving.batch): up to max_batch sequences decode in one
        step, with one matrix product per weight; finished ones free their blocks and waiting ones join. Each result
        equals generate(prompt, n) on that prompt alone, up to float32 summation order (lesson 09 measures it).
        max_new_tokens is one count for all prompts, or one per prompt.
        """
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
            raise TypeError(f"prompts must be a list of prompts, each a list of token ids; got "
                            f"{type(prompts).__name__}")
        counts = [max_new_tokens] * len(prompts) if np.ndim(max_new_tokens) == 0 else list(max_new_tokens)
        if len(counts) != len(prompts):
            raise ValueError(f"max_new_tokens has {len(counts)} counts for {len(prompts)} prompts")
        checked = [self._check_prompt(p, n, f"prompts[{i}]") for i, (p, n) in enumerate(zip(prompts, counts,
                                                                                              strict=True))]
        validate.integer("max_batch", max_batch, minimum=1)
        validate.integer("block_size", block_size, minimum=1)
        return batch.generate_batch(self.config, self.weights, [p for p, _ in checked], [n for _, n in checked],
                                    max_batch=max_batch, block_size=block_size)

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The ChatML text SmolLM2-Instruct was tuned on, written out by hand (the file's template renders the same).

        One system turn (the template's default when none is given), one user turn, then the opening
        of the assistant's turn, which the model completes.
        """
        system = system or "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        return (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n"
                f"<|im_start|>assistant\n")

    def _check_prompt(self, ids, max_new_tokens, name="ids"):
        """-> (ids, n): a prompt of at least one valid id, and a count of new tokens that fits the context."""
        return validate.request(ids, max_new_tokens, self.config.vocab, self.config.max_len, name=name)

    def _check_caches(self, caches, T):
        cfg = self.config
        if not isinstance(caches, (list, tuple)) or not all(hasattr(c, "append") for c in caches):
            raise TypeError(f"caches must be a list of {cfg.n_layers} caches, one per layer (model.new_cache()); "
                            f"got {type(caches).__name__}")
        if len(caches) != cfg.n_layers:
            raise ValueError(f"need one cache per layer ({cfg.n_layers}); got {len(caches)}")
        seen = {operator.index(len(c)) for c in caches}
        if len(seen) != 1:
            raise ValueError(f"the caches disagree on how many tokens they hold: {sorted(seen)}")
        S = seen.pop() + T
        if S > cfg.max_len:
            raise ValueError(f"{S} positions exceed the context of {cfg.max_len} this model was trained for")
        room = min(rules(c)[1] or S for c in caches)
        if S > room:
            raise ValueError(f"the caches hold {S - T} of {room} positions and cannot take {T} more "
                             f"(make them with new_cache(capacity=...))")

    def __repr__(self):
        c = self.config
        fused = "fused, " if layout.is_fused(self.weights) else ""
        return (f"Model({fused}{c.n_layers} layers, D={c.D}, H={c.H}, Hkv={c.Hkv}, d={c.d}, hidden={c.hidden}, "
                f"vocab={c.vocab}, rope_base={c.rope_base:g}, interleaved={c.rope_interleaved}, {self.dtype})")


def load(path: str | os.PathLike | None = None, *, sha256: str | None = fetch.SHA256, f32_cache: bool = True) -> Model:
    """-> Model. SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once into the user cache when no path is given.

    path may be a GGUF file or a folder holding it ($KVLESSON_MODEL works too); it is checked by sha256
    (sha256=None accepts another GGUF you chose on purpose, whose header and weights are then checked). Failures
    raise ModelFileError with what happened and what to run. With f32_cache, the dequantized weights are kept as
    checksummed .npy files in the user cache and memory-mapped on the next load; a damaged copy is rebuilt, never
    used, and processes loading at once build one copy between them (kvlesson.weights.f32cache.one_writer).
    """
    gguf_path, digest = fetch.model_file(path, sha256)
    if not f32_cache:
        return _from_gguf(gguf_path)
    folder = f32cache.folder_for(fetch.cache_dir(), gguf_path, digest)
    if folder.exists():
        try:
            return _from_copy(folder)
        except f32cache.Damaged as e:
            print(f"kvlesson: the float32 copy in {folder} cannot be used ({e}); rebuilding it from the GGUF file.")
        except OSError as e:
            print(f"kvlesson: cannot read the float32 copy in {folder} ({e.strerror}); reading the GGUF file "
                  "instead. Set KVLESSON_CACHE_DIR to a folder you own to keep a copy of your own.")
            return _from_gguf(gguf_path)
    with f32cache.one_writer(folder) as why_not:
        if why_not is None and folder.exists():  # another process wrote it while this one waited for the lock
            with contextlib.suppress(f32cache.Damaged):  # or it is the damaged copy seen above: rebuilt below
                return _from_copy(folder)
        return _from_gguf(gguf_path, folder, why_not)


def _from_copy(folder):
    config, weights, tok_data, template = f32cache.load(folder)
    return Model(config, weights, tokenizer.build(tok_data), template)


def _from_gguf(gguf_path, folder=None, why_not=None):
    """Dequantize the GGUF file; with a folder, keep the float32 copy there unless `why_not` says it cannot be."""
    if folder is not None:  # the first load, or a rebuild: several silent seconds otherwise
        print(f"kvlesson: reading {gguf_path.name} and dequantizing its weights to float32, once ...", flush=True)
    f = gguf_file.read(gguf_path)
    weights = layout.matmul_weights(f.tensors)
    if folder is not None and why_not is None:
        try:
            f32cache.save(folder, f.config, weights, f.tokenizer, f.chat_template)
        except OSError as e:
            why_not = e.strerror
    if folder is not None and why_not is not None:
        print(f"kvlesson: could not keep a float32 copy in {folder.parent} ({why_not}); each load will read the "
              "GGUF file (a few seconds). Set KVLESSON_CACHE_DIR to a writable folder to avoid it.")
    return Model(f.config, weights, tokenizer.build(f.tokenizer), f.chat_template)
