"""Checkers for lesson 12, the interview drill: pricing a raw config.json, and the candidate's tests of the suspects.

Pricing. Each checker runs the learner's function on every config of kvlesson.teaching.drill.CONFIGS (a head_dim set
on its own, windows on every layer or on half of them, a dense and a mixture-of-experts model) and rejects any answer
that differs from kvlesson.teaching.drill's reference, which prices through kvlesson.costs.memory. A slip table picks
the hint: head_dim taken as hidden_size // heads, query heads for KV heads, windows ignored or put on every layer, W -
1 for W, seconds for milliseconds, weights read once per sequence, ...

Find the bug. check_suspect_a .. check_suspect_h each take the learner's test, test(suspect) -> None, and run it on
the versions kvlesson.teaching.drill.lineup describes. A test passes when it never touches private names or the
lineup, calls the suspect, passes on the correct twin (and on kvlesson's own implementation, where there is one),
fails on the broken suspect, and also fails on a shifted copy of it, so a test that only recognises the suspect's
wrong answers does not pass. The verdict says which way a test went wrong: it fails on both, passes on both, or
crashes.
"""
import ast
import inspect
import math
import textwrap

from kvlesson.configs import ACCELERATORS
from kvlesson.teaching.drill import lineup, model_tests, pricing
from kvlesson.teaching.verdict import (
    STUB_HINT,
    STUB_PROBLEM,
    Reject,
    Slip,
    Verdict,
    as_number,
    checker,
    distinct_digits,
    passed,
    reject,
    run,
)

__all__ = ["check_config_bytes_per_token", "check_config_bytes_at", "check_config_decode_floor",
           "check_suspect_a", "check_suspect_b", "check_suspect_c", "check_suspect_d", "check_suspect_e",
           "check_suspect_f", "check_suspect_g", "check_suspect_h"]


# ---------------------------------------------------------------------------------------------- pricing


def _shape(c):
    """A config.json dict read by the reference: layers, heads, KV heads, head dim, width, window, windowed layers."""
    s = pricing.spec(c)
    return s.n_layers, s.H, s.Hkv, s.d, c.get("hidden_size"), s.window, s.window_layers


def _kv(c, b, ctx=1, *, d=None, heads=None, factor=2, window="as set", keep=None):
    """Cache bytes with one thing changed, for the slips: the head dim, the heads, the factor 2, or the window rule."""
    L, H, Hkv, dd, D, W, nw = _shape(c)
    per_position = factor * (Hkv if heads is None else heads) * (dd if d is None else d) * b
    if window == "ignored" or W is None:
        return per_position * L * ctx
    held = min(ctx, W if keep is None else keep)
    if window == "every layer":
        return per_position * L * held
    if window == "nothing":
        return per_position * (L - nw) * ctx
    return per_position * ((L - nw) * ctx + nw * held)


def _w_minus_1(c):
    """W - 1 for a windowed config (lesson 07's ring at rest); None, the reference's rule, for one without a window."""
    W = _shape(c)[5]
    return W - 1 if W else None


def _width_head_dim(c):
    L, H, *_ = _shape(c)
    return c["hidden_size"] // H


_TOKEN_SLIPS = [
    Slip("d = hidden_size // heads", lambda c, b: _kv(c, b, d=_width_head_dim(c)),
         "you took the head dim as hidden_size // num_attention_heads",
         "Qwen3-32B and gpt-oss-120b set head_dim on its own (5120 / 64 would be 80, 2880 / 64 would be 45): read "
         "config['head_dim'] when it is there, and only fall back to hidden_size // num_attention_heads without it"),
    Slip("query heads", lambda c, b: _kv(c, b, heads=_shape(c)[1]),
         "that counts the query heads", "the cache holds num_key_value_heads heads, not num_attention_heads"),
    Slip("K only", lambda c, b: _kv(c, b, factor=1), "that is half: K only, or V only",
         "every token leaves a key AND a value in every layer: the factor 2"),
    Slip("one layer", lambda c, b: _kv(c, b) / _shape(c)[0], "that is one layer's worth",
         "every layer keeps its own K and V: times num_hidden_layers"),
    Slip("bits", lambda c, b: _kv(c, b) * 8, "that is 8 times too much: bits, not bytes",
         "bytes_per_element is already in bytes"),
    Slip("elements", lambda c, b: _kv(c, b) / b, "you counted numbers, not bytes", "multiply by bytes_per_element"),
    Slip("windowed layers free", lambda c, b: _kv(c, b, window="nothing"),
         "you left out the windowed layers",
         "per token, a windowed layer grows like any other until its window is full; the window caps the bytes "
         "held at a long context, not what each token adds"),
]


def _bytes_per_token_cases():
    cases = [(f"{name} in bf16 (2 bytes per element)", name, 2) for name in pricing.CONFIGS]
    return cases + [("Llama 3.1 8B in fp8 (1 byte per element)", "Llama 3.1 8B", 1),
                    ("gpt-oss-120b in int4 (0.5 bytes per element)", "gpt-oss-120b", 0.5),
                    ("SmolLM2-135M in float32 (4 bytes per element)", "SmolLM2-135M", 4)]


@checker
def check_config_bytes_per_token(fn):
    """fn(config, bytes_per_element) -> bytes one token adds to the cache; config is a raw config.json dict."""
    cases = [(case, (name, b)) for case, name, b in _bytes_per_token_cases()]
    return _numbers(fn, cases, pricing.kv_bytes_per_token, _TOKEN_SLIPS, "B",
                    "2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x bytes_per_element, with "
                    "head_dim from the config when it sets one",
                    "bytes per token from the raw fields: head_dim read when set, KV heads only, every layer")


check_config_bytes_per_token.reference = pricing.kv_bytes_per_token


_AT_SLIPS = [
    Slip("window ignored", lambda c, t, b: _kv(c, b, t, window="ignored"),
         "that ignores the sliding window",
         "a layer with a window of W holds at most W positions however long the context: min(context, W). Mistral "
         "7B v0.1 windows every layer (sliding_window 4096, no layer_types)"),
    Slip("W - 1", lambda c, t, b: _kv(c, b, t, keep=_w_minus_1(c)),
         "that counts W - 1 positions per windowed layer",
         "W - 1 is what lesson 07's ring keeps between steps; this drill prices the peak of a decode step, when "
         "the newest query reads its own key and the W - 1 before it: min(context, W), as kvlesson.costs.memory does"),
    Slip("window on every layer", lambda c, t, b: _kv(c, b, t, window="every layer"),
         "that windows every layer",
         "when the config has layer_types, only the 'sliding_attention' layers use sliding_window; the "
         "'full_attention' ones keep every position (gpt-oss-120b: 18 of each)"),
    Slip("windowed layers hold nothing", lambda c, t, b: _kv(c, b, t, window="nothing"),
         "that leaves out the windowed layers", "a windowed layer still holds min(context, W) positions"),
    Slip("d = hidden_size // heads", lambda c, t, b: _kv(c, b, t, d=_width_head_dim(c)),
         "you took the head dim as hidden_size // num_attention_heads",
         "read config['head_dim'] when the config sets it (Qwen3-32B: 128, not 5120 / 64 = 80)"),
    Slip("query heads", lambda c, t, b: _kv(c, b, t, heads=_shape(c)[1]),
         "that counts the query heads", "the cache holds num_key_value_heads heads, not num_attention_heads"),
    Slip("K only", lambda c, t, b: _kv(c, b, t, factor=1), "that is half: K only, or V only",
         "a key and a value per position, per layer: the factor 2"),
    Slip("GiB", lambda c, t, b: _kv(c, b, t) / 2**30, "that is the answer in GiB", "return bytes; print in GiB"),
    Slip("GB", lambda c, t, b: _kv(c, b, t) / 1e9, "that is the answer in GB", "return bytes; print in GB"),
]

_AT_CASES = [  # (what, config, context, bytes per element)
    ("Llama 3.1 8B at 8,192 tokens in bf16", "Llama 3.1 8B", 8192, 2),
    ("Qwen3-32B at 32,768 tokens in bf16", "Qwen3-32B", 32768, 2),
    ("Mistral 7B v0.1 at 2,048 tokens in bf16 (inside its window)", "Mistral 7B v0.1", 2048, 2),
    ("Mistral 7B v0.1 at 32,768 tokens in bf16", "Mistral 7B v0.1", 32768, 2),
    ("gpt-oss-120b at 100 tokens in bf16 (inside its window)", "gpt-oss-120b", 100, 2),
    ("gpt-oss-120b at 131,072 tokens in bf16", "gpt-oss-120b", 131072, 2),
    ("SmolLM2-135M at 8,192 tokens in float32", "SmolLM2-135M", 8192, 4),
    ("Llama 3.1 8B at 131,072 tokens in fp8", "Llama 3.1 8B", 131072, 1),
    ("Mistral 7B v0.1 at 0 tokens (an empty cache)", "Mistral 7B v0.1", 0, 2),
]


@checker
def check_config_bytes_at(fn):
    """fn(config, context, bytes_per_element) -> bytes one sequence holds after `context` tokens."""
    cases = [(case, (name, t, b)) for case, name, t, b in _AT_CASES]
    return _numbers(fn, cases, pricing.kv_bytes_at, _AT_SLIPS, "B",
                    "per layer 2 x Hkv x head_dim x bytes_per_element per position; a full layer holds `context` "
                    "positions, a windowed layer min(context, sliding_window)",
                    "one sequence's cache from the raw fields: windows on the right layers, W positions at most")


check_config_bytes_at.reference = pricing.kv_bytes_at


def _floor(c, params, accel, t, batch, *, weights=2, per_sequence=False, kv=None, unit=1e3):
    """The decode floor with one thing changed: bytes per weight, weights per sequence, the KV term, or the unit."""
    kv_bytes = _kv(c, 2, t) * batch if kv is None else kv
    return (params * weights * (batch if per_sequence else 1) + kv_bytes) / accel.bandwidth * unit


_FLOOR_SLIPS = [
    Slip("seconds", lambda c, p, a, t, B: _floor(c, p, a, t, B, unit=1), "that is in seconds",
         "the answer is in milliseconds: seconds x 1000"),
    Slip("weights per sequence", lambda c, p, a, t, B: _floor(c, p, a, t, B, per_sequence=True),
         "that reads the weights once per sequence",
         "one decode step reads every weight once for the whole batch; only the KV cache is per sequence"),
    Slip("no cache", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=0), "that leaves out the KV cache",
         "each step also reads every cached key and value of every sequence: the bytes at `context`, times batch"),
    Slip("one sequence's cache", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t)),
         "that reads one sequence's cache", "each of the `batch` sequences has its own cache: times batch"),
    Slip("window ignored", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, window="ignored") * B),
         "the cache term ignores the sliding window",
         "a windowed layer holds min(context, W) positions, so it reads no more than that"),
    Slip("W - 1", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, keep=_w_minus_1(c)) * B),
         "the cache term counts W - 1 positions per windowed layer",
         "a decode step reads the newest query's own key and the W - 1 before it: min(context, W) per windowed layer"),
    Slip("4-byte weights", lambda c, p, a, t, B: _floor(c, p, a, t, B, weights=4),
         "that counts 4 bytes per weight", "bf16 weights are 2 bytes each: active_params x 2"),
    Slip("1-byte weights", lambda c, p, a, t, B: _floor(c, p, a, t, B, weights=1),
         "that counts 1 byte per weight", "bf16 weights are 2 bytes each: active_params x 2"),
]

_FLOOR_CASES = [  # (what, config, accelerator, context, batch)
    ("Llama 3.1 8B on an H100 SXM, 4,096 tokens, batch 1", "Llama 3.1 8B", "H100 SXM", 4096, 1),
    ("Qwen3-32B on an A100 80GB SXM, 32,768 tokens, batch 4", "Qwen3-32B", "A100 80GB SXM", 32768, 4),
    ("gpt-oss-120b on an H100 SXM, 131,072 tokens, batch 8", "gpt-oss-120b", "H100 SXM", 131072, 8),
    ("Mistral 7B v0.1 on an RTX 4090, 32,768 tokens, batch 2", "Mistral 7B v0.1", "RTX 4090", 32768, 2),
    ("SmolLM2-135M on an Apple M4 Max, 8,192 tokens, batch 32", "SmolLM2-135M", "Apple M4 Max (128 GB)", 8192, 32),
]


@checker
def check_config_decode_floor(fn):
    """fn(config, active_params, accel, context, batch) -> milliseconds per decode step at best, bf16 weights and
    cache; accel is a kvlesson.configs.Accelerator (bandwidth in bytes per second)."""
    cases = [(case, (name, pricing.active_params(name), ACCELERATORS[a], t, b)) for case, name, a, t, b in
             _FLOOR_CASES]
    return _numbers(fn, cases, pricing.decode_floor_ms, _FLOOR_SLIPS, "ms",
                    "(active_params x 2 + batch x the cache bytes at `context`) / accel.bandwidth, in milliseconds",
                    "(weights once + every sequence's cache, windows included) / bandwidth, in milliseconds")


check_config_decode_floor.reference = pricing.decode_floor_ms


def _numbers(fn, cases, reference, slips, unit, hint, summary):
    """Run fn on every case, each config a fresh copy; reject the first wrong answer, with the slip that explains
    every answer when one does (else the one that explains that answer)."""
    answers = []
    for case, (name, *rest) in cases:
        got = as_number(run(fn, pricing.config(name), *rest, case=case), case)
        answers.append((case, (pricing.config(name), *rest), got, reference(pricing.config(name), *rest)))
    wrong = [a for a in answers if not _close(a[2], a[3])]
    if not wrong:
        return passed(summary)
    case, args, got, want = wrong[0]
    shown, expected = distinct_digits(got, want)
    problem = f"for {case} you return {shown} {unit}; expected {expected} {unit}"
    slip = next((s for s in slips if all(_gives(s, a[1], a[2]) for a in answers)), None) \
        or next((s for s in slips if _gives(s, args, got)), None)
    if slip is not None:
        reject(f"{problem}: {slip.problem}", slip.hint)
    reject(problem, hint)


def _gives(slip, args, got):
    try:
        wrong = slip.wrong(*args)
    except Exception:  # a slip that does not apply to this config
        return False
    return wrong is not None and _close(got, float(wrong))


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)




# ---------------------------------------------------------------------------------------------- find the bug

_INTERFACE_ONLY = ("test through the interface only (what drill.interface prints): a private attribute belongs to "
                   "one implementation, and another correct one need not have it")


def _judge(test, label):
    case = lineup._LINEUP[label]
    if not callable(test):
        reject(f"expected your test function itself; got {_kind(test)}",
               f"pass it by name: check_suspect_{label.lower()}(test_{label.lower()})")
    problem = _source_problem(test)
    if problem is not None:
        reject(*problem)
    outcomes = {}
    for version in lineup.versions(label):
        outcome = lineup.run(test, label, version)
        if outcome.status == "stub":
            raise Reject(Verdict(False, problem=STUB_PROBLEM, hint=STUB_HINT, stub=True))
        outcomes[version] = outcome
    if not any(o.calls for o in outcomes.values()):
        first = outcomes["correct"].error
        if isinstance(first, TypeError) and "argument" in str(first) and _line_in(test, first) is None:
            reject(f"your test could not be called with the suspect: {_error(outcomes['correct'], test)}",
                   f"write it as def test_{label.lower()}(suspect): ..., taking exactly one argument, the "
                   "implementation to test")
        reject(f"your test never calls suspect {label}, so it says the same about a broken and a correct one",
               "call the suspect it is handed (test(suspect) gets the implementation), and assert on what it returns")
    right, wrong = outcomes["correct"], outcomes["broken"]
    if right.status != "pass":
        _reject_on_correct(test, label, right, wrong)
    if wrong.status == "pass":
        reject(f"your test passes on suspect {label}, which is broken", case.clue)
    if "kvlesson" in outcomes and outcomes["kvlesson"].status != "pass":
        o = outcomes["kvlesson"]
        reject(f"your test passes on the correct version of suspect {label} but {_how(o, test)} on kvlesson's own "
               "implementation of the same interface",
               "it leans on something the interface does not promise (an attribute it does not list, the exact bytes "
               "held, what pad rows contain): check only what the interface says")
    if outcomes["shifted"].status == "pass":
        reject(f"your test fails on suspect {label} but passes on a copy of it whose outputs are all scaled and "
               "shifted: it recognises this suspect's wrong answers instead of checking the right one",
               "assert that the output equals the right answer (a full recompute with kvlesson.attention, or one "
               "pass through a plain KVCache), not that it differs from what the suspect gave")
    also = " and on kvlesson's own" if "kvlesson" in outcomes else ""
    return passed(f"your test fails on suspect {label} and passes on its correct twin{also}. Suspect {label} was "
                  f"{case.key}: {case.bug} (lesson {case.lesson[:2]}, {case.lesson})")


def _reject_on_correct(test, label, right, wrong):
    if right.status == "fail" and wrong.status != "pass":
        reject(f"your test fails on suspect {label} and on its correct twin alike ({_error(right, test)}): it does "
               "not tell them apart",
               "check the expected values: build them from a full recompute on the same inputs, and compare floats "
               "with a tolerance, e.g. np.allclose(got, want, rtol=0, atol=1e-12) in float64")
    if right.status == "fail":
        reject(f"your test passes on suspect {label}, which is broken, and fails on its correct twin "
               f"({_error(right, test)})",
               "the assertion is upside down, or its expected values are the broken ones: assert what the right "
               "answer is")
    if isinstance(right.error, AttributeError) and "interface" in str(right.error):
        reject(f"your test crashed on the correct version of suspect {label}: {_error(right, test)}", _INTERFACE_ONLY)
    reject(f"your test crashed on the correct version of suspect {label}: {_error(right, test)}",
           "a crash is not a verdict: call the suspect as its interface says, and let only asserts decide; run "
           f"the test on drill.suspect({label!r}) yourself to see where")


def _how(outcome, test):
    return f"fails ({_error(outcome, test)})" if outcome.status == "fail" else f"crashes ({_error(outcome, test)})"


def _error(outcome, test):
    """'AssertionError at line 3 of your test' or 'ValueError: ...' with where it came from."""
    e = outcome.error
    text = str(e).strip().splitlines()
    where = _line_in(test, e)
    return (f"{type(e).__name__}" + (f": {text[0][:160]}" if text else "")
            + (f", at line {where} of your test" if where else "")
            + (", raised inside the suspect" if outcome.from_suspect else ""))


def _line_in(test, error):
    """The line of the test (counted from its def) where `error` passed through, if the test is a plain function."""
    code = getattr(test, "__code__", None)
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno - code.co_firstlineno + 1
        tb = tb.tb_next
    return line


def _source_problem(test):
    """(problem, hint) when the test's own code reads private names or the lineup; None when it does not, or when
    its source cannot be read (the runs still hide everything but the interface)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(test)))
    except Exception:  # a builtin, code made by exec, or a lambda cut out of a longer line
        return None
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name == "drill" or isinstance(node, (ast.Import, ast.ImportFrom)) and _imports_drill(node):
            return ("your test uses kvlesson.teaching.drill, the lineup itself",
                    "a test may use only the suspect it is handed, plus references that know nothing of the lineup "
                    "(kvlesson.attention, step, KVCache, causal_mask, ...)")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return f"your test reads .{node.attr}, which is not part of any interface", _INTERFACE_ONLY
        if isinstance(node, ast.Call) and _reaches_past(node):
            return f"your test calls {node.func.id}(), which reaches past the interface", _INTERFACE_ONLY
    return None


def _reaches_past(call):
    """vars(x), dir(x), or getattr(x, "_name"): ways around the interface."""
    fn = getattr(call.func, "id", None)
    if fn in ("vars", "dir"):
        return True
    name = call.args[1] if fn in ("getattr", "setattr", "hasattr") and len(call.args) > 1 else None
    return isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_")


def _imports_drill(node):
    names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
    return any("drill" in n for n in names)


def _kind(x):
    return f"{type(x).__name__} {x!r:.40}"


def _suspect_checker(label):
    def check(test):
        return _judge(test, label)

    check.__name__ = check.__qualname__ = f"check_suspect_{label.lower()}"
    check.__doc__ = (f"test(suspect) -> None, raising AssertionError when suspect {label} is wrong: it must fail on "
                     f"the broken suspect {label} and pass on its correct twin.")
    guarded = checker(check)
    guarded.reference = model_tests.TESTS[lineup._LINEUP[label].key]
    return guarded


check_suspect_a = _suspect_checker("A")
check_suspect_b = _suspect_checker("B")
check_suspect_c = _suspect_checker("C")
check_suspect_d = _suspect_checker("D")
check_suspect_e = _suspect_checker("E")
check_suspect_f = _suspect_checker("F")
check_suspect_g = _suspect_checker("G")
check_suspect_h = _suspect_checker("H")
