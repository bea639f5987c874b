"""SmolLM2-135M-Instruct on kvlesson's own cache: the file read right, the cache equal to a recompute.

The model comes through kvlesson.llama.load(), the path a learner takes (CI points KVLESSON_CACHE_DIR
at a fresh folder, so it fetches and verifies the file too). It is loaded once for this module.
"""
import shutil
from dataclasses import replace

import numpy as np
import pytest

from kvlesson import llama
from kvlesson import model as kvmodel
from kvlesson.cache import KVCache, StaticKVCache
from kvlesson.costs.tolerance import CHUNK_TOL
from kvlesson.text import long_text
from kvlesson.weights import fetch, gguf_file

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def text_ids(model):
    return model.tokenizer.encode(long_text())[:96]


# ---- the file


def test_config_is_read_from_the_file(model):
    c = model.config
    assert (c.n_layers, c.H, c.Hkv, c.d, c.D, c.hidden, c.vocab) == (30, 9, 3, 64, 576, 1536, 49152)
    assert c.rope_base == 100000.0 and c.rope_interleaved and c.max_len == 8192
    assert c.norm_eps == pytest.approx(1e-5) and type(c.norm_eps) is float  # a Python float cannot upcast float32


def test_config_follows_the_metadata_not_constants():
    meta = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.attention.head_count": 4,
            "llama.attention.head_count_kv": 2, "llama.block_count": 3, "llama.feed_forward_length": 100,
            "llama.rope.freq_base": 500.0, "llama.attention.layer_norm_rms_epsilon": 1e-6,
            "llama.context_length": 32, "tokenizer.ggml.tokens": ["a"] * 7}
    c = gguf_file.config_from_metadata(meta)
    assert (c.D, c.H, c.Hkv, c.d, c.n_layers, c.hidden, c.vocab, c.rope_base, c.max_len) == \
        (64, 4, 2, 16, 3, 100, 7, 500.0, 32)
    with pytest.raises(fetch.ModelFileError, match="architecture 'gpt2'"):
        gguf_file.config_from_metadata({**meta, "general.architecture": "gpt2"})
    with pytest.raises(fetch.ModelFileError, match="partial RoPE"):
        gguf_file.config_from_metadata({**meta, "llama.rope.dimension_count": 8})
    with pytest.raises(fetch.ModelFileError, match="no llama.block_count"):
        gguf_file.config_from_metadata({k: v for k, v in meta.items() if k != "llama.block_count"})


def test_weights_are_float32_in_matmul_layout_and_tied(model):
    w, c = model.weights, model.config
    assert all(a.dtype == np.float32 for a in w.values()), "a float64 table would upcast the whole model"
    assert w["blk.0.attn_q.weight"].shape == (c.D, c.H * c.d)  # [in, out]: x @ W
    assert w["blk.0.attn_k.weight"].shape == (c.D, c.Hkv * c.d)
    assert w["blk.0.ffn_down.weight"].shape == (c.hidden, c.D)
    assert w["output.weight"].shape == (c.D, c.vocab)
    assert np.shares_memory(w["output.weight"], w["token_embd.weight"])  # tied: one table, two uses


# ---- the tokenizer


def test_known_ids(model):
    assert model.tokenizer.encode(PROMPT) == [504, 3575, 282, 4649, 314]


@pytest.mark.parametrize("text", ["The capital of France is", "  two spaces, 12345 digits\n\nand a tab\t!",
                                  "naïve café – “quotes” 😀", "<|im_start|>user\nhi<|im_end|>\n", ""])
def test_decode_inverts_encode(model, text):
    assert model.tokenizer.decode(model.tokenizer.encode(text)) == text


def test_special_tokens_are_single_ids(model):
    tok = model.tokenizer
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2] == [tok.eos_id]
    assert tok.encode("2024") == [tok.encode(d)[0] for d in "2024"]  # the "smollm" pre-tokenizer splits digits


def test_hand_written_chat_prompt_equals_the_files_template(model):
    sandbox = pytest.importorskip("jinja2.sandbox")
    template = sandbox.ImmutableSandboxedEnvironment().from_string(model.chat_template)
    rendered = template.render(messages=[{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    assert model.chat_prompt("Hi there") == rendered


# ---- the forward pass on the cache


def test_forward_returns_float32_logits(model):
    for ids in ([504], [504, 3575, 282]):
        logits = model.forward(ids)
        assert logits.shape == (len(ids), model.config.vocab) and logits.dtype == np.float32
    assert model.forward([]).shape == (0, model.config.vocab)


def test_no_float64_sneaks_into_the_forward_pass(model, monkeypatch):
    """A float64 norm weight or table would upcast everything after it; watch every layer's input and output."""
    seen = []
    real_qkv, real_norm = kvmodel.qkv, kvmodel.rms_norm

    def qkv(cfg, w, b, h):
        out = real_qkv(cfg, w, b, h)
        seen.extend([h.dtype, *(a.dtype for a in out)])
        return out

    def rms_norm(x, w, eps):
        out = real_norm(x, w, eps)
        seen.extend([x.dtype, w.dtype, out.dtype])
        return out

    monkeypatch.setattr(kvmodel, "qkv", qkv)
    monkeypatch.setattr(kvmodel, "rms_norm", rms_norm)
    assert model.forward([504, 3575]).dtype == np.float32
    assert len(seen) == 4 * 30 + 3 * 61 and set(seen) == {np.dtype(np.float32)}


def test_the_position_lives_in_the_caches(model):
    cache = model.new_cache(capacity=16)
    model.forward([504, 3575, 282], cache)
    model.forward([4649], cache)
    assert [len(c) for c in cache] == [4] * model.config.n_layers
    assert all(c.k.dtype == np.float32 for c in cache)


def test_forward_without_a_cache_keeps_nothing(model):
    a = model.forward([504, 3575, 282])
    b = model.forward([504, 3575, 282])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, model.forward([504, 3575, 282], model.new_cache()))


def test_cached_generation_equals_uncached_for_40_tokens(model):
    """Recompute is the reference: a wrong offset mask or RoPE position would change the tokens."""
    ids = model.tokenizer.encode(PROMPT)
    cached = model.generate(ids, 40)
    assert model.generate(ids, 40, use_cache=False) == cached
    assert model.tokenizer.decode(cached).startswith(" Paris.")


def test_greedy_chat_answer_matches_transformers(model):
    """Golden text: transformers 5.24.0 on PyTorch 2.13.0 (scripts/compare_hf.py) gave these 40 tokens."""
    prompt = model.tokenizer.encode(model.chat_prompt("Explain in two sentences why the sky is blue."))
    new = model.generate(prompt, 40)
    assert model.tokenizer.decode(new) == (
        "The sky is blue because of a process called Rayleigh scattering, where light encounters tiny molecules "
        "of air and is deflected by them. When sunlight reaches our atmosphere, it encounters molecules of air "
        "that scatter")


@pytest.mark.parametrize("chunks", [[60, 1, 1, 1, 33], [7] * 13 + [5], [95, 1]])
def test_chunked_prefill_equals_one_pass(model, text_ids, chunks):
    assert sum(chunks) == len(text_ids)
    full = model.forward(text_ids)
    cache, parts, start = model.new_cache(capacity=len(text_ids)), [], 0
    for n in chunks:
        parts.append(model.forward(text_ids[start:start + n], cache))
        start += n
    got = np.concatenate(parts)
    assert np.abs(got - full).max() < CHUNK_TOL
    assert (got.argmax(-1) == full.argmax(-1)).all()


def test_a_growing_cache_gives_the_same_logits(model, text_ids):
    static = model.forward(text_ids[:40], model.new_cache(capacity=40))
    growing = model.new_cache(static=False)
    assert isinstance(growing[0], KVCache) and isinstance(model.new_cache()[0], StaticKVCache)
    got = np.concatenate([model.forward(text_ids[:30], growing), model.forward(text_ids[30:40], growing)])
    assert np.abs(got - static).max() < CHUNK_TOL


def test_half_split_rope_is_the_wrong_convention_for_this_file(model):
    """The GGUF rows are ordered for adjacent pairs; rotating (m, m + d/2) instead garbles the model."""
    ids = model.tokenizer.encode(model.chat_prompt("Why do we sleep?"))
    right = model.forward(ids)
    wrong_cfg = replace(model.config, rope_interleaved=False)
    wrong = kvmodel.forward(wrong_cfg, model.weights, ids, kvmodel.new_cache(wrong_cfg, static=False))
    assert model.tokenizer.decode([int(right[-1].argmax())]) == "The"
    assert int(wrong[-1].argmax()) != int(right[-1].argmax())
    assert np.abs(wrong - right).max() > 1.0


# ---- bad input and bad files


@pytest.mark.parametrize("call, error, words", [
    (lambda m: m.forward([1, 49152]), ValueError, r"ids must lie in \[0, 49152\); got \[49152\]"),
    (lambda m: m.forward([-1]), ValueError, r"got \[-1\]"),
    (lambda m: m.forward([1.5]), TypeError, "integer token ids; got 1.5"),
    (lambda m: m.forward([True]), TypeError, "integer token ids; got True"),
    (lambda m: m.forward("hello"), TypeError, "not text \\(encode it first\\)"),
    (lambda m: m.forward([1], m.new_cache()[:3]), ValueError, "one cache per layer"),
    (lambda m: m.forward([1], 5), TypeError, "caches must be a list of 30 caches"),
    (lambda m: m.generate([1] * 8000, 500), ValueError, "exceed the context of 8192"),
    (lambda m: m.generate([1, 2], 2.5), TypeError, "max_new_tokens must be an integer; got max_new_tokens=2.5"),
    (lambda m: m.generate([1, 2], -1), ValueError, "max_new_tokens must be at least 0"),
    (lambda m: m.generate([], 3), ValueError, "at least one prompt token"),
    (lambda m: m.tokenizer.decode([-1]), ValueError, r"\[0, 49152\); got \[-1\]"),
    (lambda m: m.tokenizer.decode([49152]), ValueError, "got \\[49152\\]"),
    (lambda m: m.tokenizer.encode(b"bytes"), TypeError, "text must be a str"),
    (lambda m: m.new_cache(capacity=2.5), TypeError, "capacity must be an integer"),
])
def test_bad_input_names_the_argument(model, call, error, words):
    with pytest.raises(error, match=words):
        call(model)


def test_a_refused_forward_leaves_every_cache_as_it_was(model):
    caches = model.new_cache(capacity=4)
    with pytest.raises(ValueError, match="hold 0 of 4 positions and cannot take 5 more"):
        model.forward([1, 2, 3, 4, 5], caches)
    model.forward([1, 2], caches)
    uneven = model.new_cache(capacity=8)
    uneven[7].append(*(np.zeros((3, 1, 64), np.float32),) * 2)
    with pytest.raises(ValueError, match="disagree on how many tokens they hold"):
        model.forward([1], uneven)
    assert [len(c) for c in caches] == [2] * 30 and [len(c) for c in uneven].count(0) == 29


def test_a_truncated_or_altered_copy_of_the_real_file_is_refused(model, tmp_path):
    real, _ = fetch.model_file()
    cut = tmp_path / "cut" / fetch.FILENAME
    cut.parent.mkdir()
    with open(real, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(fetch.SIZE // 2))
    with pytest.raises(fetch.ModelFileError, match="truncated"):
        llama.load(cut)
    altered = tmp_path / fetch.FILENAME
    shutil.copyfile(real, altered)
    with open(altered, "r+b") as f:
        f.seek(fetch.SIZE // 3)
        byte = f.read(1)
        f.seek(fetch.SIZE // 3)
        f.write(bytes([byte[0] ^ 1]))  # one flipped bit
    with pytest.raises(fetch.ModelFileError, match="fails its checksum"):
        llama.load(tmp_path)


def test_a_file_accepted_on_purpose_must_still_be_gguf(tmp_path):
    own = tmp_path / "notes.gguf"
    own.write_bytes(b"these are not weights" * 10)
    with pytest.raises(fetch.ModelFileError, match="not a GGUF file"):
        llama.load(own, sha256=None)


def test_the_long_text_ships_with_the_package_and_has_its_stated_length(model):
    """kvlesson.text's docstring and the lessons quote 6,792 tokens: the text every experiment reads."""
    text = long_text()
    assert text.isascii() and text.startswith("The Ferry at Holloway Reach\n")
    assert len(model.tokenizer.encode(text)) == 6792


def test_the_config_says_the_model_is_tied(model):
    """SmolLM2 has no output.weight in its file: the token table is read at both ends."""
    assert model.config.tied
