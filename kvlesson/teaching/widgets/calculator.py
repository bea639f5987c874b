"""A KV-cache calculator: model, context, batch, cache dtype and accelerator in; bytes, share and floor out.

`price` is the pure function (tested); `price_table` tabulates it; `calculator()` is the thin ipywidgets
wrapper, imported lazily so kvlesson works without ipywidgets. Dtypes are numpy dtypes or their names
(ml_dtypes provides bfloat16, float8_e4m3fn and int4). Weights default to bfloat16, one dtype for every
parameter; int4 counts 4 bits per weight and no scales or zero points. That misprices mixed-precision files:
gpt-oss-120b as int4 is 58.4 GB, while its published checkpoint (MXFP4 experts at 4.25 bits, bf16 attention and
embeddings) is 60.8 GiB = 65.3 GB, kvlesson.configs.CHECKPOINT_BYTES. Lesson 05 prices it both ways.
"""
from dataclasses import dataclass

import numpy as np

from kvlesson.configs import ACCELERATORS, MODELS
from kvlesson.costs.memory import decode_floor, element_bytes, iec, kv_bytes, si, weight_bytes
from kvlesson.teaching.widgets.explorer import explorer

CACHE_DTYPES = ("float32", "bfloat16", "float8_e4m3fn", "int4")
WEIGHT_DTYPES = ("bfloat16", "float8_e4m3fn", "int4")


@dataclass(frozen=True)
class Price:
    model: str
    accelerator: str
    context: int
    batch: int
    cache_dtype: str
    weight_dtype: str
    kv_bytes: int  # the whole batch's cache
    weight_bytes: int  # all the weights
    memory: float  # the accelerator's, bytes
    kv_share: float  # kv_bytes / memory
    total_share: float  # (weights + KV) / memory
    floor_s: float  # decode floor, seconds per step

    @property
    def fits(self):
        return self.total_share <= 1

    @property
    def tokens_per_s(self):
        """Upper bound on tokens per second per sequence: one token per step, at the floor."""
        return 1 / self.floor_s

    def __str__(self):
        verdict = "fits" if self.fits else "does NOT fit"
        return "\n".join([
            f"{self.model}, {self.context:,} tokens x batch {self.batch}, cache in {self.cache_dtype}, "
            f"on {self.accelerator}",
            f"  KV cache      {iec(self.kv_bytes)} = {self.kv_share:.2%} of {si(self.memory)}",
            f"  + weights     {si(self.weight_bytes)} ({self.weight_dtype}): "
            f"{self.total_share:.1%} of memory, {verdict}",
            f"  decode floor  {self.floor_s * 1e3:.2f} ms per step, at most {self.tokens_per_s:,.0f} tokens/s "
            f"per sequence ({self.batch * self.tokens_per_s:,.0f} for the batch)",
        ])


def price(model, context, batch=1, cache_dtype="bfloat16", accelerator="H100 SXM", weight_dtype="bfloat16"):
    """Price `batch` sequences of `context` tokens. model and accelerator: keys of MODELS / ACCELERATORS or configs."""
    spec = _lookup(MODELS, model, "model")
    accel = _lookup(ACCELERATORS, accelerator, "accelerator")
    element_bytes(cache_dtype), element_bytes(weight_dtype)  # a TypeError naming a bad dtype, before anything else
    cache_dtype, weight_dtype = np.dtype(cache_dtype).name, np.dtype(weight_dtype).name
    kv = kv_bytes(spec, context, batch, cache_dtype)
    weights = weight_bytes(spec, weight_dtype)
    return Price(spec.name, accel.name, context, batch, cache_dtype, weight_dtype, kv, weights, accel.memory,
                 kv / accel.memory, (kv + weights) / accel.memory,
                 decode_floor(spec, accel, context, batch, kv_dtype=cache_dtype, weight_dtype=weight_dtype))


def price_table(model, contexts, cache_dtypes=CACHE_DTYPES, batch=1, accelerator="H100 SXM",
                weight_dtype="bfloat16"):
    """A text table from `price`: one row per context, KV bytes and decode floor per cache dtype."""
    head = f"{'context':>9} | " + " | ".join(f"{t:>22}" for t in cache_dtypes)
    lines = [f"{_lookup(MODELS, model, 'model').name}, batch {batch}, weights in {weight_dtype}, on "
             f"{_lookup(ACCELERATORS, accelerator, 'accelerator').name}: KV cache and decode floor per cache dtype",
             head, "-" * len(head)]
    for n in contexts:
        cells = []
        for t in cache_dtypes:
            p = price(model, n, batch, t, accelerator, weight_dtype)
            mark = "" if p.fits else "!"
            cells.append(f"{iec(p.kv_bytes) + mark:>11} {p.floor_s * 1e3:>7.2f} ms")
        lines.append(f"{n:>9,} | " + " | ".join(f"{c:>22}" for c in cells))
    lines.append("(! = weights + cache exceed the accelerator's memory)")
    return "\n".join(lines)


def calculator():
    """Dropdowns and sliders over `price`; prints its report. Needs ipywidgets."""
    import ipywidgets as widgets

    contexts = [2 ** i for i in range(8, 18)]  # 256 .. 131,072
    return explorer(
        lambda model, context, batch, cache_dtype, accelerator, weights: print(
            price(model, context, batch, cache_dtype, accelerator, weights)),
        {"model": widgets.Dropdown(options=list(MODELS), value="Llama 3.1 8B", description="model"),
         "context": widgets.SelectionSlider(options=contexts, value=8192, description="context"),
         "batch": widgets.SelectionSlider(options=[2 ** i for i in range(9)], value=1, description="batch")},
        {"cache_dtype": widgets.ToggleButtons(options=list(CACHE_DTYPES), value="bfloat16", description="cache"),
         "accelerator": widgets.Dropdown(options=list(ACCELERATORS), value="H100 SXM", description="accelerator"),
         "weights": widgets.ToggleButtons(options=list(WEIGHT_DTYPES), value="bfloat16", description="weights")})


def _lookup(table, key, what):
    if isinstance(key, str):
        if key not in table:
            raise ValueError(f"unknown {what} {key!r}; choose one of {list(table)}")
        return table[key]
    return key
