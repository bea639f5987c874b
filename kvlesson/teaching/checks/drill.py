"""Checkers for lesson 12, the interview drill: pricing a raw config.json, and the candidate's tests of the suspects.

Pricing. Each checker runs the learner's function on the configs of kvlesson.teaching.drill.CONFIGS (a head_dim set
on its own, windows on every layer or on half of them, dense models and a mixture of experts) and on two it has not
seen (pricing.HELD_OUT: a head dim of 64 with no head_dim field, a window its use_sliding_window switches off, a
second mixture of experts), and rejects any answer that differs from kvlesson.teaching.drill's reference, which
prices through kvlesson.costs.memory. A slip table picks the hint: head_dim taken as hidden_size // heads or as 128,
query heads for KV heads, windows ignored, switched on against use_sliding_window or put on every layer, W - 1 for
W, seconds for milliseconds, weights read once per sequence, a batch that reads one token's experts, or k x B of
them as if no two tokens shared one, ...

Find the bug. check_suspect_a .. check_suspect_h each take the learner's test, test(suspect) -> None, and run it on
the versions kvlesson.teaching.drill.lineup describes, in a random order, each on a fresh instance of the test. A
test passes when its source reaches for nothing but the interface, it calls the suspect, passes on the correct twin
(and on kvlesson's own implementation, where there is one), fails on the broken suspect, and also fails on a shifted
copy of it, so a test that only recognises the suspect's wrong answers does not pass. The verdict says which way a
test went wrong: it fails on both, passes on both, crashes, skips, or keeps state between runs.
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


def _layout(c, window):
    """(W, windowed layers) under one reading of the config's window fields: the reference's ("as set"), or a slip's."""
    L, *_, W, nw = _shape(c)
    if window == "ignored":
        return None, 0
    if window == "every layer":
        return (W, L) if W else (None, 0)
    if window == "flag ignored" and c.get("sliding_window") is not None:  # windowed whenever a window is written
        return c["sliding_window"], c["layer_types"].count("sliding_attention") if "layer_types" in c else L
    return W, nw


def _kv(c, b, ctx=1, *, d=None, heads=None, factor=2, window="as set", keep=None):
    """Cache bytes with one thing changed, for the slips: the head dim, the heads, the factor 2, or the window rule."""
    L, H, Hkv, dd, D, _, _ = _shape(c)
    W, nw = _layout(c, "as set" if window == "nothing" else window)
    per_position = factor * (Hkv if heads is None else heads) * (dd if d is None else d) * b
    if W is None:
        return per_position * L * ctx
    if window == "nothing":
        return per_position * (L - nw) * ctx
    return per_position * ((L - nw) * ctx + nw * min(ctx, W if keep is None else keep))


def _w_minus_1(c):
    """W - 1 for a windowed config (lesson 07's ring at rest); None, the reference's rule, for one without a window."""
    W = _shape(c)[5]
    return W - 1 if W else None


def _width_head_dim(c):
    return c["hidden_size"] // _shape(c)[1]


def _head_dim_128(c):
    """head_dim when set, else 128, the head dim of every Llama: what an answer fitted to Llama computes."""
    return c.get("head_dim") or 128


def _head_dim_slips(kv):
    """The two misreadings of the head dim, for a checker whose answer is kv(config, *args, d=head dim)."""
    return [
        Slip("d = hidden_size // heads", lambda c, *args: kv(c, *args, d=_width_head_dim(c)),
             "you took the head dim as hidden_size // num_attention_heads",
             "Qwen3-32B and gpt-oss-120b set head_dim on its own (5120 / 64 would be 80, 2880 / 64 would be 45): "
             "read config['head_dim'] when it is there, and only fall back to hidden_size // num_attention_heads "
             "without it"),
        Slip("d = 128 unless set", lambda c, *args: kv(c, *args, d=_head_dim_128(c)),
             "you took the head dim as 128 where the config sets none",
             "128 is Llama's head dim, not a rule: without a head_dim field it is hidden_size // num_attention_heads "
             "(Qwen2.5-0.5B: 896 / 14 = 64)"),
    ]


_TOKEN_SLIPS = [
    *_head_dim_slips(lambda c, b, d: _kv(c, b, d=d)),
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
    cases = [(f"{name} in bf16 (2 bytes per element)", name, 2) for name in (*pricing.CONFIGS, *pricing.HELD_OUT)]
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
         "a layer with a window of W holds at most W positions however long the context. Mistral 7B v0.1 windows "
         "every layer (sliding_window 4096, no layer_types)"),
    Slip("use_sliding_window ignored", lambda c, t, b: _kv(c, b, t, window="flag ignored"),
         "that applies a window the config switches off",
         "use_sliding_window false means no layer uses sliding_window, whatever number it holds: Qwen2.5-0.5B "
         "writes 32,768 there and keeps every position"),
    Slip("W - 1", lambda c, t, b: _kv(c, b, t, keep=_w_minus_1(c)),
         "that counts W - 1 positions per windowed layer",
         "W - 1 is what lesson 07's ring keeps between steps; this drill prices the peak of a decode step, when "
         "the newest query reads its own key and the W - 1 before it: W positions, as kvlesson.costs.memory does"),
    Slip("window on every layer", lambda c, t, b: _kv(c, b, t, window="every layer"),
         "that windows every layer",
         "when the config has layer_types, only the 'sliding_attention' layers use sliding_window; the "
         "'full_attention' ones keep every position (gpt-oss-120b: 18 of each)"),
    Slip("windowed layers hold nothing", lambda c, t, b: _kv(c, b, t, window="nothing"),
         "that leaves out the windowed layers", "a windowed layer still holds the positions its window covers"),
    *_head_dim_slips(lambda c, t, b, d: _kv(c, b, t, d=d)),
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
    ("Qwen2.5-0.5B at 65,536 tokens in bf16 (past the 32,768 of its switched-off sliding_window)", "Qwen2.5-0.5B",
     65536, 2),
    ("Mixtral 8x7B v0.1 at 32,768 tokens in bf16", "Mixtral 8x7B v0.1", 32768, 2),
]


@checker
def check_config_bytes_at(fn):
    """fn(config, context, bytes_per_element) -> bytes one sequence holds after `context` tokens."""
    cases = [(case, (name, t, b)) for case, name, t, b in _AT_CASES]
    return _numbers(fn, cases, pricing.kv_bytes_at, _AT_SLIPS, "B",
                    "per layer 2 x Hkv x head_dim x bytes_per_element per position; a full layer holds `context` "
                    "positions, a windowed layer no more than its window",
                    "one sequence's cache from the raw fields: windows where the config switches them on, on the "
                    "layers it names, W positions at most")


check_config_bytes_at.reference = pricing.kv_bytes_at


def _experts(c, B, rule):
    """Experts per layer a step of B tokens reads, under the reference's rule ("union") or a slip's."""
    E, k = c.get("num_local_experts"), c.get("num_experts_per_tok")
    if not E:
        return 0
    return {"union": E * (1 - (1 - k / E) ** B), "one token": k, "no sharing": min(E, k * B), "every expert": E,
            "with replacement": E * (1 - (1 - 1 / E) ** (k * B))}[rule]


def _floor(c, p, accel, t, batch, *, weights=2, per_sequence=False, kv=None, unit=1e3, experts="union"):
    """The decode floor with one thing changed: bytes per weight, weights per sequence, how many experts a batch
    reads, the KV term, or the unit."""
    k = c.get("num_experts_per_tok") or 0
    read = p.active + (_experts(c, batch, experts) - k) * p.experts / (c.get("num_local_experts") or 1)
    kv_bytes = _kv(c, 2, t) * batch if kv is None else kv
    return (read * weights * (batch if per_sequence else 1) + kv_bytes) / accel.bandwidth * unit


_FLOOR_SLIPS = [
    Slip("seconds", lambda c, p, a, t, B: _floor(c, p, a, t, B, unit=1), "that is in seconds",
         "the answer is in milliseconds: seconds x 1000"),
    Slip("one token's experts", lambda c, p, a, t, B: _floor(c, p, a, t, B, experts="one token"),
         "that reads one token's experts whatever the batch",
         "each token of the batch is routed on its own, so a step reads every expert that any of its tokens picked, "
         "not num_experts_per_tok of them: count the experts of one layer that at least one token picks"),
    Slip("no two tokens share an expert", lambda c, p, a, t, B: _floor(c, p, a, t, B, experts="no sharing"),
         "that reads num_experts_per_tok experts for every token, as if no two shared one",
         "an expert picked by several tokens is read once: what one layer reads is the experts picked at least once, "
         "which grows more slowly than k x batch. Ask how likely a given expert is to be picked by none of them"),
    Slip("every expert", lambda c, p, a, t, B: _floor(c, p, a, t, B, experts="every expert"),
         "that reads every expert at every batch",
         "a small batch picks only some of the experts; one token reads num_experts_per_tok of them"),
    Slip("picks with replacement", lambda c, p, a, t, B: _floor(c, p, a, t, B, experts="with replacement"),
         "that draws a token's experts one at a time with replacement",
         "top-k routing gives each token k different experts, so one token misses a given expert with probability "
         "1 - k/E, not (1 - 1/E)^k"),
    Slip("weights per sequence", lambda c, p, a, t, B: _floor(c, p, a, t, B, per_sequence=True),
         "that reads the weights once per sequence",
         "one decode step reads each weight it needs once for the whole batch; only the KV cache is per sequence"),
    Slip("no cache", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=0), "that leaves out the KV cache",
         "each step also reads every cached key and value of every sequence: the bytes at `context`, times batch"),
    Slip("one sequence's cache", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t)),
         "that reads one sequence's cache", "each of the `batch` sequences has its own cache: times batch"),
    Slip("window ignored", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, window="ignored") * B),
         "the cache term ignores the sliding window",
         "a windowed layer holds no more positions than its window, so a step reads no more than that"),
    Slip("use_sliding_window ignored",
         lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, window="flag ignored") * B),
         "the cache term applies a window the config switches off",
         "use_sliding_window false: no layer is windowed, whatever sliding_window says"),
    Slip("W - 1", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, keep=_w_minus_1(c)) * B),
         "the cache term counts W - 1 positions per windowed layer",
         "a decode step reads the newest query's own key and the W - 1 before it: W per windowed layer"),
    Slip("d = 128 unless set", lambda c, p, a, t, B: _floor(c, p, a, t, B, kv=_kv(c, 2, t, d=_head_dim_128(c)) * B),
         "the cache term takes the head dim as 128 where the config sets none",
         "without head_dim it is hidden_size // num_attention_heads (Qwen2.5-0.5B: 896 / 14 = 64)"),
    Slip("4-byte weights", lambda c, p, a, t, B: _floor(c, p, a, t, B, weights=4),
         "that counts 4 bytes per weight", "bf16 weights are 2 bytes each"),
    Slip("1-byte weights", lambda c, p, a, t, B: _floor(c, p, a, t, B, weights=1),
         "that counts 1 byte per weight", "bf16 weights are 2 bytes each"),
]

_FLOOR_CASES = [  # (what, config, accelerator, context, batch)
    ("Llama 3.1 8B on an H100 SXM, 4,096 tokens, batch 1", "Llama 3.1 8B", "H100 SXM", 4096, 1),
    ("Qwen3-32B on an A100 80GB SXM, 32,768 tokens, batch 4", "Qwen3-32B", "A100 80GB SXM", 32768, 4),
    ("gpt-oss-120b on an H100 SXM, 8,192 tokens, batch 1", "gpt-oss-120b", "H100 SXM", 8192, 1),
    ("gpt-oss-120b on an H100 SXM, 8,192 tokens, batch 16", "gpt-oss-120b", "H100 SXM", 8192, 16),
    ("gpt-oss-120b on an H100 SXM, 131,072 tokens, batch 8", "gpt-oss-120b", "H100 SXM", 131072, 8),
    ("Mistral 7B v0.1 on an RTX 4090, 32,768 tokens, batch 2", "Mistral 7B v0.1", "RTX 4090", 32768, 2),
    ("SmolLM2-135M on an Apple M4 Max, 8,192 tokens, batch 32", "SmolLM2-135M", "Apple M4 Max (128 GB)", 8192, 32),
    ("Qwen2.5-0.5B on an RTX 4090, 65,536 tokens, batch 4", "Qwen2.5-0.5B", "RTX 4090", 65536, 4),
    ("Mixtral 8x7B v0.1 on an A100 80GB SXM, 4,096 tokens, batch 3", "Mixtral 8x7B v0.1", "A100 80GB SXM", 4096, 3),
]


@checker
def check_config_decode_floor(fn):
    """fn(config, params, accel, context, batch) -> milliseconds per decode step at best, bf16 weights and cache;
    params is a kvlesson.teaching.drill.Params(active, experts), accel a kvlesson.configs.Accelerator (bandwidth in
    bytes per second). A mixture of experts is routed uniformly at random, each token on its own."""
    cases = [(case, (name, pricing.params(name), ACCELERATORS[a], t, b)) for case, name, a, t, b in _FLOOR_CASES]
    return _numbers(fn, cases, pricing.decode_floor_ms, _FLOOR_SLIPS, "ms",
                    "(the weights the step reads x 2 + batch x the cache bytes at `context`) / accel.bandwidth, in "
                    "milliseconds; params.active is what one token reads, and a batch of a mixture of experts reads "
                    "more than one token does",
                    "(weights once, a batch's union of experts, every sequence's cache, windows included) / "
                    "bandwidth, in milliseconds")


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
    found = lineup.case(label)
    if not callable(test):
        reject(f"expected your test function itself; got {_kind(test)}",
               f"pass it by name: check_suspect_{label.lower()}(test_{label.lower()})")
    problem = _source_problem(test)
    if problem is not None:
        reject(*problem)
    try:
        outcomes = lineup.judge(test, label)
    except lineup.Unfresh as e:
        reject(f"your test reads {e.name} ({type(e.value).__name__}), state that cannot be copied for each run, so "
               "its verdict on one implementation could depend on the runs before it",
               "a test must say the same about an implementation however often it runs: build what it needs inside "
               "the test, and keep no counters, iterators or memos outside it")
    if any(o.status == "stub" for o in outcomes.values()):
        raise Reject(Verdict(False, problem=STUB_PROBLEM, hint=STUB_HINT, stub=True))
    if not any(o.calls for o in outcomes.values()):
        first = outcomes["correct"].error
        if isinstance(first, TypeError) and "argument" in str(first) and _line_in(test, first) is None:
            reject(f"your test could not be called with the suspect: {_error(outcomes['correct'], test)}",
                   f"write it as def test_{label.lower()}(suspect): ..., taking exactly one argument, the "
                   "implementation to test")
        reject(f"your test never calls suspect {label}, so it says the same about a broken and a correct one",
               "call the suspect it is handed (test(suspect) gets the implementation), and assert on what it returns")
    skipped = next((o for o in outcomes.values() if o.status == "skip"), None)
    if skipped is not None:
        reject(f"your test skipped itself on one version of suspect {label} ({_error(skipped, test)}): a skip is no "
               "verdict", "let the test pass or fail: assert what the right answer is")
    right, wrong = outcomes["correct"], outcomes["broken"]
    if right.status != "pass":
        _reject_on_correct(test, label, right, wrong)
    if wrong.status == "pass":
        reject(f"your test passes on suspect {label}, which is broken", found.clue)
    if "kvlesson" in outcomes and outcomes["kvlesson"].status != "pass":
        o = outcomes["kvlesson"]
        reject(f"your test passes on the correct version of suspect {label} but {_how(o, test)} on kvlesson's own "
               "implementation of the same interface",
               "it leans on something the interface does not promise (an attribute it does not list, the exact bytes "
               "held, what pad rows contain): check only what the interface says")
    if outcomes["shifted"].status == "pass":
        reject(f"your test fails on suspect {label} but passes on a copy of it whose every number is moved (its "
               "outputs, lengths, byte counts and block tables): it recognises this suspect's wrong answers "
               "instead of checking the right one",
               "assert that the output equals the right answer (a full recompute with kvlesson.attention, or one "
               "pass through a plain KVCache), not that it differs from what the suspect gave")
    also = " and on kvlesson's own" if "kvlesson" in outcomes else ""
    return passed(f"your test fails on suspect {label} and passes on its correct twin{also}. Suspect {label} was "
                  f"{found.key}: {found.bug} (lesson {found.lesson[:2]}, {found.lesson})")


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


# names a test has no business with: the machinery of introspection, and ways to run or import code by name
_PAST_THE_INTERFACE = frozenset({"inspect", "sys", "gc", "importlib", "traceback", "ctypes", "builtins", "globals",
                                 "locals", "vars", "dir", "eval", "exec", "compile", "breakpoint"})


def _source_problem(test):
    """(problem, hint) when the test's own code reads private names, the lineup, or the machinery that digs behind
    the veil (inspect, sys, gc, tracebacks, getattr with a computed name, ...); None when it does not, or when its
    source cannot be read (the runs still hide everything but the interface)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(test)))
    except Exception:  # a builtin, code made by exec, or a lambda cut out of a longer line
        return None
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    own = [n for n in scopes if getattr(n, "name", "<lambda>") == test.__name__]  # not the line around a lambda
    for node in (n for scope in own or [tree] for n in ast.walk(scope)):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        imported = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        imported += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if name == "drill" or any("drill" in n for n in imported):
            return ("your test uses kvlesson.teaching.drill, the lineup itself",
                    "a test may use only the suspect it is handed, plus references that know nothing of the lineup "
                    "(kvlesson.attention, step, KVCache, causal_mask, ...)")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return f"your test reads .{node.attr}, which is not part of any interface", _INTERFACE_ONLY
        private = _private_name(node)
        if private is not None:  # operator.attrgetter("_target"), getattr(x, NAME) with NAME = "_log", ...
            return (f"your test names {private!r} in a string, a private attribute that no interface shows",
                    _INTERFACE_ONLY)
        if isinstance(node, ast.Attribute) and node.attr == "reference" or name and name.startswith("check_suspect"):
            return ("your test uses a checker or its reference test, the answer itself",
                    "write the test yourself: a full recompute on an input the bug cannot hide from")
        dug = next((n.split(".")[0] for n in imported if n.split(".")[0] in _PAST_THE_INTERFACE), None)
        if isinstance(node, ast.Name) and (node.id in _PAST_THE_INTERFACE or node.id.startswith("__")):
            dug = node.id
        if isinstance(node, ast.Call) and _reaches_past(node):
            dug = getattr(node.func, "id", None) or node.func.attr
        if dug is not None:
            return (f"your test uses {dug}, which reaches past the interface",
                    f"{_INTERFACE_ONLY}; a test judges what the suspect does, not how it is built")
    return None


def _reaches_past(call):
    """getattr(x, name) and its kin with a name that is computed or private, and operator.attrgetter or
    methodcaller with a computed name: ways around the interface."""
    fn = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
    if fn in ("attrgetter", "methodcaller"):
        names = call.args[:1] if fn == "methodcaller" else call.args
        return not names or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in names)
    if fn not in ("getattr", "setattr", "hasattr", "delattr") or len(call.args) < 2:
        return False
    name = call.args[1]
    return not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or name.value.startswith("_")


def _private_name(node):
    """The private part of a string constant that reads as an attribute path ('_target', 'a.__closure__'), or None.
    Messages and other text are not attribute paths, so they pass."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return None
    parts = node.value.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    return next((p for p in parts if p.startswith("_") and p.strip("_")), None)  # "_" alone is a separator


def _kind(x):
    return f"{type(x).__name__} {x!r:.40}"


def _suspect_checker(label):
    def check(test):
        return _judge(test, label)

    check.__name__ = check.__qualname__ = f"check_suspect_{label.lower()}"
    check.__doc__ = (f"test(suspect) -> None, raising AssertionError when suspect {label} is wrong: it must fail on "
                     f"the broken suspect {label} and pass on its correct twin.")
    guarded = checker(check)
    guarded.reference = model_tests.TESTS[lineup.case(label).key]
    return guarded


check_suspect_a = _suspect_checker("A")
check_suspect_b = _suspect_checker("B")
check_suspect_c = _suspect_checker("C")
check_suspect_d = _suspect_checker("D")
check_suspect_e = _suspect_checker("E")
check_suspect_f = _suspect_checker("F")
check_suspect_g = _suspect_checker("G")
check_suspect_h = _suspect_checker("H")
