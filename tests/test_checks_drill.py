"""Lesson 12 checkers: the pricing checkers name each classic misreading of a config.json, and the suspect checkers
accept a real test while refusing everything that is not one, saying which way it went wrong."""
import numpy as np
import pytest

import kvlesson
from kvlesson import KVCache, attention, step
from kvlesson.teaching import checks
from kvlesson.teaching.checks import drill as drill_checks
from kvlesson.teaching.drill import lineup, model_tests

# ---------------------------------------------------------------------------------------------- pricing, by hand


def head_dim(c, from_width=False, guess=None):
    if from_width:
        return c["hidden_size"] // c["num_attention_heads"]
    return c.get("head_dim") or guess or c["hidden_size"] // c["num_attention_heads"]


def per_token(c, b, heads="num_key_value_heads", factor=2, from_width=False, guess=None):
    return factor * c["num_hidden_layers"] * c[heads] * head_dim(c, from_width, guess) * b


def windowed(c, layer_types=True, flag=True):
    W = c.get("sliding_window")
    if W is None or flag and c.get("use_sliding_window") is False:
        return 0, None
    if layer_types and "layer_types" in c:
        return c["layer_types"].count("sliding_attention"), W
    return c["num_hidden_layers"], W


def at(c, t, b, keep=0, layer_types=True, ignore_window=False, flag=True, **kw):
    n, W = (0, None) if ignore_window else windowed(c, layer_types, flag)
    L = c["num_hidden_layers"]
    return per_token(c, b, **kw) / L * ((L - n) * t + n * min(t, (W or 0) + keep))


def experts_read(c, B, rule="union"):
    """Experts per layer a step of B tokens reads: by the formula, or by one of the slips below."""
    E, k = c.get("num_local_experts"), c.get("num_experts_per_tok")
    if E is None:
        return 0
    return {"union": E * (1 - (1 - k / E) ** B), "one token": k, "no sharing": min(E, k * B), "all": E,
            "with replacement": E * (1 - (1 - 1 / E) ** (k * B)), "linear": k * B}[rule]


def floor(c, p, a, t, B, weights=2, per_sequence=False, kv=True, batch_kv=True, unit=1e3, experts="union", **kw):
    k = c.get("num_experts_per_tok") or 0
    read = p.active + (experts_read(c, B, experts) - k) * p.experts / (c.get("num_local_experts") or 1)
    cache = at(c, t, 2, **kw) * (B if batch_kv else 1) if kv else 0
    return (read * weights * (B if per_sequence else 1) + cache) / a.bandwidth * unit


def test_the_references_pass():
    assert checks.check_config_bytes_per_token(per_token)
    assert checks.check_config_bytes_at(at)
    assert checks.check_config_decode_floor(floor)
    assert checks.check_config_bytes_per_token(lambda c, b: np.int64(per_token(c, b) if b >= 1 else 0) or
                                               per_token(c, b))  # numpy integers are numbers
    for check in (checks.check_config_bytes_per_token, checks.check_config_bytes_at, checks.check_config_decode_floor):
        assert check(check.reference)


def test_the_cases_cover_each_trap():
    names = {name for _, name, _ in drill_checks._bytes_per_token_cases()}
    assert {"Qwen3-32B", "gpt-oss-120b", "Mistral 7B v0.1"} <= names
    contexts = {(name, t) for _, name, t, _ in drill_checks._AT_CASES}
    assert ("Mistral 7B v0.1", 32768) in contexts and ("gpt-oss-120b", 131072) in contexts
    assert ("gpt-oss-120b", 100) in contexts  # inside the window, where W and W - 1 both give the context


@pytest.mark.parametrize("wrong, words", [
    (lambda c, b: per_token(c, b, from_width=True), ["Qwen3-32B", "163,840 B", "hidden_size // num_attention_heads",
                                                     "head_dim"]),
    (lambda c, b: per_token(c, b, heads="num_attention_heads"), ["524,288 B", "query heads"]),
    (lambda c, b: per_token(c, b, factor=1), ["half", "factor 2"]),
    (lambda c, b: per_token(c, b) / c["num_hidden_layers"], ["one layer's worth"]),
    (lambda c, b: per_token(c, b) * 8, ["bits, not bytes"]),
    (lambda c, b: per_token(c, b) / b, ["numbers, not bytes"]),
    (lambda c, b: per_token(c, b) * (1 - windowed(c)[0] / c["num_hidden_layers"]), ["Mistral", "windowed layers"]),
    (lambda c, b: per_token(c, b) + 1, ["131,073 B", "2 (K and V)"]),
    (lambda c, b: per_token(c, b, guess=128), ["Qwen2.5-0.5B", "24,576 B; expected 12,288 B", "as 128",
                                               "896 / 14 = 64"]),
    (lambda c, b: 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * 128 * b,
     ["gpt-oss-120b", "147,456 B; expected 73,728 B"]),
    (lambda c, b: 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * b, ["KeyError"]),
    (lambda c, b: str(per_token(c, b)), ["the string '131072'"]),
    (lambda c, b: None, ["returned None"]),
    (lambda c, b: float("nan"), ["returned nan"]),
])
def test_bytes_per_token_names_the_mistake(wrong, words):
    verdict = checks.check_config_bytes_per_token(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


@pytest.mark.parametrize("wrong, words", [
    (lambda c, t, b: at(c, t, b, ignore_window=True), ["Mistral 7B v0.1 at 32,768", "ignores the sliding window",
                                                       "at most W positions"]),
    (lambda c, t, b: at(c, t, b, flag=False), ["Qwen2.5-0.5B at 65,536", "a window the config switches off",
                                               "use_sliding_window false"]),
    (lambda c, t, b: at(c, t, b, guess=128), ["Qwen2.5-0.5B", "as 128 where the config sets none", "896 / 14 = 64"]),
    (lambda c, t, b: at(c, t, b, keep=-1), ["W - 1", "peak of a decode step"]),
    (lambda c, t, b: at(c, t, b, layer_types=False), ["gpt-oss-120b at 131,072", "windows every layer",
                                                                         "layer_types"]),
    (lambda c, t, b: per_token(c, b) / c["num_hidden_layers"] * (c["num_hidden_layers"] - windowed(c)[0]) * t,
     ["leaves out the windowed layers"]),
    (lambda c, t, b: at(c, t, b, from_width=True), ["Qwen3-32B", "hidden_size // num_attention_heads"]),
    (lambda c, t, b: at(c, t, b, heads="num_attention_heads"), ["query heads"]),
    (lambda c, t, b: at(c, t, b, factor=1), ["K only"]),
    (lambda c, t, b: at(c, t, b) / 2**30, ["in GiB", "return bytes"]),
    (lambda c, t, b: at(c, t, b) / 1e9, ["in GB"]),
    (lambda c, t, b: at(c, t + 1, b), ["Llama 3.1 8B at 8,192", "expected 1,073,741,824 B"]),
    (lambda c, t, b: at(c, max(t, 1), b) if t else 1 / 0, ["ZeroDivisionError", "0 tokens"]),
])
def test_bytes_at_names_the_mistake(wrong, words):
    verdict = checks.check_config_bytes_at(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


@pytest.mark.parametrize("wrong, words", [
    (lambda c, p, a, t, B: floor(c, p, a, t, B, unit=1), ["in seconds", "x 1000"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, per_sequence=True), ["Qwen3-32B", "once per sequence"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, kv=False), ["leaves out the KV cache"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, batch_kv=False), ["reads one sequence's cache"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, ignore_window=True), ["gpt-oss-120b", "ignores the sliding window"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, weights=4), ["4 bytes per weight"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, weights=1), ["1 byte per weight"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, keep=-1), ["gpt-oss-120b", "3.13632 ms; expected 3.13633 ms",
                                                           "W - 1"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, flag=False), ["Qwen2.5-0.5B", "a window the config switches off"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, guess=128), ["Qwen2.5-0.5B", "head dim as 128"]),
    # the mixture of experts, issue 18: a batch reads the union of its tokens' experts
    (lambda c, p, a, t, B: floor(c, p, a, t, B, experts="one token"),
     ["gpt-oss-120b on an H100 SXM, 8,192 tokens, batch 16", "you return 4.51", "expected 29.64", "one token's experts",
      "at least one token picks"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, experts="no sharing"), ["as if no two shared one", "picked by none"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, experts="all"), ["every expert at every batch"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, experts="with replacement"), ["with replacement", "1 - k/E"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B, experts="linear"), ["gpt-oss-120b", "batch 16"]),  # k x B, unbounded
    (lambda c, p, a, t, B: (p.active * 2 + at(c, t, 2) * B) / a.bandwidth * 1e3,  # the old reference itself
     ["batch 16", "one token's experts"]),
    (lambda c, p, a, t, B: floor(c, p, a, t, B) if B == 1 or not p.experts else
     floor(c, p, a, t, B, experts="one token") * 6.57,
     ["gpt-oss-120b", "batch 16", "a batch of a mixture of experts reads more"]),  # near, for no reason: the hint
    (lambda c, p, a, t, B: floor(c, p, a, t, B) * 1.001, ["you return 4.959 ms; expected 4.954 ms", "accel.bandwidth"]),
    (lambda c, p, a, t, B: floor(c, p, a.bandwidth, t, B), ["AttributeError"]),
    (lambda c, p, a, t, B: floor(c, p.active, a, t, B), ["AttributeError"]),  # params is Params, not a number
])
def test_decode_floor_names_the_mistake(wrong, words):
    verdict = checks.check_config_decode_floor(wrong)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


def test_a_candidate_cannot_spoil_the_library_by_changing_its_config():
    def vandal(c, b):
        c["num_hidden_layers"] = 1
        return per_token(c, b)

    assert not checks.check_config_bytes_per_token(vandal)
    assert checks.check_config_bytes_per_token(per_token)


def test_the_pricing_checkers_recognise_an_unfilled_exercise():
    def todo(*args):
        raise NotImplementedError("your turn")

    for check in (checks.check_config_bytes_per_token, checks.check_config_bytes_at, checks.check_config_decode_floor):
        verdict = check(todo)
        assert not verdict and verdict.stub


# ---------------------------------------------------------------------------------------------- find the bug

LABEL = {lineup.case(label).key: label for label in lineup.LABELS}


def check(key):
    """The checker of the suspect whose bug is `key`."""
    return getattr(checks, f"check_suspect_{LABEL[key].lower()}")


def test_every_label_has_a_checker_whose_reference_passes():
    for label in lineup.LABELS:
        checker = getattr(checks, f"check_suspect_{label.lower()}")
        verdict = checker(checker.reference)
        assert verdict and f"Suspect {label} was {lineup.case(label).key}" in verdict.summary, verdict
    assert len(lineup.LABELS) == len([n for n in drill_checks.__all__ if n.startswith("check_suspect_")])


q, k, v = model_tests.q, model_tests.k, model_tests.v
MASK = "the top-left mask"


def never_calls(suspect):
    assert True


def convicts_everyone(suspect):
    suspect(q, k, v)
    raise AssertionError("guilty")


def acquits_everyone(suspect):
    suspect(q, k, v)


def prefill_only(suspect):
    assert np.allclose(suspect(q, k, v), attention(q, k, v))


def crashes(suspect):
    suspect(q, k)  # one argument short


def upside_down(suspect):
    assert not np.allclose(suspect(q[:, 6:], k, v), attention(q[:, 6:], k, v))


def no_argument():
    assert True


def recognises_the_wrong_answer(suspect):
    wrong = np.tril(np.ones((4, 10), bool))  # what the top-left mask gives: the test knows the bug, not the answer
    s = np.where(wrong, np.einsum("htd,hsd->hts", q[:, 6:], np.repeat(k, 2, 0)) / np.sqrt(8), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert not np.allclose(suspect(q[:, 6:], k, v), p / p.sum(-1, keepdims=True) @ np.repeat(v, 2, 0))


def reads_a_private_attribute(suspect):
    assert suspect._impl is not None


def uses_the_lineup(suspect):
    from kvlesson.teaching import drill
    assert drill.interface("A")


def calls_getattr(suspect):
    assert getattr(suspect, "__wrapped__", None) is None


def calls_vars(suspect):
    assert vars(suspect)


def uses_inspect(suspect):
    import inspect
    assert "top_left" not in repr(inspect.getclosurevars(suspect))


def reads_a_traceback(suspect):
    import traceback
    try:
        suspect(q, k)
    except TypeError as e:
        assert "top_left" not in "".join(traceback.format_tb(e.__traceback__))


def borrows_the_reference(suspect):
    checks.check_suspect_d.reference(suspect)


def uses_sys_modules(suspect):
    import sys
    assert sys.modules["kvlesson.teaching.drill.lineup"].case("D")


BROKEN_NAMES = ("evict_first_cache", "padded_attend_pads_visible", "newest_first_cache", "attend_top_left",
                "layer_local", "_ForgetsSharing", "attend_tiled", "stream_no_rescale")


def peeks_by_attrgetter(suspect):
    """Issue 29: convicted all eight suspects without looking at an output, reading the veil's private slot through
    operator.attrgetter with the names as string constants."""
    from operator import attrgetter

    try:
        suspect()  # a call, so that the test is seen to use the suspect
    except Exception:
        pass
    target = attrgetter("cell_contents._target")(attrgetter("__closure__")(suspect)[0])
    assert attrgetter("__qualname__")(target) not in BROKEN_NAMES


def peeks_by_a_computed_attrgetter(suspect):
    import operator

    name = "".join(["_", "target"])
    assert operator.attrgetter(name)(suspect) is not None


@pytest.mark.parametrize("label", lineup.LABELS)
def test_a_test_that_reads_the_veil_through_attrgetter_convicts_nobody(label):
    verdict = getattr(checks, f"check_suspect_{label.lower()}")(peeks_by_attrgetter)
    assert not verdict and "a private attribute that no interface shows" in verdict.problem, repr(verdict)


@pytest.mark.parametrize("test, words", [
    (never_calls, ["never calls suspect", "assert on what it returns"]),
    (convicts_everyone, ["fails on suspect", "on its correct twin alike", "AssertionError: guilty, at line 3 of your "
                                                                          "test", "full recompute"]),
    (acquits_everyone, ["passes on suspect", "which is broken", "1 < T < S"]),
    (prefill_only, ["passes on suspect", "which is broken", "a prefill (T = S)"]),
    (crashes, ["crashed on the correct version", "TypeError", "line 2 of your test", "raised inside the suspect",
               "drill.suspect("]),
    (upside_down, ["passes on suspect", "fails on its correct twin", "upside down"]),
    (no_argument, ["could not be called with the suspect", "exactly one argument"]),
    (recognises_the_wrong_answer, ["every number is moved", "recognises this suspect's wrong answers"]),
    (reads_a_private_attribute, ["reads ._impl", "interface only"]),
    (uses_the_lineup, ["uses kvlesson.teaching.drill"]),
    (calls_getattr, ["uses getattr", "reaches past the interface"]),
    (calls_vars, ["uses vars", "reaches past the interface"]),
    (uses_inspect, ["uses inspect"]),
    (reads_a_traceback, ["uses traceback"]),
    (uses_sys_modules, ["uses sys"]),
    (peeks_by_a_computed_attrgetter, ["uses attrgetter", "reaches past the interface"]),
    (borrows_the_reference, ["its reference test, the answer itself"]),
    ("not a function", ["expected your test function itself", "check_suspect_"]),
])
def test_the_mask_suspect_refuses_what_is_not_a_test(test, words):
    verdict = check(MASK)(test)
    assert not verdict
    for w in words:
        assert w in repr(verdict), repr(verdict)


def test_a_test_that_leans_on_pad_rows_fails_on_kvlessons_own():
    """Pad rows are unspecified: the twin gives each pad its own value, the other version gives 0."""
    def every_row(suspect):
        pads, r = np.array([0, 2]), np.random.default_rng(1)
        qb, kb, vb = (r.standard_normal((2, n, 4, 8)) for n in (4, 2, 2))
        out = suspect(qb, kb, vb, pads)
        assert close_rows(out[1, :, 2:], attention(qb[1, :, 2:], kb[1, :, 2:], vb[1, :, 2:]))
        assert np.abs(out[1, :, :2]).sum() > 0  # the pad rows: the interface promises nothing about them

    verdict = check("pads left visible")(every_row)
    assert not verdict and "kvlesson's own implementation" in repr(verdict) and "does not promise" in repr(verdict)


def close_rows(a, b):
    return np.allclose(a, b, rtol=0, atol=1e-12)


def test_a_test_reading_a_cache_attribute_outside_the_interface_crashes_on_the_twin():
    def reads_k(suspect):
        cache = suspect(1, 1)
        cache.append(np.zeros((1, 2, 1)), np.zeros((1, 2, 1)))
        assert cache.k.shape == (1, 2, 1)

    verdict = check("the newest-first cache")(reads_k)
    assert not verdict and "'k' is not part of this suspect's interface" in repr(verdict)
    assert "interface only" in repr(verdict)


def test_a_test_comparing_with_an_explored_suspect_is_refused():
    explored = lineup.suspect(LABEL[MASK])

    def compares(suspect):
        assert not np.allclose(suspect(q[:, 6:], k, v), explored(q[:, 6:], k, v))

    verdict = check(MASK)(compares)
    assert not verdict and "handed out before the test ran" in repr(verdict)


def test_decode_only_tests_miss_the_sneaky_caches():
    """Prefill plus one-token decode passes the newest-first cache and evict-before-attend: the hints say why."""
    x, Wq, Wk, Wv = model_tests.x, model_tests.Wq, model_tests.Wk, model_tests.Wv

    def decode_only(window):
        def test(suspect):
            cache = suspect(2, 8) if window is None else suspect(2, 8, window)
            got = [step(x[:1], Wq, Wk, Wv, cache, 4, 2)] + [step(x[i:i + 1], Wq, Wk, Wv, cache, 4, 2) for i in
                                                            range(1, 10)]
            assert np.allclose(np.concatenate(got), step(x, Wq, Wk, Wv, KVCache(2, 8), 4, 2, window=window))
        return test

    for key, window, hint in (("the newest-first cache", None, "one decode query sees every key"),
                              ("evict before attend", 4, "chunks of T > 1")):
        verdict = check(key)(decode_only(window))
        assert not verdict and "which is broken" in repr(verdict) and hint in repr(verdict), repr(verdict)


def test_a_test_that_only_forks_at_a_block_boundary_misses_the_pool():
    def boundary(suspect):
        pool = suspect(8, 4, 1, 1)
        a = pool.new_sequence()
        pool.sequence(a).append(np.ones((1, 4, 1)), np.ones((1, 4, 1)))
        b = pool.fork(a)
        for seq, key in ((a, 5.0), (b, 7.0)):
            pool.sequence(seq).append(np.full((1, 1, 1), key), np.full((1, 1, 1), key))
        K, _ = pool.sequence(a).append(np.zeros((1, 0, 1)), np.zeros((1, 0, 1)))
        assert K[0, -1, 0] == 5.0

    verdict = check("copy-on-write forgotten")(boundary)
    assert not verdict and "partly filled" in repr(verdict)


def test_each_suspect_recognises_an_unfilled_test():
    def todo(suspect):
        raise NotImplementedError("your turn")

    for label in lineup.LABELS:
        verdict = getattr(checks, f"check_suspect_{label.lower()}")(todo)
        assert not verdict and verdict.stub


def test_the_package_is_importable_as_the_notebook_uses_it():
    assert kvlesson.teaching.drill.LABELS == lineup.LABELS


def test_the_source_check_reads_a_lambda_not_the_line_around_it():
    """The lambda's source is its whole line, checker call included: only the lambda itself is read."""
    verdict = check(MASK)(lambda suspect: None)
    assert not verdict and "never calls suspect" in verdict.problem
    verdict = check(MASK)(lambda suspect: checks.check_suspect_d.reference(suspect))
    assert not verdict and "the answer itself" in verdict.problem


def test_a_test_may_fail_the_pytest_way_but_a_skip_is_no_verdict():
    """pytest.fail and pytest.skip raise BaseExceptions, which escaped the runner before (issue 18)."""
    def fails_with_pytest(suspect):
        if not np.allclose(suspect(q[:, 6:], k, v), attention(q[:, 6:], k, v), rtol=0, atol=1e-12):
            pytest.fail("not the full recompute")

    def skips(suspect):
        suspect(q, k, v)
        pytest.skip("later")

    assert check(MASK)(fails_with_pytest)
    verdict = check(MASK)(skips)
    assert not verdict and "skipped itself" in verdict.problem and "Skipped: later" in verdict.problem


def test_a_test_that_never_ends_is_stopped(monkeypatch):
    from kvlesson.teaching import verdict as runner

    monkeypatch.setattr(runner, "TIME_LIMIT", 0.2)

    def waits_forever(suspect):
        suspect(q, k, v)
        while True:
            pass

    got = check(MASK)(waits_forever)
    assert not got and "crashed on the correct version" in got.problem and "TimeUp" in got.problem
