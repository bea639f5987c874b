"""The one shape every explorer takes: rows of controls over the output of a pure function they drive.

    box = explorer(show, {"T": T_slider, "S": S_slider}, {"window": picker})   # one dict per row of controls
    box.controls["T"].value = 4                                                # show(T=4, S=..., window=...) reruns

`show(**values)` draws or prints what one setting looks like; it is the tested function, the widget only moves its
arguments. A notebook saved with the box's output and opened before the cell runs (or a page with no kernel) shows
the box's text form, so that text says what will appear, instead of `VBox(children=(HBox(...`.
"""
import functools

UNRUN = "[sliders appear here when this cell runs with a live kernel; the static figure in the lesson is the same]"


def explorer(show, *rows):
    """show(**values), then one {name: control} dict per row -> a box of the rows above show's output."""
    import ipywidgets as w

    controls = {name: control for row in rows for name, control in row.items()}
    out = w.interactive_output(show, controls)
    box = _box_type()([*(w.HBox(list(row.values())) for row in rows), out])
    box.controls = controls
    return box


@functools.cache
def _box_type():
    import ipywidgets as w

    class Explorer(w.VBox):
        def __repr__(self):  # ipywidgets saves repr() as the output's text/plain form
            return UNRUN

    return Explorer
