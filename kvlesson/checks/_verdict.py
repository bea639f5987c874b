"""What every checker returns: a pass, or what is wrong and a hint at why."""
import numpy as np


class Verdict:
    """Shows as one friendly message in a notebook; truthy when the answer passed.

    Inside a checker, test a helper's result with `is not None` (not `or`): a failed Verdict is falsy.
    """

    def __init__(self, ok, message):
        self.ok, self.message = ok, message

    def __bool__(self):
        return self.ok

    def __repr__(self):
        return self.message


def passed(what):
    return Verdict(True, f"PASS: {what}")


def failed(problem, hint=None):
    return Verdict(False, f"NOT YET: {problem}" + (f"\nHint: {hint}" if hint else ""))


def call(fn, *args, **kwargs):
    """Run the learner's function; a crash becomes a failed Verdict instead of a traceback wall."""
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:  # a student copy, not yet filled in
        return None, failed("your code still raises NotImplementedError",
                            "replace the `raise NotImplementedError(...)` line with your code, "
                            "run that cell, then this one")
    except Exception as e:  # the learner's code may raise anything
        return None, failed(f"your function raised {type(e).__name__}: {e}", "run it on the case above to see where")


def compare(got, want, case, rtol=1e-6, atol=1e-8):
    """Shape, dtype and value checks shared by most checkers; None when they agree."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return failed(f"for {case} the result has shape {got.shape}; expected {want.shape}")
    if got.dtype != want.dtype:
        return failed(f"for {case} the result is {got.dtype}; expected {want.dtype}",
                      "something upcast the array; keep the input dtype end to end")
    if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=False):
        err = np.nanmax(np.abs(got.astype(np.float64) - want)) if np.isfinite(got).all() else float("nan")
        return failed(f"for {case} the values differ from the reference (max abs error {err:.3g})")
    return None
