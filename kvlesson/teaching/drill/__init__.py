"""The interview drill of lesson 12: price real configs, find the bug in suspects, and keep score.

    pricing   real config.json dicts with their sources, and their cache priced through kvlesson.costs.memory:
       spec(config), kv_bytes_per_token, kv_bytes_at, decode_floor_ms, params(name), price(name, context, accelerator)
    suspects  classic bugs from lessons 03-10, each with a correct twin behind the same interface
    lineup    the suspects under neutral labels A, B, ...: interface(label), interfaces(), suspect(label) to explore,
       and run(), which the checkers use to run a candidate's test on every version
    score     ScoreSheet: a stopwatch per section, and the parts it checks itself (sheet.check(part, answer))
"""
from kvlesson.teaching.drill.lineup import LABELS, interface, interfaces, labels, suspect
from kvlesson.teaching.drill.pricing import (
    CONFIGS,
    SOURCES,
    Params,
    config,
    decode_floor_ms,
    kv_bytes_at,
    kv_bytes_per_token,
    params,
    price,
    spec,
)
from kvlesson.teaching.drill.score import PLAN, ScoreSheet

__all__ = ["CONFIGS", "SOURCES", "config", "spec", "kv_bytes_per_token", "kv_bytes_at", "decode_floor_ms",
           "Params", "params", "price", "LABELS", "labels", "interface", "interfaces", "suspect", "PLAN", "ScoreSheet"]
