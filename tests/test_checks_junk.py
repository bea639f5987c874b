"""Every checker answers with a Verdict, whatever a learner hands it: never an exception, never a PASS for junk.

Hypothesis builds the junk: functions that return None, text, dicts, ragged lists, NaN, arrays of any shape
and dtype, raise any exception (KeyboardInterrupt, SystemExit and pytest.fail too) or never return; classes
whose methods do the same, whose nbytes is a method or a property that raises; and things that are not
functions at all. Checkers are found by walking kvlesson.teaching.checks, so a
new lesson's checkers are covered the day they are exported. A checker whose first parameter is named `cls`
takes a class; the others take a function. Extra parameters (a model) come from EXTRA below.
"""
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlesson.teaching.checks
from kvlesson.teaching import verdict
from kvlesson.teaching.checks import Verdict

CHECKERS = [pytest.param(name, marks=[pytest.mark.model] if "model" in inspect.signature(
               getattr(kvlesson.teaching.checks, name)).parameters else [])
            for name in sorted(name for name in dir(kvlesson.teaching.checks) if name.startswith("check_"))]

EXCEPTIONS = [ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError, RuntimeError,
              RecursionError, StopIteration, AssertionError, OverflowError, MemoryError, LookupError,
              # BaseExceptions, which the runner once let escape (issue 18), pytest's own among them
              KeyboardInterrupt, SystemExit, GeneratorExit, pytest.fail.Exception, pytest.skip.Exception]


def endless(*args, **kwargs):
    """Code that never returns: the runner stops it at its time limit (set short by the `short_limit` fixture)."""
    while True:
        pass


def _arrays():
    dtypes = st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int8, np.bool_, np.complex64, "U3"])
    shapes = st.lists(st.integers(0, 4), max_size=4).map(tuple)
    fills = st.sampled_from([0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e30])
    def make(shape, dtype, fill):
        with np.errstate(all="ignore"):
            return np.full(shape, fill).astype(dtype)
    return st.builds(make, shapes, dtypes, fills)


junk_values = st.one_of(
    st.none(), st.text(max_size=8), st.binary(max_size=4), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.complex_numbers(allow_nan=True),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3), st.sets(st.integers(), max_size=3),
    st.just([[1.0, 2.0], [3.0]]), st.just([[1, "a"], [2, "b"]]), st.just(["1", "2"]), st.just((None, None)),
    st.just(np.array([[1.0, 2.0], [3.0]], dtype=object)), st.just(np.datetime64("2026-01-01")),
    st.lists(st.floats(allow_nan=True), max_size=5), _arrays(),
    st.just(lambda *a, **k: 0), st.just(int),
)


@st.composite
def junk_functions(draw):
    kind = draw(st.sampled_from(["returns", "raises", "no arguments", "not callable", "never returns"]))
    if kind == "never returns":
        return endless
    if kind == "returns":
        value = draw(junk_values)
        return lambda *args, **kwargs: value
    if kind == "raises":
        error = draw(st.sampled_from(EXCEPTIONS))

        def boom(*args, **kwargs):
            raise error("junk")
        return boom
    if kind == "no arguments":
        return lambda: 0
    return draw(junk_values)


@st.composite
def junk_classes(draw):
    kind = draw(st.sampled_from(["methods return junk", "init raises", "nbytes is a method", "nbytes raises",
                                 "len returns junk", "not a class", "empty class", "append never returns"]))
    value = draw(junk_values)
    error = draw(st.sampled_from(EXCEPTIONS))

    def raise_(*args, **kwargs):
        raise error("junk")

    def give(*args, **kwargs):
        return value

    def init(self, *args, **kwargs):
        self.k = self.v = value

    body = {"__init__": init, "append": give, "__len__": lambda self: 0, "nbytes": property(give)}
    if kind == "methods return junk":
        body["__len__"] = give if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else \
            (lambda self: 0)
    elif kind == "init raises":
        body["__init__"] = raise_
    elif kind == "nbytes is a method":
        body["nbytes"] = lambda self: 0
    elif kind == "nbytes raises":
        body["nbytes"] = property(raise_)
    elif kind == "len returns junk":
        body["__len__"] = give
    elif kind == "not a class":
        return value
    elif kind == "empty class":
        body = {}
    elif kind == "append never returns":
        body["append"] = endless
    return type("JunkCache", (), body)


@pytest.fixture
def extra(request):
    """Arguments after the learner's answer, for checkers that need them: the real model, asked for only by the
    checkers that take it (so that those tests, and only those, carry the `model` marker)."""
    return {"model": lambda: request.getfixturevalue("model")}


def _call(check, answer, extra):
    params = list(inspect.signature(check).parameters)[1:]
    args = [extra[p]() for p in params if p in extra]
    return check(answer, *args)


@pytest.fixture
def short_limit(monkeypatch):
    """Code that never returns costs a tenth of a second per example, not the runner's full minute."""
    monkeypatch.setattr(verdict, "TIME_LIMIT", 0.1)


@pytest.mark.parametrize("name", CHECKERS)
def test_checker_never_raises_and_never_passes_junk(name, extra, short_limit):
    check = getattr(kvlesson.teaching.checks, name)
    first = next(iter(inspect.signature(check).parameters))
    strategy = junk_classes() if first == "cls" else junk_functions()

    @settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(strategy)
    def fuzz(answer):
        verdict = _call(check, answer, extra)
        assert isinstance(verdict, Verdict), f"{name} returned {type(verdict).__name__}"
        assert not verdict, f"{name} passed junk: {verdict}"
        assert verdict.problem and "could not make sense" not in verdict.problem, verdict

    fuzz()


@pytest.mark.parametrize("name", CHECKERS)
def test_an_unfilled_exercise_is_recognised_as_one(name, extra):
    check = getattr(kvlesson.teaching.checks, name)
    first = next(iter(inspect.signature(check).parameters))

    def todo(*args, **kwargs):
        raise NotImplementedError("your turn")

    answer = type("Todo", (), {"__init__": todo}) if first == "cls" else todo
    verdict = _call(check, answer, extra)
    assert not verdict and verdict.stub, verdict
