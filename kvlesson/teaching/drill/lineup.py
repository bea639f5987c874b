"""The lineup: the suspects under neutral labels, and the one way a candidate's test meets them.

The candidate reads suspect A's interface, may call its broken version to explore it (`suspect("A")`), and writes a
test, `def test_a(suspect): ...`, that raises AssertionError when the implementation it is handed is wrong. The
checker then runs that test on several versions of the same interface (`run`):

    correct    the broken version's twin, the bug switched off: the test must pass
    broken     the suspect: the test must fail (any exception counts, as it does in pytest)
    kvlesson   kvlesson's own implementation, where there is one: the test must pass, or it leans on details
    shifted    the suspect with every array it returns scaled and moved: a test that only recognises the suspect's
               wrong answers ("not equal to what A gave") passes here, where a test of the right answer fails

Whatever the version, the test is handed a veil: a function, or objects that show only the interface's attributes.
A private attribute, or any name the interface does not list, is an AttributeError. While a test runs, the lineup
is sealed: suspects handed out for exploration stop working, so a test cannot compare its suspect with them.
"""
import hashlib
from dataclasses import dataclass

import numpy as np

from kvlesson.teaching.drill.suspects import CASES

__all__ = ["SEED", "LABELS", "labels", "interface", "interfaces", "suspect", "versions", "run", "Outcome"]

SEED = 12
# the seeded shuffle: cases ordered by a hash of the seed and their key, the same on every machine and Python
_ORDER = sorted(CASES, key=lambda c: hashlib.sha256(f"{SEED}:{c.key}".encode()).hexdigest())
LABELS = tuple("ABCDEFGHIJKLMNOP"[: len(_ORDER)])
_LINEUP = dict(zip(LABELS, _ORDER, strict=True))


class _State:
    sealed = False  # True while a candidate's test is being judged


def labels():
    return list(LABELS)


def interface(label):
    """What the candidate is told about one suspect: its signature and what it promises."""
    return f"Suspect {label}: {_case(label).interface}"


def interfaces():
    """Every suspect's interface, in label order."""
    return "\n\n".join(interface(label) for label in LABELS)


def suspect(label):
    """The broken version of one suspect, behind its veil, to explore before writing the test (not while it runs)."""
    case = _case(label)
    return _hand(case.broken, case, _Log(inside=False))


def versions(label):
    """The versions a test of this suspect runs on, in the order the checker runs them."""
    case = _case(label)
    return ("correct", "broken") + (("kvlesson",) if case.also_correct is not None else ()) + ("shifted",)


@dataclass(frozen=True)
class Outcome:
    version: str
    status: str  # "pass"; "fail" (AssertionError); "crash" (any other exception); "stub" (NotImplementedError)
    error: BaseException | None  # what the test raised
    calls: int  # calls into the suspect: its function, constructor, methods and attributes
    from_suspect: bool  # the exception came out of the suspect's own code


def run(test, label, version):
    """Run test(veiled implementation) on one version of suspect `label` -> Outcome. Never raises for the test."""
    case = _case(label)
    if version not in versions(label):
        raise ValueError(f"suspect {label} has no {version!r} version; it has {versions(label)}")
    impl = {"correct": case.correct, "broken": case.broken, "kvlesson": case.also_correct,
            "shifted": case.broken}[version]
    log = _Log(inside=True, shifted=version == "shifted")
    handed = _hand(impl, case, log)
    was, _State.sealed = _State.sealed, True
    try:
        test(handed)
    except Exception as e:  # the candidate's test may raise anything; which one is the answer
        from_suspect = _raised_by(e, log.raised)
        kind = ("stub" if isinstance(e, NotImplementedError) and not from_suspect else
                "fail" if isinstance(e, AssertionError) else "crash")
        return Outcome(version, kind, e, log.calls, from_suspect)
    finally:
        _State.sealed = was
    return Outcome(version, "pass", None, log.calls, False)


def _case(label):
    if label not in _LINEUP:
        raise ValueError(f"no suspect {label!r}; the lineup is {', '.join(LABELS)}")
    return _LINEUP[label]


# ---------------------------------------------------------------------------------------------- the veil


class _Log:
    def __init__(self, inside, shifted=False):
        self.inside, self.shifted = inside, shifted
        self.calls, self.raised = 0, None

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the suspect's behalf: counted, refused from outside while sealed, errors noted."""
        if _State.sealed and not self.inside:
            raise RuntimeError("a test may use only the suspect it is handed: this one was handed out before the "
                               "test ran (drill.suspect), and is switched off while a test is judged")
        self.calls += 1
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noted so the checker can tell the suspect's errors from the test's own
            self.raised = e
            raise

    def result(self, value):
        """What the suspect returns; the shifted version moves every float array it hands back."""
        if not self.shifted:
            return value
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return value * value.dtype.type(1.5) + value.dtype.type(0.25)
        if isinstance(value, tuple):
            return tuple(self.result(v) for v in value)
        return value


def _hand(impl, case, log):
    """What a test is handed: a function, or a maker of veiled objects (the suspect is a class)."""
    if case.public is None:
        return _function(impl, log)
    return _function(impl, log, veil=(case.public, case.views))


def _function(fn, log, veil=None):
    def suspect(*args, **kwargs):
        out = log.call(fn, *args, **kwargs)
        return _veiled(out, *veil, log) if veil is not None else log.result(out)

    return suspect


def _veiled(obj, public, views, log):
    """obj seen through `public` names only; the methods named in `views` hand back veiled objects themselves."""

    def __getattr__(self, name):
        if name not in public:
            shown = ", ".join(sorted(n for n in public if not n.startswith("__")))
            raise AttributeError(f"{name!r} is not part of this suspect's interface (it shows {shown}"
                                 f"{' and len()' if '__len__' in public else ''})")
        value = log.call(getattr, obj, name)
        if callable(value):
            return _function(value, log, veil=(views[name], {}) if name in views else None)
        return value

    body = {"__slots__": (), "__getattr__": __getattr__, "__repr__": lambda self: "<a suspect>"}
    if "__len__" in public:
        body["__len__"] = lambda self: log.call(len, obj)
    return type("Suspect", (), body)()


def _raised_by(error, raised):
    """True when `error` is the exception the suspect raised, or was raised while handling it."""
    seen = set()
    while error is not None and id(error) not in seen:
        if error is raised:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
