"""The lineup: the suspects under neutral labels, and the one way a candidate's test meets them.

The candidate reads suspect A's interface, may call its broken version to explore it (`suspect("A")`), and writes a
test, `def test_a(suspect): ...`, that raises AssertionError when the implementation it is handed is wrong. The
checker then runs that test on several versions of the same interface (`run`):

    correct    the broken version's twin, the bug switched off: the test must pass
    broken     the suspect: the test must fail (any exception counts, as it does in pytest)
    kvlesson   kvlesson's own implementation, where there is one: the test must pass, or it leans on details
    shifted    the suspect with every number it hands back moved (arrays, lengths, byte counts, block tables, but
               not the ids a test hands back to it): a test that only recognises the suspect's wrong answers
               passes here, where a test of the right answer fails

A verdict must come from what the test observes, so (issue 18):
  - the versions run in a random order, each on a fresh instance of the test (`fresh`): its globals, defaults,
    closure and attributes are copies, so a counter or a memo of the first output starts over on every version;
  - the test is handed a veil: a function, or objects that show only the interface's attributes, closing over an
    opaque handle, so neither its attributes nor inspect.getclosurevars name the implementation behind it;
  - while a test runs, the lineup is sealed: suspects handed out for exploration stop working, and `case(label)`,
    the one way to learn which bug a label hides, refuses to answer. No module attribute maps labels to bugs.
What the veils cannot hide from code that digs (another module's state, a class attribute used as a counter, the
frames of a traceback), the checker's reading of the test's source refuses by name; and the random order leaves
such a test nothing but luck.
"""
import copy
import hashlib
import random
import types
from dataclasses import dataclass

import numpy as np

from kvlesson.teaching import verdict
from kvlesson.teaching.drill.suspects import CASES

__all__ = ["SEED", "LABELS", "labels", "interface", "interfaces", "suspect", "versions", "run", "judge", "case",
           "fresh", "Outcome", "Unfresh"]

SEED = 12
LABELS = tuple("ABCDEFGHIJKLMNOP"[: len(CASES)])


class _State:
    sealed = False  # True while a candidate's test is being judged


def labels():
    return list(LABELS)


def interface(label):
    """What the candidate is told about one suspect: its signature and what it promises."""
    return f"Suspect {label}: {_lookup(label).interface}"


def interfaces():
    """Every suspect's interface, in label order."""
    return "\n\n".join(interface(label) for label in LABELS)


def suspect(label):
    """The broken version of one suspect, behind its veil, to explore before writing the test (not while it runs)."""
    found = _lookup(label)
    return _hand(found.broken, found, _Log(inside=False))


def case(label):
    """The suspects.Case behind `label`: its bug, its clue and its implementations. For the checkers, which tell the
    bug once a test has convicted it; refused while a test runs, so a test cannot read its own answer."""
    if _State.sealed:
        raise RuntimeError("the lineup does not say which bug a label hides while a test is being judged")
    return _lookup(label)


def versions(label):
    """The versions a test of this suspect runs on (the checker runs them in a random order)."""
    return ("correct", "broken") + (("kvlesson",) if _lookup(label).also_correct is not None else ()) + ("shifted",)


@dataclass(frozen=True)
class Outcome:
    version: str
    status: str  # "pass"; "fail" (AssertionError or pytest.fail); "crash" (any other exception, running out of time
    # included); "skip" (pytest.skip: no verdict); "stub" (NotImplementedError from the test itself)
    error: BaseException | None  # what the test raised
    calls: int  # calls into the suspect: its function, constructor, methods and attributes
    from_suspect: bool  # the exception came out of the suspect's own code


class Unfresh(Exception):
    """A test reads state that cannot be copied for each run, so its verdict could depend on the runs before."""

    def __init__(self, name, value, error):
        super().__init__(f"{name} ({type(value).__name__}): {error}")
        self.name, self.value = name, value


def judge(test, label, limit=None):
    """{version: Outcome}: the test on every version of suspect `label`, in a random order, each on a fresh
    instance of the test. Unfresh when the test reads state that cannot be copied."""
    order = list(versions(label))
    random.SystemRandom().shuffle(order)
    return {version: run(test, label, version, limit=limit) for version in order}


def run(test, label, version, limit=None):
    """Run a fresh instance of test(veiled implementation) on one version of suspect `label` -> Outcome.

    Never raises for the test: whatever it raises (KeyboardInterrupt, SystemExit, pytest's outcomes, running past
    `limit` seconds, kvlesson.teaching.verdict.TIME_LIMIT by default) is its Outcome. Unfresh when the test reads
    state that cannot be copied; ValueError for a version the suspect does not have."""
    found = _lookup(label)
    if version not in versions(label):
        raise ValueError(f"suspect {label} has no {version!r} version; it has {versions(label)}")
    impl = {"correct": found.correct, "broken": found.broken, "kvlesson": found.also_correct,
            "shifted": found.broken}[version]
    instance = fresh(test)
    log = _Log(inside=True, shifted=version == "shifted")
    handed = _hand(impl, found, log)
    was, _State.sealed = _State.sealed, True
    try:
        _, e = verdict.attempt(instance, handed, limit=limit)
    finally:
        _State.sealed = was
    if e is None:
        return Outcome(version, "pass", None, log.calls, False)
    from_suspect = _raised_by(e, log.raised)
    return Outcome(version, _status(e, from_suspect), e, log.calls, from_suspect)


def _status(error, from_suspect):
    outcome = verdict.pytest_outcome(error)
    if isinstance(error, NotImplementedError) and not from_suspect:
        return "stub"
    if isinstance(error, AssertionError) or outcome == "fail":
        return "fail"
    if outcome in ("skip", "xfail"):
        return "skip"
    return "crash"  # TimeUp, a TypeError, a KeyboardInterrupt: no verdict on the implementation


def _lookup(label):
    """The Case behind a label: the seeded shuffle, worked out each time rather than kept in a module attribute."""
    order = sorted(CASES, key=lambda c: hashlib.sha256(f"{SEED}:{c.key}".encode()).hexdigest())
    if label not in LABELS:
        raise ValueError(f"no suspect {label!r}; the lineup is {', '.join(LABELS)}")
    return order[LABELS.index(label)]


# ---------------------------------------------------------------------------------------------- fresh instances


def fresh(test):
    """A copy of `test` that shares no state with the test it came from, or with any other copy.

    A Python function is rebuilt from its code with copies of what it can keep state in: the globals it names (in a
    copy of its module's namespace, so `global` rebinds only the copy), its defaults, its closure cells and its
    attributes. Functions it calls from the same namespace are rebuilt the same way; modules, classes and functions
    from elsewhere are shared. Another callable is deep-copied. Unfresh names the first thing that cannot be copied.
    """
    if isinstance(test, types.FunctionType):
        return _rebuilt(test, {id(test.__globals__): dict(test.__globals__)}, {})
    try:
        return copy.deepcopy(test)
    except Exception as e:  # an object deepcopy cannot handle: its state would carry over between runs
        raise Unfresh(getattr(test, "__name__", "your test"), test, e) from None


def _rebuilt(fn, spaces, memo):
    """fn with its own namespace copy (spaces: id of an original namespace -> its copy) and copied state."""
    if id(fn) in memo:
        return memo[id(fn)]
    space = spaces.setdefault(id(fn.__globals__), dict(fn.__globals__))
    cells = tuple(types.CellType(_copied(c.cell_contents, fn.__code__.co_freevars[i], spaces, memo))
                  if _filled(c) else c for i, c in enumerate(fn.__closure__ or ()))
    new = types.FunctionType(fn.__code__, space, fn.__name__, None, cells or None)
    memo[id(fn)] = new
    new.__defaults__ = _copied(fn.__defaults__, "its default arguments", spaces, memo)
    new.__kwdefaults__ = _copied(fn.__kwdefaults__, "its default arguments", spaces, memo)
    new.__dict__.update(_copied(dict(fn.__dict__), "its attributes", spaces, memo))
    new.__qualname__ = fn.__qualname__
    for name in _global_names(fn.__code__):
        if name in fn.__globals__ and space.get(name) is fn.__globals__[name]:
            space[name] = _copied(fn.__globals__[name], name, spaces, memo)
    return new


def _copied(value, name, spaces, memo):
    if isinstance(value, types.FunctionType):
        return _rebuilt(value, spaces, memo) if id(value.__globals__) in spaces else value  # ours, or a library's
    if value is None or isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType, np.ufunc)):
        return value
    try:
        return copy.deepcopy(value, memo)
    except Exception as e:  # a generator, an itertools.count on Python 3.14, a lock: state that carries over
        raise Unfresh(name, value, e) from None


def _filled(cell):
    try:
        _ = cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return False
    return True


def _global_names(code):
    """Names the code (and the functions, lambdas and comprehensions inside it) may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


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
        """What the suspect hands back; the shifted version moves every number in it."""
        return _shifted(value) if self.shifted else value

    @staticmethod
    def unshifted(log):
        """A view of `log` that counts and guards calls the same way but hands results back unmoved."""
        view = _Log(log.inside)
        view.call = log.call
        return view


def _shifted(value):
    """Every number moved: floats to 1.5 x + 0.25, integers to 3 n + 1 (never equal to themselves, never negative),
    inside arrays, tuples and lists too. Text, dtypes, booleans and None stay as they are."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value * value.dtype.type(1.5) + value.dtype.type(0.25)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value * 3 + 1
    if isinstance(value, (bool, np.bool_)):
        return value
    if isinstance(value, (int, np.integer)):
        return value * 3 + 1
    if isinstance(value, (float, np.floating)):
        return value * 1.5 + 0.25
    if isinstance(value, (tuple, list)):
        return type(value)(_shifted(v) for v in value)
    return value


class _Handle:
    """The one thing a veil closes over: the implementation, its log and what it may show, behind names a test's
    source may not read and a repr that says nothing."""

    __slots__ = ("_target", "_log", "_public", "_views", "_handles")

    def __init__(self, target, log, public=None, views=None, handles=frozenset()):
        self._target, self._log, self._public, self._views, self._handles = target, log, public, views or {}, handles

    def __repr__(self):
        return "<a suspect>"


def _hand(impl, found, log):
    """What a test is handed: a function, or a maker of veiled objects (the suspect is a class)."""
    return _function(_Handle(impl, log, found.public, found.views, found.handles))


def _function(handle):
    def suspect(*args, **kwargs):
        return _call(handle, args, kwargs)

    return suspect


def _call(handle, args, kwargs):
    log = handle._log
    out = log.call(handle._target, *args, **kwargs)
    if handle._public is None:
        return log.result(out)
    return _veiled(_Handle(out, log, handle._public, handle._views, handle._handles))


def _veiled(handle):
    """An object that shows only `public` names of the one behind it; methods named in `views` hand back veiled
    objects themselves. len() counts as an attribute read, and is shifted like any number."""
    public = handle._public

    def __getattr__(self, name):
        if name not in public:
            shown = ", ".join(sorted(n for n in public if not n.startswith("__")))
            raise AttributeError(f"{name!r} is not part of this suspect's interface (it shows {shown}"
                                 f"{' and len()' if '__len__' in public else ''})")
        return _attribute(handle, name)

    body = {"__slots__": (), "__getattr__": __getattr__, "__repr__": lambda self: "<a suspect>"}
    if "__len__" in public:
        body["__len__"] = lambda self: handle._log.result(handle._log.call(len, handle._target))
    return type("Suspect", (), body)()


def _attribute(handle, name):
    log = handle._log
    value = log.call(getattr, handle._target, name)
    if not callable(value):
        return log.result(value)
    view = handle._views.get(name)
    if view is not None:
        return _function(_Handle(value, log, view, {}))
    if name in handle._handles:  # an id the test hands back to the suspect: moving it would break the round trip,
        return _function(_Handle(value, _Log.unshifted(log)))  # not test the answer
    return _function(_Handle(value, log))


def _raised_by(error, raised):
    """True when `error` is the exception the suspect raised, or was raised while handling it."""
    seen = set()
    while error is not None and id(error) not in seen:
        if error is raised:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
