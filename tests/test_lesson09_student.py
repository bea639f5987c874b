"""Lesson 09's student copy gives no answer away: no line of a solution, no printout of a solved exercise, no prose
that spells out what an exercise asks the learner to derive."""
import re
from pathlib import Path

import nbformat
import pytest

from kvlesson.teaching.student import BEGIN, END, student_notebook

LESSON = Path(__file__).resolve().parent.parent / "notebooks" / "09_many_sequences.ipynb"

# What the exercises ask for, in the forms a page could give it away (prose, a docstring, a printed array).
GIVEAWAYS = [
    r"pads\[b\]\s*<=\s*j\s*<=\s*S - T \+ i",  # Your turn 1's mask
    r"\\text\{pads\}_b \\le j",
    r"j >= pads\[b\]",
    r"c - pads\[b\]", r"column - pads\[b\]", r"S - T \+ i - pads", r"columns - ",  # Your turn 2's positions
    r"\[\[0 1 2 3 4\]",  # the positions of the lesson's own batch, printed
    r"-\(-\w+ // block_size\)", r"ceil\(L / block_size\)",  # Your turn 4's count
    r"L % block_size != 0", r"partly filled last block is copied",  # Your turn 5's condition
]


def solutions(nb):
    """The lines between the markers, stripped, that are long enough to be an answer rather than a bracket."""
    lines = []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if line.strip() == BEGIN:
                inside = True
            elif line.strip() == END:
                inside = False
            elif inside and len(line.strip()) > 12 and not line.strip().startswith("#"):
                lines.append(line.strip().split("  #")[0])
    return lines


def text(nb):
    """Every source and every text output of the notebook, as a learner sees them."""
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def lesson():
    return nbformat.read(LESSON, as_version=4)


@pytest.fixture(scope="module")
def copy(lesson):
    return text(student_notebook(lesson, LESSON.name)[0])


def test_the_lesson_has_five_exercises_and_the_copy_keeps_none(lesson, copy):
    _, blocks = student_notebook(lesson, LESSON.name)
    assert blocks == 5
    assert BEGIN not in copy and copy.count('raise NotImplementedError("your turn")') == 5


def test_no_line_of_a_solution_survives_in_the_student_copy(lesson, copy):
    lines = solutions(lesson)
    assert len(lines) >= 15
    assert [line for line in lines if line in copy] == []


@pytest.mark.parametrize("pattern", GIVEAWAYS)
def test_nothing_in_the_student_copy_spells_out_an_answer(copy, pattern):
    assert not re.search(pattern, copy), pattern


# Leaks of the kind each pattern is for: most are quoted from the lesson as it stood before issue 18.
LEAKS = [
    "query i of sequence b sees key j when pads[b] <= j <= S - T + i",
    "$$\\text{pads}_b \\le j \\le S - T + i .$$",
    "key `j` is real for sequence `b` when `j >= pads[b]`",
    "The rule that survives all of it: column `c` of sequence `b` is its token `c - pads[b]`.",
    "positions that count from its first real token, `column - pads[b]`",
    "the position RoPE rotates column S - T + i of sequence b by, S - T + i - pads[b]",
    "return np.maximum(columns - pads[:, None], 0)",
    "[[0 1 2 3 4]\n [0 0 0 0 1]\n [0 0 0 1 2]]",
    "blocks = -(-lengths // block_size)",
    "a sequence of L positions takes ceil(L / block_size) blocks",
    "if the sequence's last block is partly filled (`L % block_size != 0`) and shared",
    "a shared, partly filled last block is copied first.",
]


@pytest.mark.parametrize("pattern", GIVEAWAYS)
def test_each_giveaway_pattern_catches_a_real_leak(pattern):
    assert any(re.search(pattern, leak) for leak in LEAKS), pattern
