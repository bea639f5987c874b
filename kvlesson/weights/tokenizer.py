"""The model's byte-level BPE tokenizer, rebuilt with Hugging Face `tokenizers` from the GGUF file's own data.

The file stores the vocabulary, the merges, each token's type and the name of its pre-tokenizer. Nothing is
downloaded: the same file that holds the weights defines the text <-> ids mapping.
"""
from kvlesson import validate

# tokenizer.ggml.pre names a pre-tokenizer; llama.cpp (src/llama-vocab.cpp) splits "smollm" text with
# two regexes in turn: every digit alone (\p{N}), then GPT-2's word/number/punctuation/space pattern.
_PRE_TOKENIZERS = {"smollm": "digits+gpt2"}

_CONTROL = 3  # tokenizer.ggml.token_type of special tokens such as <|im_start|>


class Tokenizer:
    """Text <-> token ids with the model's own byte-level BPE (special tokens like <|im_end|> kept)."""

    def __init__(self, hf_tokenizer, eos_id):
        self.hf = hf_tokenizer  # a tokenizers.Tokenizer
        self.eos_id = eos_id

    def encode(self, text):
        """str -> list[int]. No BOS is added (the file says add_bos_token = False)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        """list[int] -> str, the exact inverse of encode. Ids outside [0, vocab) raise ValueError."""
        return self.hf.decode(self.check_ids(ids), skip_special_tokens=False)

    def check_ids(self, ids, name="ids"):
        """-> list[int]: every id a true integer in [0, len(self)); TypeError or ValueError naming the bad ones."""
        return validate.token_ids(name, ids, len(self)).tolist()

    def __len__(self):
        return self.hf.get_vocab_size()


def build(tok):
    """Tokenizer data from the file (kvlesson.weights.gguf_file.TOKENIZER_KEYS) -> Tokenizer."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from kvlesson.weights.fetch import ModelFileError

    if _PRE_TOKENIZERS.get(tok["tokenizer.ggml.pre"]) != "digits+gpt2":
        raise ModelFileError(f"unknown pre-tokenizer {tok['tokenizer.ggml.pre']!r} (known: {sorted(_PRE_TOKENIZERS)})")
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
    return Tokenizer(hf, validate.integer("tokenizer.ggml.eos_token_id", int(tok["tokenizer.ggml.eos_token_id"])))
