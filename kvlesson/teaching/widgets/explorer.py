"""The one shape every explorer takes: rows of controls over the output of a pure function they drive.

    box = explorer(show, {"T": T_slider, "S": S_slider}, {"window": picker})   # one dict per row of controls
    box.controls["T"].value = 4                                                # show(T=4, S=..., window=...) reruns

`show(**values)` draws or prints what one setting looks like; it is the tested function, the widget only moves its
arguments. A notebook saved with the box's output and opened before the cell runs (or a page with no kernel) shows
the box's text form, so that text says what will appear, instead of `VBox(children=(HBox(...`.

What `show` displays and prints is collected in the kernel and handed to the box's Output widget as its `outputs`
(figures first, then the text), never captured with `with out:` as `ipywidgets.interactive_output` does. Issue 32:
a capture makes the front end move each output into the widget; nbclient (nbconvert --execute, nbgrader autograde)
plays that front end by sending a comm message on the kernel's shell socket for each one, through a plain socket
sharing the asyncio one it waits on for the cell's reply. That send can swallow the edge-triggered wake-up of a
reply just arrived, and the cell never returns (lesson 04 hung 12 runs of 27 in issue 32; jupyter/nbclient#312).
Setting `outputs` from the kernel sends nothing back, and renders the same in JupyterLab.
"""
import base64
import functools

UNRUN = "[sliders appear here when this cell runs with a live kernel; the static figure in the lesson is the same]"


def explorer(show, *rows):
    """show(**values), then one {name: control} dict per row -> a box of the rows above show's output."""
    import ipywidgets as w

    controls = {name: control for row in rows for name, control in row.items()}
    out = w.Output()

    def redraw(change=None):
        out.outputs = shown(show, **{name: control.value for name, control in controls.items()})

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    box = _box_type()([*(w.HBox(list(row.values())) for row in rows), out])
    box.controls = controls
    return box


def shown(show, **values):
    """What show(**values) displays, then what it prints, as notebook outputs (a traceback as stderr text when it
    raises): the `outputs` an Output widget renders."""
    import traceback

    from IPython.utils.capture import capture_output

    with capture_output() as got:
        try:
            show(**values)
        except Exception:
            traceback.print_exc()
    outputs = [{"output_type": "display_data", "data": {kind: _text(v) for kind, v in o.data.items()},
                "metadata": o.metadata or {}} for o in got.outputs]
    return tuple(outputs + [{"output_type": "stream", "name": name, "text": text}
                            for name, text in (("stdout", got.stdout), ("stderr", got.stderr)) if text])


def _text(value):
    """A display's data as notebook JSON holds it: bytes (a PNG) in base64."""
    return base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value


@functools.cache
def _box_type():
    import ipywidgets as w

    class Explorer(w.VBox):
        def __repr__(self):  # ipywidgets saves repr() as the output's text/plain form
            return UNRUN

    return Explorer
