"""How far two float32 runs of the real model may drift apart and still count as the same computation.

A chunked prefill sums the same products in another order than one pass does (matrix-matrix instead of
matrix-vector products, blocks of another size), and the differences grow through 30 layers: on SmolLM2 over
the shipped text the logits (up to about 40) move by 1e-4 or less, a few float32 steps at that size. A wrong
mask or a RoPE position moves them by 10 or more (lesson 08 measures both). One tolerance separates them.
"""

CHUNK_TOL = 1e-3  # max |logit difference| between a chunked prefill and one pass, in float32
