"""Lesson 16's checkers: right answers pass, the wrong answers learners write are named, junk gets a NOT YET."""
import numpy as np
import pytest

from kvlesson.teaching import checks


def nucleus(p, top_p):
    p = np.asarray(p, np.float64)
    ordered = np.sort(p)[::-1]
    cut = ordered[min(int(np.searchsorted(np.cumsum(ordered), top_p * p.sum() - 1e-12)), p.size - 1)]
    kept = np.where(p >= cut, p, 0.0)
    return kept / kept.sum()


def test_a_right_nucleus_passes():
    assert checks.check_nucleus(nucleus)
    assert checks.check_nucleus(lambda p, top_p: list(nucleus(p, top_p)))  # a list of floats is fine


@pytest.mark.parametrize("wrong, says", [
    (lambda p, t: (lambda o: (lambda n: np.where(np.isin(np.arange(len(p)), o[:n]), p, 0) /
                              p[o[:n]].sum())(int(np.searchsorted(np.cumsum(p[o]), t - 1e-12)) + 1))(
        np.argsort(-np.asarray(p), kind="stable")), "equally probable"),
    (lambda p, t: np.where(np.asarray(p) >= nucleus(p, t)[nucleus(p, t) > 0].min() * 0 + 0, 1, 0), "rescale|differ|"
     "expected"),
    (lambda p, t: np.where(nucleus(p, t) > 0, p, 0.0), "does not sum to 1"),
    (lambda p, t: (lambda x: x / x.sum() if x.sum() else x)(np.where(np.asarray(p) >= t, p, 0.0)), "own probability"),
    (lambda p, t: np.asarray(p), "expected"),
])
def test_wrong_nuclei_are_named(wrong, says):
    v = checks.check_nucleus(wrong)
    assert not v and v.hint
    assert any(s in v.message for s in says.split("|")), v.message


@pytest.mark.parametrize("junk", [None, "0.25", [[0.1], [0.2, 0.3]], np.array([np.nan] * 6), {"a": 1}, 3.0])
def test_junk_nuclei_get_a_not_yet(junk):
    v = checks.check_nucleus(lambda p, t: junk)
    assert not v and v.hint


def returned(tables, aborted):
    others = {b for s, t in tables.items() if s != aborted for b in t}
    return sorted(set(tables[aborted]) - others)


def test_right_abort_blocks_pass():
    assert checks.check_abort_blocks(returned)
    assert checks.check_abort_blocks(lambda t, a: set(returned(t, a)))


@pytest.mark.parametrize("wrong, says", [
    (lambda t, a: sorted(set(t[a])), "another sequence still reads"),
    (lambda t, a: sorted(set(t[a]) & {b for s, x in t.items() if s != a for b in x}), "kept its own"),
    (lambda t, a: [], "gave back nothing"),
    (lambda t, a: list(t[a]) + list(t[a]), "twice"),
    (lambda t, a: t.pop(a), "changed the block tables"),
])
def test_wrong_abort_blocks_are_named(wrong, says):
    v = checks.check_abort_blocks(wrong)
    assert not v and says in v.message, v.message


@pytest.mark.parametrize("junk", [None, "0, 1", [1.5], [True], {"a": 1}, np.array([[1]]), 7])
def test_junk_abort_blocks_get_a_not_yet(junk):
    v = checks.check_abort_blocks(lambda t, a: junk)
    assert not v and v.hint
