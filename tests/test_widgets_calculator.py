"""The calculator's pure function and table; the widget itself only where ipywidgets is installed."""
import pytest

from kvlesson.configs import ACCELERATORS, MODELS
from kvlesson.costs.memory import decode_floor, kv_bytes, weight_bytes
from kvlesson.teaching.widgets.calculator import CACHE_DTYPES, price, price_table


def test_price_of_the_card_example():
    p = price("Llama 3.1 8B", 8192)
    assert p.kv_bytes == 2 ** 30 and p.weight_bytes == 16_060_522_496
    assert p.kv_share == 2 ** 30 / 80e9 and p.total_share == (2 ** 30 + 16_060_522_496) / 80e9
    assert p.fits and p.floor_s == decode_floor(MODELS["Llama 3.1 8B"], ACCELERATORS["H100 SXM"], 8192)
    assert p.tokens_per_s == 1 / p.floor_s
    text = str(p)
    for piece in ("1 GiB", "1.34% of 80 GB", "16.06 GB (bfloat16)", "fits", "5.11 ms"):
        assert piece in text, text


def test_price_takes_specs_and_every_option():
    spec, accel = MODELS["Qwen2.5-7B"], ACCELERATORS["RTX 4090"]
    for t in CACHE_DTYPES:
        p = price(spec, 4096, 4, t, accel, "int4")
        assert p.kv_bytes == kv_bytes(spec, 4096, 4, t) and p.weight_bytes == weight_bytes(spec, "int4")
        assert p.floor_s == decode_floor(spec, accel, 4096, 4, kv_dtype=t, weight_dtype="int4")


def test_a_model_too_big_for_the_accelerator_does_not_fit():
    p = price("Llama 3.1 405B", 1024)
    assert not p.fits and "does NOT fit" in str(p)


def test_the_table_is_the_function_tabulated():
    contexts = [1024, 131072]
    table = price_table("Llama 3.1 8B", contexts, batch=8)
    rows = table.splitlines()
    assert len(rows) == 3 + len(contexts) + 1
    assert "128 GiB!" in rows[-2] and "32 GiB " in rows[-2]  # bfloat16 overflows 80 GB at 131k x 8; int4 does not
    assert f"{price('Llama 3.1 8B', 1024, 8, 'float8_e4m3fn').floor_s * 1e3:.2f} ms" in rows[3]


@pytest.mark.parametrize("kwargs, words", [
    (dict(model="Llama 4"), ["Llama 4", "Llama 3.1 8B"]),
    (dict(accelerator="TPU"), ["TPU", "H100 SXM"]),
    (dict(cache_dtype="fp16"), ["fp16", "dtype"]),
    (dict(weight_dtype="U8"), ["dtype", "<U8"]),
    (dict(context=-3), ["context", "-3"]),
    (dict(batch=0), ["batch", "0"]),
])
def test_bad_choices_raise_an_error_naming_them(kwargs, words):
    args = dict(model="Llama 3.1 8B", context=1024) | kwargs
    with pytest.raises((ValueError, TypeError)) as err:
        price(**args)
    for w in words:
        assert w in str(err.value)


def test_the_widget_wraps_price(capsys):
    pytest.importorskip("ipywidgets")
    from kvlesson.teaching.widgets.calculator import calculator

    w = calculator()
    assert [c.description for row in w.children[:-1] for c in row.children] == [
        "model", "context", "batch", "cache", "accelerator", "weights"]
    w.controls["batch"].value = 4
    assert {name: c.value for name, c in w.controls.items()} == dict(
        model="Llama 3.1 8B", context=8192, batch=4, cache_dtype="bfloat16", accelerator="H100 SXM",
        weights="bfloat16")
