"""kvlesson.teaching.verdict's runner: whatever a learner's code does, a checker answers with a Verdict.

Issue 18: `run` caught Exception only, so SystemExit, KeyboardInterrupt and pytest's fail and skip (BaseException
subclasses) escaped from a checker, and an endless loop hung it. Each case below is one of those, and each must
come back as a NOT YET that names it, with the interrupt handler as it was before.
"""
import _thread
import signal
import sys
import threading
import time

import nbformat
import pytest
from nbclient import NotebookClient

from kvlesson.teaching import verdict
from kvlesson.teaching.verdict import Verdict, attempt, attribute, checker, passed, plural, run, time_limit


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(verdict, "TIME_LIMIT", 0.3)


@checker
def check_call(fn):
    """A checker as the lessons write them: one guarded call, then a verdict."""
    run(fn, case="the first case")
    return passed("it returned")


def endless():
    while True:
        pass


def swallows_exceptions():
    n = 0
    while True:
        try:
            n += 1
            time.sleep(10)
        except Exception:  # a loop that survives every ordinary error
            pass


def exits():
    sys.exit(3)


def interrupts():
    raise KeyboardInterrupt


def fails_like_pytest():
    pytest.fail("not done")


def skips_like_pytest():
    pytest.skip("later")


def raises_a_generator_exit():
    raise GeneratorExit


@pytest.mark.parametrize("fn, words", [
    (endless, ["the first case", "still running after 0.3 s", "stopped it", "loop that never ends",
               "KVLESSON_TIME_LIMIT"]),
    (swallows_exceptions, ["still running after 0.3 s"]),
    (lambda: time.sleep(30), ["still running after 0.3 s"]),  # a blocking call is cut short too
    (exits, ["called exit()", "SystemExit: 3", "return"]),
    (interrupts, ["interrupted (KeyboardInterrupt)", "run the checker again"]),
    (fails_like_pytest, ["pytest.fail()", "Failed: not done", "AssertionError"]),
    (skips_like_pytest, ["pytest.skip()", "Skipped: later"]),
    (raises_a_generator_exit, ["raised GeneratorExit"]),
])
def test_anything_the_code_raises_or_never_finishing_becomes_a_verdict(fn, words, short_limit):
    before = signal.getsignal(signal.SIGINT)
    start = time.monotonic()
    got = check_call(fn)
    assert isinstance(got, Verdict) and not got.ok and not got.stub
    for w in words:
        assert w in got.message, got.message
    assert time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGINT) is before


def test_code_that_finishes_in_time_passes_and_no_late_interrupt_lands_afterwards(short_limit, monkeypatch):
    monkeypatch.setattr(verdict, "TIME_LIMIT", 0.02)
    outcomes = set()
    for i in range(60):
        def busy(seconds=0.015 + i * 0.0002):  # around the limit
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        outcomes.add(bool(check_call(busy)))
        total = sum(range(100_000))  # a late TimeUp or KeyboardInterrupt would be raised here, outside the check
    assert total and True in outcomes


def test_a_real_interrupt_during_the_call_is_a_verdict_too():
    """Ctrl-C, or Jupyter's stop button, while the learner's code runs: a NOT YET, not a traceback."""
    def interrupt_soon():
        time.sleep(0.1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_soon, daemon=True).start()
    got = check_call(endless)
    assert not got and "interrupted (KeyboardInterrupt)" in got.message


def test_outside_the_main_thread_there_is_no_limit_but_still_a_verdict(short_limit):
    results = []
    worker = threading.Thread(target=lambda: results.append((check_call(lambda: time.sleep(0.5)), check_call(exits))))
    worker.start()
    worker.join(10)
    (slow, exited), = results
    assert slow.ok and not exited and "SystemExit" in exited.message


def test_time_limit_blocks_nest_under_the_outer_one(short_limit):
    with pytest.raises(verdict.TimeUp):
        with time_limit(0.2):
            with time_limit(100):  # the outer limit still bounds the inner block
                endless()
    assert attempt(lambda: 5).value == 5 and isinstance(attempt(endless, limit=0.1).error, verdict.TimeUp)


def test_attribute_is_guarded_the_same_way(short_limit):
    class Cache:
        @property
        def nbytes(self):
            endless()

        @property
        def Hkv(self):
            sys.exit(1)

    @checker
    def check_attr(obj, name):
        attribute(obj, name, "an empty cache")
        return passed("read")

    assert "still running" in check_attr(Cache(), "nbytes").message
    assert "SystemExit" in check_attr(Cache(), "Hkv").message


def test_an_interrupt_outside_the_learners_code_is_reported_not_raised():
    @checker
    def interrupted_checker(fn):
        raise KeyboardInterrupt

    got = interrupted_checker(None)
    assert not got and "interrupted" in got.problem


def test_plural_agrees_with_its_count():
    assert [plural(n, "free block") for n in (0, 1, 2, 1000)] == ["0 free blocks", "1 free block", "2 free blocks",
                                                                  "1,000 free blocks"]
    assert plural(1, "query", "queries") == "1 query" and plural(3, "query", "queries") == "3 queries"


def test_an_endless_loop_is_stopped_inside_a_jupyter_kernel():
    """Cells run in the kernel's main thread; the watchdog's interrupt reaches them there."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from kvlesson.teaching import verdict\n"
        "verdict.TIME_LIMIT = 0.5\n"
        "@verdict.checker\n"
        "def check(fn):\n"
        "    verdict.run(fn, case='one case')\n"
        "    return verdict.passed('done')\n"
        "def endless():\n"
        "    while True:\n"
        "        pass\n"
        "print(check(endless))\n"
        "print(check(lambda: 1))")]
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "still running after 0.5 s" in text and "PASS: done" in text, text
