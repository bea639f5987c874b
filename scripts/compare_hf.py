"""Check kvlesson's SmolLM2 against an independent implementation: Hugging Face transformers on PyTorch.

Both read the same verified GGUF file and run in float32 on the CPU. Over a long real text we compare
the tokenization, the logits at every position (max and mean absolute difference, against the scale of
the logits) and the argmax at every position; then 40 greedy tokens from a prompt.

    pip install -r requirements.txt -r requirements-reference.txt    # a separate venv is best
    python scripts/compare_hf.py [--tokens 1024] [--new 40]

transformers converts the GGUF back to its own half-split RoPE layout (see hf_reference.py), so agreement
here also checks our interleaved RoPE.
"""
import argparse
import sys
import time

import hf_reference
import numpy as np

from kvlesson import llama
from kvlesson.text import NAME as text_name
from kvlesson.text import long_text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the long text to score")
    ap.add_argument("--new", type=int, default=40, help="greedy tokens to generate")
    ap.add_argument("--chunk", type=int, default=256, help="kvlesson prefills the text in chunks of this size")
    args = ap.parse_args(argv)
    ref = hf_reference.load(tokenizer=True)
    if ref is None:
        print("compare_hf needs the reference extras: pip install -r requirements-reference.txt", file=sys.stderr)
        return 2
    import torch

    hf, hf_tok, versions = ref
    model = llama.load()
    print(f"kvlesson   {model}")
    print(f"reference  {versions}, float32, CPU, {torch.get_num_threads()} threads")

    text = long_text()
    ours = model.tokenizer.encode(text)
    print(f"\ntext       {text_name}: {len(text):,} characters, {len(ours):,} tokens")
    same_tokens = _compare_tokenizers(model.tokenizer, hf_tok, text)
    ids = ours[: args.tokens]

    t0 = time.perf_counter()
    cache = model.new_cache(capacity=len(ids))
    ours_logits = np.concatenate([model.forward(ids[i : i + args.chunk], cache)
                                  for i in range(0, len(ids), args.chunk)])
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    t_ref = time.perf_counter() - t0
    diff = np.abs(ours_logits.astype(np.float64) - ref)
    differ = np.flatnonzero(ours_logits.argmax(-1) != ref.argmax(-1))
    agree = 1 - len(differ) / len(ids)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    gaps = ", ".join(f"{top2[i, 1] - top2[i, 0]:.2g}" for i in differ[:5])
    print(f"\nlogits over {len(ids)} tokens (kvlesson prefilled in chunks of {args.chunk}):")
    print(f"  max |logit| (scale)        {np.abs(ref).max():.2f}")
    print(f"  max abs difference         {diff.max():.3g}")
    print(f"  mean abs difference        {diff.mean():.3g}")
    print(f"  argmax agreement           {agree:.2%} of {len(ids)} positions")
    if len(differ):
        print(f"  where they differ, the reference's top-two logits are this close: {gaps}")
    print(f"  time (one run, not a benchmark): kvlesson {t_ours:.1f} s, transformers {t_ref:.1f} s")

    prompt = model.tokenizer.encode(model.chat_prompt("Explain in two sentences why the sky is blue."))
    ours_new = model.generate(prompt, args.new)
    ref_new = hf_reference.greedy(hf, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                  args.new)[0].tolist()
    same = next((i for i, (a, b) in enumerate(zip(ours_new, ref_new, strict=True)) if a != b), len(ours_new))
    print(f"\ngreedy {args.new} tokens after a {len(prompt)}-token chat prompt:")
    print(f"  identical: {ours_new == ref_new} ({same} of {args.new} tokens agree before the first difference)")
    print(f"  kvlesson:     {model.tokenizer.decode(ours_new)!r}")
    print(f"  transformers: {model.tokenizer.decode(ref_new)!r}")
    ok = same_tokens and agree > 0.99 and ours_new == ref_new
    print("\nAGREE" if ok else "\nDISAGREE")
    return 0 if ok else 1


def _compare_tokenizers(ours, hf_tok, text):
    """Same ids as transformers' tokenizer for the same file? Digits aside, they must be.

    The file says tokenizer.ggml.pre = "smollm": split off every digit, then GPT-2's pattern (llama.cpp
    does so, and so does the model's own tokenizer.json). transformers' GGUF converter (5.x) builds a plain
    ByteLevel pre-tokenizer instead, so around digits the two legitimately differ; without digits they
    must agree exactly.
    """
    a, b = ours.encode(text), hf_tok(text, add_special_tokens=False)["input_ids"]
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) == len(b):
        print("tokenizer  identical ids")
        return True
    pieces = [[ours.decode([t]) for t in ids[first:first + 3]] for ids in (a, b)]
    print(f"tokenizer  ids differ from position {first}: ours {pieces[0]}, transformers {pieces[1]}")
    plain = "".join(c for c in text if not c.isdigit())
    same = ours.encode(plain) == hf_tok(plain, add_special_tokens=False)["input_ids"]
    print(f"           with the digits removed: identical ids {same} (transformers does not split digits)")
    return same


if __name__ == "__main__":
    sys.exit(main())
