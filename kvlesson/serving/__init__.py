"""Many sequences at once: a paged KV pool, padded batches, continuous batching."""
