"""kvlesson.teaching.drill: the priced configs, the suspects and their twins, the lineup's veil, and the score sheet.

The suspects' tests run the way tests of a cache always run here: every correct twin against a full recompute over
random shapes and chunkings, and every broken suspect against its twin on an input its bug cannot hide from (and on
the inputs where the lessons say it hides, to show the bug is the only difference).
"""
import inspect
import itertools
import math
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlesson import KVCache, PagedKVCache, WindowKVCache, attention, online_attention, step
from kvlesson.configs import ACCELERATORS, MODELS
from kvlesson.costs import memory
from kvlesson.teaching import checks
from kvlesson.teaching.drill import lineup, model_tests, pricing, suspects
from kvlesson.teaching.drill.score import PLAN, ScoreSheet
from tests.helpers import layers, reference, run_chunks

CASES = {c.key: c for c in suspects.CASES}

# ---------------------------------------------------------------------------------------------- pricing


@pytest.mark.parametrize("name", list(pricing.CONFIGS))
def test_each_config_names_its_source_and_agrees_with_the_package_table(name):
    assert pricing.SOURCES[name].startswith("https://huggingface.co/") and pricing.SOURCES[name].endswith("config.json")
    s, m = pricing.spec(pricing.config(name)), MODELS[name]
    assert (s.n_layers, s.H, s.Hkv, s.d, s.window, s.window_layers) == (m.n_layers, m.H, m.Hkv, m.d, m.window,
                                                                        m.window_layers)


@pytest.mark.parametrize("name", list(pricing.HELD_OUT))
def test_each_held_out_config_names_its_source_and_counts_its_parameters(name):
    assert pricing.SOURCES[name].startswith("https://huggingface.co/") and pricing.SOURCES[name].endswith("config.json")
    assert name not in pricing.CONFIGS  # the lesson never prints it
    p = pricing.params(name)
    assert p.active > 0 and p.experts >= 0 and pricing.kv_bytes_per_token(pricing.config(name)) > 0


def test_the_held_out_configs_hold_the_traps_the_five_do_not():
    """A head dim of 64 with no head_dim field (a hard-coded 128 passes all five shown), a sliding_window that
    use_sliding_window switches off (ignoring the flag passes all five), and a second mixture of experts."""
    qwen = pricing.config("Qwen2.5-0.5B")
    assert "head_dim" not in qwen and pricing.spec(qwen).d == 64
    assert all((c.get("head_dim") or 128) == pricing.spec(c).d for c in pricing.CONFIGS.values())
    assert qwen["sliding_window"] == 32768 and qwen["use_sliding_window"] is False
    assert pricing.kv_bytes_at(qwen, 65536) == 2 * pricing.kv_bytes_at(qwen, 32768)  # no layer stops growing
    assert pricing.params("Qwen2.5-0.5B").active == 494_032_768  # the model card's 0.49B
    mixtral = pricing.spec(pricing.config("Mixtral 8x7B v0.1"), params=pricing.params("Mixtral 8x7B v0.1"))
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.expert_params) == (8, 2, 45_097_156_608)


def test_a_mixture_of_experts_needs_its_experts_counted():
    g = pricing.config("gpt-oss-120b")
    with pytest.raises(ValueError, match="needs Params"):
        pricing.spec(g, params=5.1e9)
    with pytest.raises(ValueError, match="no num_local_experts"):
        pricing.spec(pricing.config("Llama 3.1 8B"), params=pricing.Params(8e9, 1e9))
    with pytest.raises(ValueError, match="params.active"):
        pricing.spec(g, params=pricing.Params(-1, 1e9))
    with pytest.raises(ValueError, match="no parameter counts"):
        pricing.params("Llama 9")
    s = pricing.spec(g, params=pricing.params("gpt-oss-120b"))
    assert (s.experts, s.experts_per_token) == (128, 4) and s.expert_params == MODELS["gpt-oss-120b"].expert_params


def test_the_library_has_the_traps_the_drill_promises():
    """A head_dim set on its own, windows on every layer, windows on some layers, a window switched off."""
    raw = pricing.CONFIGS
    assert any("head_dim" in c and c["head_dim"] != c["hidden_size"] // c["num_attention_heads"] for c in raw.values())
    windowed = {n: pricing.spec(c).window_layers for n, c in raw.items()}
    assert windowed["Mistral 7B v0.1"] == 32 and windowed["gpt-oss-120b"] == 18 and windowed["Qwen3-32B"] == 0
    assert raw["Qwen3-32B"]["use_sliding_window"] is False


def test_prices_come_from_kvlesson_memory():
    llama = pricing.config("Llama 3.1 8B")
    assert pricing.kv_bytes_per_token(llama) == 128 * 2**10 and pricing.kv_bytes_at(llama, 8192) == 2**30
    assert round(pricing.price("Llama 3.1 8B", 4096).floor_ms, 2) == 4.95  # lesson 05's H100 example
    for name in pricing.CONFIGS:
        spec = MODELS[name]
        for t in (0, 1, 127, 128, 129, 4096, 131072):
            assert pricing.kv_bytes_at(pricing.config(name), t) == memory.kv_bytes_per_sequence(spec, t)
        want = memory.decode_floor(spec, ACCELERATORS["A100 80GB SXM"], 1000, 3) * 1e3
        got = pricing.decode_floor_ms(pricing.config(name), pricing.params(name), ACCELERATORS["A100 80GB SXM"],
                                      1000, 3)
        assert math.isclose(got, want, rel_tol=1e-12)


def test_windows_by_hand():
    """gpt-oss-120b: 18 full layers grow, 18 stop at 128; Mistral: every layer stops at 4,096."""
    per_layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16
    for t in (0, 50, 128, 1000):
        assert pricing.kv_bytes_at(pricing.config("gpt-oss-120b"), t) == per_layer * (18 * t + 18 * min(t, 128))
    assert pricing.kv_bytes_at(pricing.config("Mistral 7B v0.1"), 32768) == 32 * 2 * 8 * 128 * 2 * 4096


def test_a_window_switched_off_and_a_config_from_before_gqa():
    c = dict(pricing.config("Llama 3.1 8B"), sliding_window=4096, use_sliding_window=False)
    assert pricing.kv_bytes_at(c, 8192) == pricing.kv_bytes_at(pricing.config("Llama 3.1 8B"), 8192)
    mha = {k: v for k, v in pricing.config("Llama 3.1 8B").items() if k != "num_key_value_heads"}
    assert pricing.spec(mha).Hkv == 32


@pytest.mark.parametrize("change, error", [
    (dict(layer_types=["full_attention"] * 3), ValueError),
    (dict(layer_types=["chunked_attention"] * 32), ValueError),
    (dict(layer_types=["sliding_attention"] * 32), ValueError),  # windowed layers, but sliding_window absent
    (dict(hidden_size=4097), ValueError),  # no head_dim and not divisible
    (dict(num_key_value_heads=5), ValueError),
    (dict(num_hidden_layers=0), ValueError),
    (dict(num_attention_heads="32"), ValueError),
    (dict(sliding_window=4096, use_sliding_window=True, max_window_layers=28), ValueError),
])
def test_bad_configs_are_refused_by_name(change, error):
    with pytest.raises(error):
        pricing.spec(dict(pricing.config("Llama 3.1 8B"), **change))


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        pricing.spec([("num_hidden_layers", 32)])
    with pytest.raises(ValueError, match="bytes_per_element"):
        pricing.kv_bytes_per_token(pricing.config("Llama 3.1 8B"), 3)
    with pytest.raises(ValueError, match="params"):
        pricing.spec(pricing.config("Llama 3.1 8B"), params=-1)
    with pytest.raises(ValueError, match="no config"):
        pricing.config("Llama 9")
    assert pricing.spec(pricing.config("Llama 3.1 8B")).params == math.inf  # never a wrong finite weight count


def test_config_hands_out_copies():
    c = pricing.config("gpt-oss-120b")
    c["layer_types"].append("full_attention")
    c["num_hidden_layers"] = 1
    assert len(pricing.CONFIGS["gpt-oss-120b"]["layer_types"]) == 36 and pricing.config("gpt-oss-120b") != c


# ---------------------------------------------------------------------------------------------- suspects


@pytest.mark.parametrize("case", suspects.CASES, ids=lambda c: c.key)
def test_every_suspect_differs_from_its_twin_and_its_test_tells_them_apart(case):
    """The model test fails on the broken suspect and passes on its twin (and on kvlesson's own): an input where
    they differ. A copy of the suspect with every number moved fails it too (or crashes: a moved len or window
    sends kvlesson.step out of its shapes)."""
    label = next(lab for lab in lineup.LABELS if lineup.case(lab) is case)
    outcomes = {v: lineup.run(model_tests.TESTS[case.key], label, v) for v in lineup.versions(label)}
    assert outcomes["correct"].status == "pass" and outcomes["broken"].status == "fail"
    assert outcomes.get("kvlesson", outcomes["correct"]).status == "pass" and outcomes["shifted"].status != "pass"


def _qkv(H, Hkv, T, S, d, seed=0, dtype=np.float64):
    r = np.random.default_rng(seed)
    return r.standard_normal((H, T, d)).astype(dtype), *r.standard_normal((2, Hkv, S, d)).astype(dtype)


def test_the_mask_bug_hides_in_a_prefill_and_in_decode():
    """np.tril of [T, S] is right when T = S and, for one query, when the mask is not needed: only a chunk shows it."""
    q, k, v = _qkv(4, 2, 10, 10, 8)
    assert np.allclose(suspects.attend_top_left(q, k, v), attention(q, k, v), rtol=0, atol=1e-12)
    q, k, v = _qkv(4, 2, 3, 10, 8)
    assert not np.allclose(suspects.attend_top_left(q, k, v), attention(q, k, v))


def test_the_tile_bug_hides_for_mha_and_mqa():
    for H, Hkv in ((4, 4), (4, 1)):
        q, k, v = _qkv(H, Hkv, 5, 7, 8)
        assert np.allclose(suspects.attend_tiled(q, k, v), attention(q, k, v), rtol=0, atol=1e-12)
    q, k, v = _qkv(4, 2, 5, 7, 8)
    assert not np.allclose(suspects.attend_tiled(q, k, v), attention(q, k, v))


def test_the_rope_bug_hides_in_a_first_prefill():
    x, Wq, Wk, Wv = model_tests.x, model_tests.Wq, model_tests.Wk, model_tests.Wv
    args = (4, 2, 10000.0)
    assert np.allclose(suspects.layer_local(x, Wq, Wk, Wv, KVCache(2, 8), *args),
                       step(x, Wq, Wk, Wv, KVCache(2, 8), 4, 2, rope_base=10000.0), rtol=0, atol=1e-12)


def test_the_order_bug_hides_in_decode_and_the_eviction_bug_too():
    """Newest first, and evict-before-attend with W slots, both give the right decode outputs."""
    x, Wq, Wk, Wv = model_tests.x, model_tests.Wq, model_tests.Wk, model_tests.Wv
    evict_first = lambda Hkv, d: suspects.evict_first_cache(Hkv, d, 4)  # noqa: E731  a ring of W = 4 slots
    for make, window in ((suspects.newest_first_cache, None), (evict_first, 4)):
        cache = make(2, 8)
        got = np.concatenate([step(x[i:i + 1], Wq, Wk, Wv, cache, 4, 2, window=window) for i in range(10)])
        assert np.allclose(got, step(x, Wq, Wk, Wv, KVCache(2, 8), 4, 2, window=window), rtol=0, atol=1e-12)


def test_the_rescale_bug_hides_when_the_first_block_holds_the_max():
    q, k, v = _qkv(2, 1, 1, 8, 4)
    k[:, 0] = q[0, 0] * 10  # key 0 scores far above the rest for both heads
    k[:, 1:] *= 0.01
    assert np.allclose(suspects.stream_no_rescale(q, k, v, 2), attention(q, k, v), rtol=0, atol=1e-12)


def test_the_copy_on_write_bug_hides_when_a_fork_ends_on_a_block_boundary():
    for cls in (suspects._ForgetsSharing, PagedKVCache):
        pool = cls(8, 4, 1, 1)
        a = pool.new_sequence()
        pool.sequence(a).append(*np.ones((2, 1, 8, 1)))  # two full blocks
        b = pool.fork(a)
        pool.sequence(a).append(np.full((1, 1, 1), 5.0), np.full((1, 1, 1), 5.0))
        pool.sequence(b).append(np.full((1, 1, 1), 7.0), np.full((1, 1, 1), 7.0))
        assert pool.gather(a)[0][0, -1, 0] == 5.0 and pool.gather(b)[0][0, -1, 0] == 7.0
        pool.free(a), pool.free(b)
        assert pool.blocks_free == 8  # the bug leaves the reference counts right


@settings(max_examples=40)
@given(H_Hkv=st.sampled_from([(1, 1), (4, 2), (6, 3), (4, 1), (3, 3)]), T=st.integers(0, 6), extra=st.integers(0, 6),
       block=st.integers(1, 8), seed=st.integers(0, 2**16), f32=st.booleans())
def test_the_attention_twins_equal_attention(H_Hkv, T, extra, block, seed, f32):
    """float64 to 1e-12; float32 to 1e-5, a few roundings of values near 1, and float32 stays float32."""
    dtype, tol = (np.float32, 1e-5) if f32 else (np.float64, 1e-12)
    q, k, v = _qkv(*H_Hkv, T, T + extra, 4, seed, dtype)
    want = attention(q, k, v)
    for got in (suspects.attend(q, k, v), suspects.stream(q, k, v, block), online_attention(q, k, v, block=block)):
        assert got.dtype == dtype and got.shape == want.shape and np.abs(got - want).max(initial=0) <= tol


@settings(max_examples=40)
@given(layers(windowed=True))
def test_the_cache_twins_equal_a_full_pass(c):
    """The growing and window twins under kvlesson.step, any chunking (empty chunks included), with and without RoPE."""
    want = reference(c)
    for cache in (suspects.window_cache(c["Hkv"], c["d"], c["window"]), suspects.growing_cache(c["Hkv"], c["d"])):
        assert np.allclose(run_chunks(c, cache), want, rtol=0, atol=1e-12)


@settings(max_examples=30)
@given(layers(windowed=False))
def test_the_rope_layer_twin_equals_step(c):
    from tests.helpers import weights
    x, Wq, Wk, Wv = weights(c)
    cache, parts, start = KVCache(c["Hkv"], c["d"]), [], 0
    for T in c["chunks"]:
        parts.append(suspects.layer(x[start:start + T], Wq, Wk, Wv, cache, c["H"], c["Hkv"], 500.0))
        start += T
    want = step(x, Wq, Wk, Wv, KVCache(c["Hkv"], c["d"]), c["H"], c["Hkv"], rope_base=500.0)
    assert np.allclose(np.concatenate(parts), want, rtol=0, atol=1e-12)


@settings(max_examples=40)
@given(pads=st.lists(st.integers(0, 5), min_size=1, max_size=4), T=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_the_padded_twins_agree_on_every_real_row(pads, T, seed):
    S = 6
    T = min(T, S)
    r = np.random.default_rng(seed)
    q, k, v = (r.standard_normal((len(pads), n, T if n == 4 else S, 4)) for n in (4, 2, 2))
    a, b = suspects.padded_attend(q, k, v, np.array(pads)), suspects.padded_attend_alone(q, k, v, np.array(pads))
    for row, p in enumerate(pads):
        first = max(0, p - (S - T))
        assert np.allclose(a[row, :, first:], b[row, :, first:], rtol=0, atol=1e-12)
        assert np.isfinite(a).all()


def test_the_window_twin_holds_w_minus_1_between_steps_like_the_package():
    mine, package = suspects.window_cache(2, 4, 5), WindowKVCache(2, 4, 5)
    for T in (3, 1, 7, 0, 2):
        block = np.ones((2, T, 4))
        assert [a.shape for a in mine.append(block, block)] == [a.shape for a in package.append(block, block)]
    assert mine.nbytes == package.nbytes == 2 * 2 * 4 * 4 * 8


def test_suspects_refuse_bad_input_like_the_package():
    with pytest.raises(ValueError):
        suspects.attend(*_qkv(3, 2, 2, 4, 4))  # 3 query heads over 2 KV heads
    with pytest.raises(ValueError):
        suspects.padded_attend(*_qkv(2, 1, 2, 4, 4), np.array([0, 1]))  # not a batch
    with pytest.raises(ValueError):
        suspects.growing_cache(2, 4).append(np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4)))
    with pytest.raises(ValueError):
        suspects.stream(*_qkv(2, 1, 2, 4, 4), 0)


# ---------------------------------------------------------------------------------------------- the lineup


def test_the_lineup_is_a_fixed_shuffle_with_neutral_interfaces():
    keys = [lineup.case(label).key for label in lineup.LABELS]
    assert sorted(keys) == sorted(c.key for c in suspects.CASES) and keys != [c.key for c in suspects.CASES]
    for label in lineup.LABELS:
        text = lineup.interface(label).lower()
        for word in ("tril", "top-left", "tile", "local", "newest", "evict", "visible", "copy-on-write", "rescal"):
            assert word not in text, (label, word)
    same = [lab for lab in lineup.LABELS if lineup.interface(lab).split(": ", 1)[1].startswith("attend(")]
    assert len(same) == 2 and len({lineup.interface(lab).split(": ", 1)[1] for lab in same}) == 1


def test_the_veil_shows_only_the_interface():
    label = next(lab for lab in lineup.LABELS if lineup.case(lab).key == "the newest-first cache")
    cache = lineup.suspect(label)(2, 4)
    for name in ("k", "_seen", "newest_first", "__dict__"):
        with pytest.raises(AttributeError):
            getattr(cache, name)
    block = np.ones((2, 3, 4))
    K, V = cache.append(block, block)
    assert K.shape == (2, 3, 4) and len(cache) == 3 and cache.nbytes == 2 * 3 * 4 * 8 * 2 and cache.Hkv == 2
    out = step(np.ones((2, 8)), *np.ones((3, 8, 8)), cache, 2, 2)  # kvlesson.step takes it like any cache
    assert out.shape == (2, 8) and len(cache) == 5


def test_a_pool_sequence_is_veiled_too():
    label = next(lab for lab in lineup.LABELS if lineup.case(lab).key == "copy-on-write forgotten")
    pool = lineup.suspect(label)(4, 2, 1, 1)
    view = pool.sequence(pool.new_sequence())
    for obj, name in ((view, "pool"), (pool, "refs"), (pool, "_tables")):
        with pytest.raises(AttributeError):
            getattr(obj, name)
    assert len(view) == 0 and pool.blocks_free == 4


def test_explored_suspects_stop_working_while_a_test_is_judged():
    label = next(lab for lab in lineup.LABELS if lineup.case(lab).key == "the top-left mask")
    explored = lineup.suspect(label)
    q, k, v = _qkv(4, 2, 3, 5, 4)

    def compares(suspect):
        assert not np.allclose(suspect(q, k, v), explored(q, k, v))

    outcome = lineup.run(compares, label, "correct")
    assert outcome.status == "crash" and isinstance(outcome.error, RuntimeError) and not outcome.from_suspect
    assert explored(q, k, v).shape == (4, 3, 4)  # and it works again afterwards


def test_run_reports_errors_from_the_suspect_and_restores_the_seal():
    label = next(lab for lab in lineup.LABELS if lineup.case(lab).key == "the top-left mask")

    def bad_shapes(suspect):
        suspect(*_qkv(3, 2, 2, 4, 4))

    outcome = lineup.run(bad_shapes, label, "correct")
    assert outcome.status == "crash" and outcome.from_suspect and outcome.calls == 1
    assert not lineup._State.sealed
    with pytest.raises(ValueError):
        lineup.run(bad_shapes, label, "nonsense")
    with pytest.raises(ValueError):
        lineup.interface("Z")


# ---------------------------------------------------------------------------------------------- the old cheats
# Issue 18: each of these convicted suspects without reading an output, or read the answer. Each must now fail.

MASK = "the top-left mask"


def _label(key):
    return next(lab for lab in lineup.LABELS if lineup.case(lab).key == key)


def _check(key):
    return getattr(checks, f"check_suspect_{_label(key).lower()}")


runs = itertools.count()  # module state a test may keep between the versions it runs on


def counts_its_runs(suspect):
    """Passed versions 0 and 2 of the old fixed order (correct, broken, kvlesson, shifted), failed 1 and 3."""
    suspect(model_tests.q, model_tests.k, model_tests.v)
    assert next(runs) % 4 in (0, 2)


first_output = []


def memoises_the_first_output(suspect):
    """Took the first version's output (the correct twin, in the old order) as the truth."""
    out = suspect(model_tests.q[:, 6:], model_tests.k, model_tests.v)
    if not first_output:
        first_output.append(out)
    assert np.array_equal(out, first_output[0])


def counts_in_a_default(suspect, seen=[]):  # noqa: B006  the mutable default is the point
    suspect(model_tests.q, model_tests.k, model_tests.v)
    seen.append(1)
    assert len(seen) % 4 in (1, 3)


def counts_on_itself(suspect):
    counts_on_itself.n = getattr(counts_on_itself, "n", -1) + 1
    suspect(model_tests.q, model_tests.k, model_tests.v)
    assert counts_on_itself.n % 4 in (0, 2)


def counts_with_a_global(suspect):
    global total
    total = globals().get("total", -1) + 1
    suspect(model_tests.q, model_tests.k, model_tests.v)
    assert total % 4 in (0, 2)


@pytest.mark.parametrize("cheat", [counts_its_runs, memoises_the_first_output, counts_in_a_default, counts_on_itself])
def test_a_test_that_keeps_state_between_versions_convicts_no_one(cheat):
    for label in lineup.LABELS:
        if lineup.interface(label).split(": ", 1)[1].startswith("attend("):
            for _ in range(3):  # any order the shuffle draws
                verdict = getattr(checks, f"check_suspect_{label.lower()}")(cheat)
                assert not verdict and "which is broken" in verdict.problem, verdict


def test_every_version_runs_on_a_fresh_instance_of_the_test():
    outcomes = lineup.judge(counts_with_a_global, _label(MASK))
    assert {o.status for o in outcomes.values()} == {"pass"}  # each copy saw total = 0 in its own namespace
    assert "total" not in globals()


def test_the_order_of_the_versions_is_drawn_for_each_run():
    orders = {tuple(lineup.judge(lambda suspect: None, _label(MASK))) for _ in range(40)}
    assert len(orders) > 1 and all(sorted(o) == sorted(lineup.versions(_label(MASK))) for o in orders)


def test_state_that_cannot_be_copied_is_refused_by_name():
    ticks = (n for n in itertools.count())  # a generator: no copy of it starts over

    def reads_a_generator(suspect):
        suspect(model_tests.q, model_tests.k, model_tests.v)
        assert next(ticks) % 4 in (0, 2)

    verdict = _check(MASK)(reads_a_generator)
    assert not verdict and "reads ticks (generator)" in verdict.problem and "cannot be copied" in verdict.problem


def test_a_suspect_hides_its_implementation_from_introspection():
    """inspect.getclosurevars on the veil, and on the veiled objects' methods, names nothing of the bug."""
    for label in lineup.LABELS:
        found, handed = lineup.case(label), lineup.suspect(label)
        seen = repr(inspect.getclosurevars(handed))
        if found.public is not None:  # a class: look behind an object too
            made = handed(*{"the newest-first cache": (2, 4), "evict before attend": (2, 4, 3),
                            "copy-on-write forgotten": (4, 2, 1, 1)}[found.key])
            seen += repr(inspect.getclosurevars(type(made).__getattr__)) + repr(made)
        for word in ("top_left", "tiled", "layer_local", "newest", "evict", "visible", "Forgets", "rescale", "_attend",
                     "_layer", "_stream", "_padded", "Cache"):
            assert word not in seen, (label, word, seen)


def test_no_module_attribute_maps_labels_to_bugs_and_a_test_cannot_ask():
    for module in (lineup, sys.modules["kvlesson.teaching.drill"]):
        for name, value in vars(module).items():
            assert not (isinstance(value, dict) and set(lineup.LABELS) <= set(value)), name

    def asks_the_lineup(suspect):
        suspect(model_tests.q, model_tests.k, model_tests.v)
        assert sys.modules["kvlesson.teaching.drill.lineup"].case("A")

    outcome = lineup.run(asks_the_lineup, _label(MASK), "correct")
    assert outcome.status == "crash" and "while a test is being judged" in str(outcome.error)


class Seen:
    """Where a test run by the lineup leaves what it read: a class is shared, where a dict would be copied."""

    items = {}


def test_the_shifted_copy_moves_every_number_a_test_can_read():
    cache = lineup.suspect(_label("evict before attend"))(2, 4, 3)  # broken, not shifted: the baseline
    pool = lineup.suspect(_label("copy-on-write forgotten"))(4, 2, 1, 1)

    def reads_everything(suspect):
        made = suspect(2, 4, 3)
        K, V = made.append(np.ones((2, 2, 4)), np.ones((2, 2, 4)))
        Seen.items["cache"] = (K.sum(), len(made), made.nbytes, made.window)

    lineup.run(reads_everything, _label("evict before attend"), "shifted")
    K, _ = cache.append(np.ones((2, 2, 4)), np.ones((2, 2, 4)))
    assert Seen.items["cache"] == (K.sum() * 1.5 + 0.25 * K.size, 3 * 2 + 1, 3 * cache.nbytes + 1, 3 * 3 + 1)

    def reads_the_pool(suspect):
        made = suspect(4, 2, 1, 1)
        a = made.new_sequence()
        made.sequence(a).append(np.ones((1, 3, 1)), np.ones((1, 3, 1)))
        Seen.items["pool"] = (made.blocks_free, made.block_size, made.block_table(a), len(made.sequence(a)), a)

    lineup.run(reads_the_pool, _label("copy-on-write forgotten"), "shifted")
    a = pool.new_sequence()
    pool.sequence(a).append(np.ones((1, 3, 1)), np.ones((1, 3, 1)))
    assert Seen.items["pool"] == (3 * pool.blocks_free + 1, 3 * pool.block_size + 1,
                                  [3 * b + 1 for b in pool.block_table(a)], 3 * 3 + 1, a)  # ids come back as they are


def test_a_recogniser_of_byte_counts_or_block_tables_is_refused():
    """Tests that tell the broken suspect by a number it hands back, not by the right answer, pass on the shifted
    copy: the old shift moved only float arrays, so these convicted."""
    def too_many_bytes(suspect):
        made = suspect(2, 4, 4)
        for _ in range(6):
            made.append(np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))
        assert made.nbytes != 2 * 2 * 4 * 4 * 8  # "not the W = 4 positions the broken one holds"

    def shares_its_last_block(suspect):
        pool = suspect(8, 4, 1, 1)
        a = pool.new_sequence()
        pool.sequence(a).append(*np.arange(12.0).reshape(2, 1, 6, 1))
        b = pool.fork(a)
        pool.sequence(a).append(np.ones((1, 1, 1)), np.ones((1, 1, 1)))
        pool.sequence(b).append(np.ones((1, 1, 1)), np.ones((1, 1, 1)))
        assert pool.block_table(a) != [0, 1]  # "not the table the broken one gives": a copy would be [0, 2]

    for key, test in (("evict before attend", too_many_bytes), ("copy-on-write forgotten", shares_its_last_block)):
        verdict = _check(key)(test)
        assert not verdict, (key, verdict)


# ---------------------------------------------------------------------------------------------- score sheet


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


YES = checks.Verdict(True, summary="ok")


def says(ok):
    """A checker for a small plan: PASS when the answer is True."""
    def check(answer):
        return YES if answer is True else checks.Verdict(False, problem="no")
    return check


def test_the_score_sheet_times_first_passes_and_counts_latest_verdicts(capsys):
    clock = Clock()
    sheet = ScoreSheet(plan={"one": (1, {"a": says(True), "b": says(True)}), "two": (2, {"c": says(True)}),
                             "three": (5, {})}, clock=clock)
    sheet.start("one")
    assert "Budget 1 min for 2 parts" in capsys.readouterr().out
    clock.now = 30.0
    assert not sheet.check("a", False)
    clock.now = 50.0
    assert sheet.check("a", True) is YES
    clock.now = 70.0
    sheet.check("b", True)
    clock.now = 100.0
    sheet.check("a", True)  # again: the first PASS keeps its time
    sheet.start("two")
    clock.now = 250.0
    sheet.check("c", False)
    report, times = sheet.report(), sheet.times()
    assert "one                2 of 2   none" in report and "two                0 of 1   c" in report
    assert "all checked parts  2 of 3" in report and "three" in report and "self-graded" in report
    assert "one                    1:10 of 1 min OVER; a at 0:50, b at 1:10" in times
    assert "two                    2:30 of 2 min OVER" in times and "three              not started" in times
    assert sheet.verdict("a") is YES and not sheet.verdict("c")
    sheet.check("c", True)
    assert sheet.solved("two") == ["c"]


def test_an_earlier_section_can_be_rechecked_while_a_later_one_runs():
    clock = Clock()
    sheet = ScoreSheet(clock=clock)
    sheet.start("1. Write it cold")
    clock.now = 60.0
    sheet.start("2. Price it")
    clock.now = 90.0
    assert sheet.check("the offset mask", lambda T, S: np.arange(S)[None, :] <= np.arange(S - T, S)[:, None])
    assert sheet.solved("1. Write it cold") == ["the offset mask"]
    assert "the offset mask at 1:30" in sheet.times()
    assert sheet.check("suspect C", _copy_of_test("C"))
    assert "3. Find the bug        0:00 of 40 min; suspect C at 0:00" in sheet.times()  # its clock started now


def _copy_of_test(label):
    """The model test of a suspect, as a learner's own function (the sheet refuses kvlesson's)."""
    test = model_tests.TESTS[lineup.case(label).key]
    return types.FunctionType(test.__code__, dict(test.__globals__, __name__="__main__"), test.__name__)


def test_the_score_sheet_scores_only_verdicts_it_issued():
    """Issue 18: record("step", Verdict(True)) gave 14 of 14. Only the part's own checker can mark it solved."""
    sheet = ScoreSheet(clock=Clock())
    for part in [p for _, parts in PLAN.values() for p in parts]:
        sheet.check(part, lambda *args: checks.Verdict(True))  # an answer that returns a PASS is still an answer
    assert "all checked parts  0 of 14" in sheet.report()
    assert not hasattr(sheet, "record")
    for part, ours in (("step", step), ("a cache", KVCache), ("bytes per token", pricing.kv_bytes_per_token),
                       ("suspect A", model_tests.TESTS[lineup.case("A").key])):
        verdict = sheet.check(part, ours)
        assert not verdict and "kvlesson's own" in verdict.problem
    assert "all checked parts  0 of 14" in sheet.report()


def test_the_score_sheets_plan_cannot_be_edited_after_it_is_made():
    """Issue 29: `sheet.plan[section][1][part] = a checker that always passes` gave 14 of 14; so did editing PLAN."""
    sheet = ScoreSheet(clock=Clock())
    always = lambda answer: checks.Verdict(True, summary="forged")  # noqa: E731
    for section, (_, parts) in sheet.plan.items():
        for part in parts:
            with pytest.raises(TypeError):
                sheet.plan[section][1][part] = always
            with pytest.raises(TypeError):
                PLAN[section][1][part] = always
        with pytest.raises(TypeError):
            sheet.plan[section] = (1, {"x": always})
    with pytest.raises(AttributeError):
        sheet.plan = {"1. Write it cold": (15, {"the offset mask": always})}
    for part in [p for _, parts in PLAN.values() for p in parts]:
        sheet.check(part, lambda *args: None)
    assert "all checked parts  0 of 14" in sheet.report()


def test_a_plan_given_to_a_sheet_is_copied():
    mine = {"one": (1, {"a": says(True)})}
    sheet = ScoreSheet(plan=mine, clock=Clock())
    mine["one"][1]["a"] = lambda answer: YES
    assert not sheet.check("a", False)


def test_the_score_sheet_refuses_what_it_cannot_check():
    sheet = ScoreSheet(clock=Clock())
    with pytest.raises(ValueError):
        sheet.start("5. Lunch")
    with pytest.raises(ValueError):
        sheet.check("suspect Z", lambda suspect: None)
    with pytest.raises(ValueError):
        sheet.verdict("suspect Z")
