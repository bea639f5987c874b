"""What every checker returns, and the machinery that makes a checker report instead of raise.

A checker is a plain function wrapped in @checker. Inside it, three helpers do all the guarding:

    @checker
    def check_softmax(fn):
        for case, s in cases:
            got = as_array(run(fn, s.copy(), case=case), case)   # the learner's call and its result, guarded
            if not np.allclose(got, want):
                reject(f"for {case} ...", "hint")                 # stop here with a NOT YET
        return passed("what was checked")

  run(fn, ..., case=)   calls the learner's code; NotImplementedError means a student copy not yet filled
                        in; anything else it raises (KeyboardInterrupt, SystemExit and pytest.fail included)
                        becomes a NOT YET that names the case, and so does code still running after
                        TIME_LIMIT seconds
  as_array, as_number   turn whatever came back (a ragged list, a dict, a string, NaN) into numbers, or stop
                        with a NOT YET that says what came back instead
  reject(problem, hint) stops the check with a NOT YET

Known slips (the wrong answers learners write most) live in tables of Slip rows: the wrong computation, and
what to tell a learner whose answer matches it. A slip table only chooses the hint: any answer that
differs from the reference is rejected, whether or not a slip explains it.
"""
import _thread
import contextlib
import functools
import math
import numbers
import os
import queue
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Verdict", "Slip", "checker", "run", "reject", "passed", "failed", "as_array", "as_number",
           "attribute", "first_slip", "reject_slip", "yours_or_ours", "distinct_digits", "plural",
           "attempt", "Attempt", "TimeUp", "time_limit", "TIME_LIMIT", "crash", "pytest_outcome"]

STUB_PROBLEM = "your code still raises NotImplementedError"
STUB_HINT = "replace the `raise NotImplementedError(...)` line with your code, run that cell, then this one"
# seconds one call into a learner's code may take before the checker stops it (KVLESSON_TIME_LIMIT overrides):
# far above any exercise's own run time, the real model's included, and short enough to wait for
TIME_LIMIT = float(os.environ.get("KVLESSON_TIME_LIMIT", "60"))


@dataclass(frozen=True)
class Verdict:
    """A pass, or what is wrong and a hint at why. Truthy only when it passed, so `assert check(...)` works."""

    ok: bool
    problem: str = ""  # what is wrong, for the first case that went wrong
    hint: str = ""  # why that happens, and what to change
    stub: bool = False  # the exercise is still a student copy's `raise NotImplementedError`
    summary: str = ""  # on a pass: what was checked

    def __bool__(self):
        return self.ok

    @property
    def message(self):
        if self.ok:
            return f"PASS: {self.summary}"
        return f"NOT YET: {self.problem}" + (f"\nHint: {self.hint}" if self.hint else "")

    def __repr__(self):
        return self.message

    def require(self):
        """This verdict if it passed; else AssertionError carrying its message and hint.

        The one way a verdict raises, for a grader that counts a cell that raises as a failed test (nbgrader's test
        cells end with `verdict.require()`); the checker itself still never raises.
        """
        __tracebackhide__ = True  # IPython and pytest then show the test cell's line, not this one
        if not self.ok:
            raise AssertionError(self.message)
        return self


def yours_or_ours(yours, verdict, ours, exercise):
    """Your function once its checker passed, else kvlesson's own, with a one-line note naming the exercise.

    Later cells that build on an exercise call this, so a learner who skipped it reads on with a working
    function instead of a NotImplementedError traceback:  attend = checks.yours_or_ours(my_gqa, v, attention,
    "Your turn 2").
    """
    if isinstance(verdict, Verdict) and verdict.ok:
        return yours
    print(f"(These cells use kvlesson's version until {exercise} passes its checker.)")
    return ours


def passed(summary):
    return Verdict(True, summary=summary)


def failed(problem, hint=""):
    return Verdict(False, problem=problem, hint=hint)


class Reject(Exception):
    """Raised inside a checker to stop it with a NOT YET; @checker turns it back into its Verdict."""

    def __init__(self, verdict):
        super().__init__(verdict.problem)
        self.verdict = verdict


def reject(problem, hint=""):
    raise Reject(failed(problem, hint))


def checker(check):
    """Make `check` total: whatever the learner passed or returned, the answer is a Verdict, never an exception.

    numpy warnings are silenced inside (the verdict reports nan and overflow itself). An exception that
    escapes the checker's own logic means it met an answer it could not read; that too becomes a NOT YET.
    Set KVLESSON_CHECKS_RAISE=1 to see such exceptions instead, when working on a checker.
    """

    @functools.wraps(check)
    def guarded(*args, **kwargs):
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                verdict = check(*args, **kwargs)
        except Reject as r:
            return r.verdict
        except BaseException as e:  # the learner's objects may raise anything, wherever the checker touches them
            if os.environ.get("KVLESSON_CHECKS_RAISE"):
                raise
            if isinstance(e, KeyboardInterrupt):
                return failed("the check was interrupted before it reached a verdict", "run the checker again")
            return failed(f"the checker could not make sense of your answer ({type(e).__name__}: {_short(e)})",
                          "return what the exercise asks for, of the type its docstring gives; run your function "
                          "on one small case and look at what it returns")
        if not isinstance(verdict, Verdict):  # a checker that forgot to return: a bug in kvlesson
            return failed(f"{check.__name__} reached no verdict", "please report this as a kvlesson bug")
        return verdict

    guarded.is_checker = True
    return guarded


def run(fn, *args, case, crash_hint=None, **kwargs):
    """Call the learner's `fn(*args, **kwargs)` for `case`; any failure becomes a NOT YET.

    crash_hint(exception) -> str or None may give a more specific hint for a crash it recognises (an ordinary
    Exception; an interrupt, exit(), pytest's outcomes and the time limit have hints of their own).
    """
    if not callable(fn):
        reject(f"expected your function (or class) itself; got {_describe(fn)}",
               "pass it by name without calling it: check_x(my_function), not check_x(my_function())")
    done = attempt(fn, *args, **kwargs)
    if done.error is None:
        return done.value
    if isinstance(done.error, NotImplementedError):
        raise Reject(Verdict(False, problem=STUB_PROBLEM, hint=STUB_HINT, stub=True)) from None
    reject(*crash(done.error, case, crash_hint))


class Attempt(NamedTuple):
    value: Any  # what the call returned (None when it raised)
    error: BaseException | None  # what it raised instead, TimeUp when it ran out of time


def attempt(fn, *args, limit=None, **kwargs):
    """fn(*args, **kwargs), under a time limit of `limit` seconds (TIME_LIMIT when None) -> Attempt(value, error).

    Whatever the call raises is caught and handed back, BaseExceptions included: KeyboardInterrupt, SystemExit,
    pytest's fail and skip, and TimeUp when it ran too long. The one way to run a learner's code.
    """
    try:
        with time_limit(TIME_LIMIT if limit is None else limit):
            return Attempt(fn(*args, **kwargs), None)
    except BaseException as e:  # the learner's code may raise anything at all
        return Attempt(None, e)


def crash(error, case, crash_hint=None):
    """(problem, hint) for an exception a learner's code raised in `case`."""
    kind = type(error).__name__
    if isinstance(error, TimeUp):
        return (f"for {case} your code was still running after {error.seconds:g} s, so the checker stopped it",
                "look for a loop that never ends (a while whose condition never changes, a counter that never "
                "moves) or a recursion without a base case; the limit is kvlesson.teaching.verdict.TIME_LIMIT "
                "(set KVLESSON_TIME_LIMIT to change it)")
    if isinstance(error, KeyboardInterrupt):
        return (f"for {case} your code was interrupted (KeyboardInterrupt)",
                "if you stopped it, run the checker again; if your code raises KeyboardInterrupt itself, let it "
                "return its answer instead")
    if isinstance(error, SystemExit):
        return (f"for {case} your code called exit() (SystemExit: {error.code!r})",
                "exit() and sys.exit() end the whole program: a function hands back its answer with return")
    outcome = pytest_outcome(error)
    if outcome is not None:
        return (f"for {case} your code called pytest.{outcome}() ({kind}: {_short(error)})",
                "pytest.fail and pytest.skip mean something only inside a pytest run; here a function returns its "
                "answer, and a test fails by raising AssertionError (an assert)")
    hint = crash_hint(error) if crash_hint is not None and isinstance(error, Exception) else None
    return f"for {case} your code raised {kind}: {_short(error)}", hint or "run it on that input yourself to see where"


def pytest_outcome(error):
    """'fail', 'skip', 'xfail' or 'exit' for the exceptions pytest's functions raise (BaseExceptions, so that a
    test's `except Exception` cannot swallow them); None for anything else. pytest itself is not imported."""
    names = {"Failed": "fail", "Skipped": "skip", "XFailed": "xfail", "Exit": "exit"}
    mro = type(error).__mro__
    if any(cls.__module__.startswith("_pytest") for cls in mro):  # pytest sets Failed.__module__ to "builtins"
        return next((names[cls.__name__] for cls in mro if cls.__name__ in names), None)
    return None


# ---------------------------------------------------------------------------------------------- the time limit


class TimeUp(BaseException):
    """Raised into a learner's code still running when its time limit passed. A BaseException, like
    KeyboardInterrupt, so that an `except Exception:` in the learner's loop does not swallow it."""

    def __init__(self, seconds):
        super().__init__(f"still running after {seconds:g} s")
        self.seconds = seconds


_limits = threading.local()  # .depth: how many time_limit blocks are open in this thread


@contextlib.contextmanager
def time_limit(seconds):
    """Raise TimeUp in the block's thread once `seconds` have passed, until the block ends.

    A watchdog thread interrupts the main thread with _thread.interrupt_main(), the mechanism behind Ctrl-C,
    which works on every platform (Windows has no SIGALRM) and inside Jupyter, whose kernel runs cells in the main
    thread. While the block runs, SIGINT's handler is this block's: an interrupt the watchdog sent raises TimeUp,
    any other (Ctrl-C, Jupyter's stop button) KeyboardInterrupt, as before. The watchdog repeats every second, for
    code that swallowed the first TimeUp; code that catches BaseException and loops on cannot be stopped. Python
    can interrupt only Python code, so a long call into C (one huge matmul) ends before TimeUp arrives. Outside the
    main thread, or inside another time_limit block (the outer one bounds it), there is no limit of its own.
    """
    depth = getattr(_limits, "depth", 0)
    if seconds is None or seconds <= 0 or depth or threading.current_thread() is not threading.main_thread():
        _limits.depth = depth + 1
        try:
            yield
        finally:
            _limits.depth = depth
        return
    watch = _Watchdog(seconds)
    try:
        previous = signal.signal(signal.SIGINT, watch.handler)
    except (ValueError, OSError):  # an interpreter that does not let Python handle SIGINT: no limit
        previous = None
    _limits.depth = 1
    try:
        if previous is not None:
            watch.start()
        yield
    finally:
        _limits.depth = 0
        if previous is not None:
            watch.finish()
            signal.signal(signal.SIGINT, previous)


def _interrupt_main():
    """SIGINT for the main thread. Where threads can be signalled (POSIX) a real signal, which also cuts short a
    blocking call such as time.sleep; elsewhere (Windows) _thread.interrupt_main(), which Python checks between
    bytecodes and which Windows' own sleep also wakes for."""
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main(signal.SIGINT)


class _Watchdog:
    def __init__(self, seconds):
        self.seconds = seconds
        self.sent = queue.SimpleQueue()  # one token per interrupt the watchdog sent; SimpleQueue is signal-safe
        self.lock = threading.Lock()
        self.done = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="kvlesson time limit", daemon=True)

    def start(self):
        self.thread.start()

    def _watch(self):
        wait = self.seconds
        while not self.stop.wait(wait):
            with self.lock:
                if self.done:
                    return
                self.sent.put(True)
                _interrupt_main()
            wait = 1.0  # again each second, until the block ends

    def handler(self, signum, frame):
        """SIGINT's handler while the block runs, called in the main thread."""
        try:
            self.sent.get_nowait()
        except queue.Empty:
            raise KeyboardInterrupt from None  # a real interrupt
        if not self.done:
            raise TimeUp(self.seconds)

    def finish(self):
        with self.lock:  # from here on the watchdog sends nothing
            self.done = True
        self.stop.set()
        deadline = time.monotonic() + 1.0
        while not self.sent.empty() and time.monotonic() < deadline:  # an interrupt already on its way lands here,
            time.sleep(0.001)  # in the handler, which sees done and returns


def as_array(x, case, what="your function"):
    """The learner's result -> a numpy array of numbers (bool, int or float), or a NOT YET saying what it was."""
    if x is None:
        reject(f"for {case} {what} returned None", "is the return statement missing?")
    if isinstance(x, (str, bytes)):
        reject(f"for {case} {what} returned text ({_describe(x)})", "return the array itself, not its printout")
    if isinstance(x, (dict, set)) or callable(x):
        reject(f"for {case} {what} returned {_describe(x)}", "return a numpy array")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = np.asarray(x)
    except Exception:
        a = None
    if a is None or a.dtype.kind not in "biuf":
        reject(f"for {case} {what} returned {_describe(x)}, which is not an array of numbers",
               "a list of lists of different lengths, or one that mixes numbers with other things, has no "
               "shape; return a numpy array")
    return a


def as_number(x, case, what="your function", integer=False):
    """The learner's result -> a finite Python float (an int when `integer`), or a NOT YET.

    Text is refused even when it spells a number ("131072"): the exercise asks for the number itself.
    """
    if isinstance(x, np.ndarray) and x.size == 1 and x.dtype.kind in "iuf":
        x = x.reshape(()).item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        hint = ("return the number itself; text that spells a number is not one (drop the f-string or str())"
                if isinstance(x, str) else "return one number (an int or a float)")
        reject(f"for {case} {what} returned {_describe(x)}; expected a number", hint)
    value = float(x)
    if not math.isfinite(value):
        reject(f"for {case} {what} returned {value}", "nan and inf usually come from 0/0 or an overflow: look "
                                                       "for a division by a count that is 0")
    if integer:
        if value != int(value):
            reject(f"for {case} {what} returned {value:g}; expected a whole number", "counts of bytes, tokens and "
                                                                                      "FLOPs are integers")
        return int(value)
    return value


def attribute(obj, name, case, what="your cache"):
    """obj.name, guarded: a property that raises, or a method where a value belongs, becomes a NOT YET."""
    done = attempt(getattr, obj, name)
    value, e = done
    if isinstance(e, NotImplementedError):
        raise Reject(Verdict(False, problem=STUB_PROBLEM, hint=STUB_HINT, stub=True)) from None
    if isinstance(e, (TimeUp, KeyboardInterrupt, SystemExit)) or e is not None and pytest_outcome(e):
        reject(*crash(e, f"{case}, reading {what}.{name},"))
    if e is not None:
        reject(f"for {case} reading {what}.{name} raised {type(e).__name__}: {_short(e)}",
               f"{name} must work at any time, an empty cache included")
    if callable(value):
        reject(f"for {case} {what}.{name} is a method, so {what}.{name} is not a number",
               f"put @property above `def {name}(self)`, so it reads as a value: cache.{name}, not cache.{name}()")
    return value


@dataclass(frozen=True)
class Slip:
    """One well-known wrong answer: what it computes (from the exercise's own inputs) and what to say."""

    name: str  # short, for tests: "no max subtraction"
    wrong: Any  # callable(*inputs) -> the wrong answer, or None where the slip does not apply to these inputs
    problem: str  # what is wrong; {case} is filled in
    hint: str  # why, and what to change


def first_slip(got, slips, inputs, same=None):
    """The first Slip in `slips` whose wrong answer on `inputs` equals `got`; None when none does.

    same(got, wrong) decides equality (default: same shape, allclose with NaN equal to NaN).
    """
    same = same or _same
    for slip in slips:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrong = slip.wrong(*inputs)
            if wrong is not None and same(got, wrong):
                return slip
        except Exception:  # a slip that does not apply to these inputs
            continue
    return None


def reject_slip(slip, case):
    reject(slip.problem.format(case=case), slip.hint)


def plural(n, noun, many=None):
    """'1 free block', '2 free blocks', '0 free blocks': a count and its noun, agreeing. many: an irregular plural."""
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"


def distinct_digits(got, want):
    """Two numbers as text with just enough significant digits (4 to 12) to tell them apart: a hint never reads
    "you return 4.954 ms; expected 4.954 ms"."""
    if float(got).is_integer() and float(want).is_integer() and max(abs(got), abs(want)) < 1e18:
        return f"{int(got):,}", f"{int(want):,}"
    for n in range(4, 13):
        a, b = f"{got:,.{n}g}", f"{want:,.{n}g}"
        if a != b:
            return a, b
    return repr(got), repr(want)


def _same(got, wrong):
    got, wrong = np.asarray(got), np.asarray(wrong)
    if got.shape != wrong.shape or got.dtype.kind not in "biuf" or wrong.dtype.kind not in "biuf":
        return False
    return bool(np.allclose(got, wrong, rtol=1e-5, atol=1e-8, equal_nan=True))


def _describe(x):
    """A short, safe description of whatever came back."""
    if isinstance(x, str):
        return f"the string {x[:40]!r}" + ("..." if len(x) > 40 else "")
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape}, dtype {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)} items"
    if x is None:
        return "None"
    if callable(x) and not isinstance(x, type):
        return f"a function ({getattr(x, '__name__', type(x).__name__)}) rather than its result"
    try:
        text = repr(x)
    except Exception:
        text = "?"
    return f"a {type(x).__name__} ({text[:40]})"


def _short(e):
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""

