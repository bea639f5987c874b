"""The independent reference: Hugging Face transformers (PyTorch, CPU, float32) reading the same GGUF file.

Shared by compare_hf.py and bench.py. transformers converts the GGUF back to its own half-split RoPE layout
(it undoes llama.cpp's permutation of the Q and K rows), so agreement with it also checks our interleaved RoPE.
Needs the optional extras: pip install -r requirements.txt -r requirements-reference.txt
"""
from kvlesson.weights import fetch


def load(threads=None, tokenizer=False):
    """-> (model, tokenizer or None, "transformers X, torch Y") on the CPU in float32; None if not installed.

    threads sets torch's intra-op thread count (None leaves torch's default), so a benchmark can give both
    sides the same number.
    """
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        return None
    if threads is not None:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    path, _ = fetch.model_file()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name) if tokenizer else None
    return hf, tok, f"transformers {transformers.__version__}, torch {torch.__version__}"


def greedy(hf, input_ids, attention_mask, n, pad_id=None):
    """transformers' generate, greedy, exactly n new tokens per row -> [B, n] tensor, as kvlesson's generate makes.

    An eos_token_id left unset is filled in from the model's own generation config (<|im_end|> for SmolLM2), and a
    row that reaches it gets pads from then on. Clearing it there is the only way to have no end token: setting
    min_new_tokens instead hides the end token from the argmax, which changes the greedy choice wherever it wins.
    """
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    saved, hf.generation_config.eos_token_id = hf.generation_config.eos_token_id, None
    try:
        with torch.inference_mode():
            out = hf.generate(input_ids, attention_mask=attention_mask, generation_config=config)
    finally:
        hf.generation_config.eos_token_id = saved
    return out[:, input_ids.shape[1]:]
