"""Every lesson ends by pointing to the next one, in the order of the series; the last points back to the start.

Issue 32: lesson 08 said "That is the series" and lesson 12 "This was the last lesson", both linking back to 00, so 09
and 13 were reachable only from lesson 00's table. The series is kvlesson.teaching.syllabus.LESSONS: a lesson added
there is checked here with no change to this file.
"""
import re
from pathlib import Path

import nbformat
import pytest

from kvlesson.teaching.syllabus import LESSONS

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NEXT = re.compile(r"\[Next: [^\]]+\]\(([^)#\s]+)\)")  # a markdown link whose text starts with "Next:"
THE_END = re.compile(r"that is the series|(this|the) (was|is) the last lesson(?! so far)", re.I)


def prose(name):
    return "\n".join(c.source for c in nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells
                     if c.cell_type == "markdown")


@pytest.mark.parametrize("at, name", list(enumerate(LESSONS)))
def test_the_next_link_goes_to_the_next_lesson(at, name):
    links = NEXT.findall(prose(name))
    want = f"{LESSONS[at + 1] if at + 1 < len(LESSONS) else LESSONS[0]}.ipynb"
    assert links == [want], f"{name}'s Next links go to {links}, not only to {want}"


@pytest.mark.parametrize("name", LESSONS[:-1])
def test_only_the_last_lesson_may_end_the_series(name):
    said = THE_END.search(prose(name))
    assert not said, f"{name} says {said[0]!r}, but {LESSONS[LESSONS.index(name) + 1]} follows it"
