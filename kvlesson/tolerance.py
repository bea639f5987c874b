"""How far two float32 runs of the real model may drift apart and still count as the same computation.

A chunked prefill sums the same products in another order than one pass does (matrix-matrix instead of
matrix-vector products, blocks of another size), and the differences grow through 30 layers: on SmolLM2 the
logits (about 40 at most) move by about 1e-4, some twenty float32 steps apart at that size. A wrong mask or
a RoPE position moves them by whole units, four orders of magnitude more. So one tolerance separates them.
"""

CHUNK_TOL = 1e-3  # max |logit difference| between a chunked prefill and one pass, in float32
