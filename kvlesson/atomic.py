"""All or nothing: a call that changes state either finishes, or leaves everything as it was.

The most common fault in a notebook is the stop button. It raises KeyboardInterrupt at whatever line happens to be
running: in the middle of a forward pass whose first layers have appended to their caches and whose last have not, or
after a scheduler has reserved blocks that the forward pass never filled. A memory error does the same. Every
stateful call in kvlesson that can be cut short this way takes a checkpoint first and restores it on the way out:

    with atomic.undo_on_error(checkpoint()):      # checkpoint() -> a function that puts everything back
        ...                                       # whatever raises in here, KeyboardInterrupt included, is undone

The undo itself runs with Ctrl-C held back (in the main thread, where Python delivers signals): a second press while
the state is being put back is delivered once the undo is complete, so it cannot leave things half-restored.
"""
import contextlib
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator

_CONTAINERS = (list, deque, dict, set)

__all__ = ["undo_on_error", "snapshot", "interrupts_held"]


@contextlib.contextmanager
def undo_on_error(*undo: Callable[[], None]) -> Iterator[None]:
    """Run the block; if anything escapes it (an exception, KeyboardInterrupt, SystemExit), call each undo function,
    last first, with interrupts held, then let it continue on its way."""
    try:
        yield
    except BaseException:
        with interrupts_held():
            for restore in reversed(undo):
                restore()
        raise


def snapshot(*objects: object) -> Callable[[], None]:
    """-> restore(): puts each object's attributes back as they are now, and the lists, deques, dicts and sets they
    hold back in place, one level deep: what a step of an engine changes (its queues, its results, a request's tokens
    and sequence id). In place, so that anyone holding engine.results or a request's token list still sees the truth.
    """
    saved = []
    for obj in objects:
        attrs = dict(vars(obj))
        saved.append((obj, attrs, [(c, c.copy()) for c in attrs.values() if isinstance(c, _CONTAINERS)]))

    def restore():
        for obj, attrs, contents in saved:
            vars(obj).clear()
            vars(obj).update(attrs)
            for container, items in contents:
                container.clear()
                if isinstance(container, (dict, set)):
                    container.update(items)
                else:
                    container.extend(items)
    return restore


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold back SIGINT for the block and deliver it after: the block cannot be cut in half by Ctrl-C. Outside the main
    thread (a server's engine thread) signals never arrive anyway, so there is nothing to hold."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:  # None: set outside Python
        yield
        return
    pending = []
    signal.signal(signal.SIGINT, lambda number, frame: pending.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(signal.SIGINT, pending[0])  # Python's default handler raises KeyboardInterrupt here
