"""Many sequences at once: a paged KV pool, padded batches, continuous batching."""
from kvlesson.serving.engine import Engine

__all__ = ["Engine"]
