"""kvlesson.teaching.checks star-imports one module per lesson: a name exported twice would shadow a checker."""
import importlib
from collections import Counter

import kvlesson.teaching.checks

LESSONS = ["attention", "why_cache", "cache", "mask", "gqa", "rope", "window", "real_model", "many", "precision",
           "shrink", "drill", "scheduler", "speculative", "parallel", "server"]


def test_no_checker_name_is_exported_twice():
    names = Counter(n for m in LESSONS for n in importlib.import_module(f"kvlesson.teaching.checks.{m}").__all__)
    assert [n for n, c in names.items() if c > 1] == []


def test_every_exported_checker_is_reachable_from_kvlesson_checks():
    for m in LESSONS:
        module = importlib.import_module(f"kvlesson.teaching.checks.{m}")
        for name in module.__all__:
            assert getattr(kvlesson.teaching.checks, name) is getattr(module, name)
