"""Smaller caches: integer codes, attention sinks, a latent instead of K and V, 16-bit floats."""
