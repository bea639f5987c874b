"""What things cost and how well they work: bytes, FLOPs, the roofline, perplexity, float32 tolerance."""
