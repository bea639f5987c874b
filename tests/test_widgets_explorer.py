"""Every explorer fills its output from the kernel, so that a scripted run never has to answer it (issue 32).

With `ipywidgets.interactive_output`, the explorer's first drawing was captured into an Output widget; nbclient, which
runs a notebook for `jupyter nbconvert --execute`, nbval's kernel-less cousins and nbgrader's autograde, then plays the
front end and sends a comm message back on the kernel's shell socket for every captured output. That send goes
through a plain socket sharing the asyncio one nbclient waits on for the cell's reply, and can swallow the reply's
edge-triggered wake-up: lesson 04's cell hung in 12 of 27 runs. The test runs each explorer through nbclient, as
nbconvert does, and counts what nbclient's stand-in for the Output widget sends: nothing, now; one message per output
before (three for lesson 04's explorer).
"""
import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipywidgets")

from nbclient.output_widget import OutputWidget  # noqa: E402

from kvlesson.teaching.widgets.explorer import shown  # noqa: E402

EXPLORERS = {  # lesson: its explorer cell
    "02": "from kvlesson.teaching.widgets.flops import flops_explorer\nflops_explorer(prompt=1000, generated=1000)",
    "04": "from kvlesson.teaching.widgets.mask import mask_explorer\nmask_explorer(T=3, S=7)",
    "05": "from kvlesson.teaching.widgets.calculator import calculator\ncalculator()",
    "06": "from kvlesson.teaching.widgets.rope import rope_explorer\nrope_explorer(d=64)",
    "07": "from kvlesson.teaching.widgets.window import window_explorer\nwindow_explorer()",
}


@pytest.mark.slow
def test_no_explorer_makes_nbclient_write_to_the_kernel(monkeypatch):
    sent = []
    monkeypatch.setattr(OutputWidget, "send", lambda self, data=None, *a, **k: sent.append(data))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in EXPLORERS.values()])
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3")
    client.execute()
    assert sent == [], f"nbclient answered the explorers {len(sent)} times on the shell socket"
    outputs = [state["outputs"] for state in client.widget_state.values() if "outputs" in state]
    assert len(outputs) == len(EXPLORERS)  # one Output widget per explorer, each holding its first drawing
    for lesson, got in zip(EXPLORERS, outputs, strict=True):
        kinds = [o["output_type"] for o in got]
        assert kinds and "error" not in kinds, f"lesson {lesson}'s explorer drew {kinds}"
        images = [o for o in got if "image/png" in o.get("data", {})]
        assert lesson == "05" or images[0]["data"]["image/png"].startswith("iVBOR"), lesson  # a base64 PNG


def test_shown_turns_what_show_prints_and_raises_into_outputs():
    """What a slider's callback shows: its printout, and a traceback as text rather than an exception lost in the
    kernel's log (the figures of a real kernel are checked above)."""

    def show(n):
        print(f"table {n}")
        if n < 0:
            raise ValueError("bad n")

    assert shown(show, n=3) == ({"output_type": "stream", "name": "stdout", "text": "table 3\n"},)
    out, err = shown(show, n=-1)
    assert out["text"] == "table -1\n" and err["name"] == "stderr" and "ValueError: bad n" in err["text"]
