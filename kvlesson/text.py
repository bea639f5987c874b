"""The one long text every experiment reads: perplexity, chunked prefill, benchmarks.

It ships inside the package (kvlesson/data/long_text.txt, written for this project, Apache-2.0 like the rest),
so every learner on every operating system tokenizes the same characters and measures the same numbers.
Nothing in kvlesson reads a text file that only some systems have.
"""
from functools import lru_cache
from pathlib import Path

NAME = "The Ferry at Holloway Reach"  # the title on its first line
_PATH = Path(__file__).parent / "data" / "long_text.txt"


@lru_cache(maxsize=1)
def long_text():
    """-> str: about 5,400 words of English prose (6,792 SmolLM2 tokens), the same on every machine."""
    return _PATH.read_text(encoding="utf-8")
