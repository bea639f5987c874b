"""The model file and its weights: fetch the file once, read it, rebuild its tokenizer, lay the weights out
for x @ W, keep a float32 copy on disk."""
