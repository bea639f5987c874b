"""kvlesson.teaching.syllabus counts what a lesson holds, estimates its minutes, and keeps the guide's tables true."""
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvlesson.teaching import syllabus
from kvlesson.teaching.syllabus import Block, Session

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS, GUIDE = ROOT / "notebooks", ROOT / "docs" / "instructor_guide.md"


def stamp(seconds):
    """Jupyter's execution metadata for a cell that ran for `seconds` (whole milliseconds)."""
    ms = round(seconds * 1000)
    return {"execution": {"iopub.execute_input": "2026-12-01T10:00:00.000000Z",
                          "shell.execute_reply": f"2026-12-01T10:00:{ms // 1000:02d}.{ms % 1000:03d}000Z"}}


def md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(text, seconds=None):
    return {"cell_type": "code", "metadata": stamp(seconds) if seconds is not None else {}, "source": text,
            "outputs": [], "execution_count": None}


CELLS = [
    md("# 99 · A toy lesson\n\nYou will count words, don't worry."),  # 10 words: 99 is one, don't is one
    code("x = 1", seconds=1.5),
    md(["## 1. Your turn\n", "Write `f`.\n"]),  # 5 words; a source given as a list of lines, as in a file
    code("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", seconds=0.25),
    code('print("### BEGIN SOLUTION")'),  # a marker inside a string is not an exercise; no timestamps: 0 s
    md("## 2. Interview corner\n\nWhy? Answer each interview corner aloud.\n\n### 2.1 A follow-up"),  # 14 words
]


def write(folder, name, cells):
    path = Path(folder) / f"{name}.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_counts_on_a_small_notebook():
    assert syllabus.words_of_prose(CELLS) == 10 + 5 + 14
    assert syllabus.exercises(CELLS) == 1
    assert syllabus.interview_corners(CELLS) == 1  # a heading; the same words in prose do not count
    assert syllabus.run_seconds(CELLS) == pytest.approx(1.75)
    assert syllabus.sections(CELLS) == {"1. Your turn": 2, "2. Interview corner": 6, "2.1 A follow-up": 0}


def test_a_section_counts_the_words_of_its_subsections():
    """Issue 32: lesson 05's "4. The decode floor" counted 0 words, its prose being in 4.1 to 4.3."""
    cells = [md("## 4. The floor\n### 4.1 Bytes\nOne two three.\n#### 4.1.1 Deeper\nFour."),
             md("### 4.2 Why\nFive six.\n## 5. Next\nSeven.")]
    assert syllabus.sections(cells) == {"4. The floor": 6, "4.1 Bytes": 4, "4.1.1 Deeper": 1, "4.2 Why": 2,
                                        "5. Next": 1}
    assert syllabus.anchor("3. The np.tril bug") == "3.-The-np.tril-bug"


def test_count_words_keeps_contractions_and_splits_code():
    assert syllabus.count_words("don't stop: the lesson's 3.3, `np.tril`") == 8  # don't stop the lesson's 3 3 np tril


def test_estimated_minutes_add_up_and_round_up():
    assert syllabus.estimated_minutes(2 * syllabus.WPM) == 2
    assert syllabus.estimated_minutes(2 * syllabus.WPM + 1) == 3
    assert syllabus.estimated_minutes(syllabus.WPM, live=2, corners=1, seconds=30) == 1 + 16 + 2 + 1
    assert syllabus.Lesson("x", words=syllabus.WPM, exercises=3, corners=1, seconds=60).minutes(live=1) == 1 + 8 + 1


def test_a_lesson_read_from_disk(tmp_path):
    write(tmp_path, "99_toy", CELLS)
    got = syllabus.read_lesson(tmp_path, "99_toy")
    assert (got.words, got.exercises, got.corners, got.problem) == (29, 1, 1, "")
    assert got.seconds == pytest.approx(1.75)
    assert got.minutes() == math.ceil(29 / 238 + 8 + 1.75 / 60) == 9


def test_missing_and_unreadable_lessons_are_listed_not_fatal(tmp_path, capsys):
    write(tmp_path, "01_attention", CELLS)
    (tmp_path / "03_kv_cache.ipynb").write_text('{"cells": [')  # half-written by an editor
    found = syllabus.lessons(tmp_path)
    assert found["02_why_a_cache"].problem == "missing"
    assert found["03_kv_cache"].problem.startswith("unreadable")
    text = syllabus.markdown(tmp_path)
    assert "| 02_why_a_cache | missing |" in text and "| 03_kv_cache | unreadable" in text
    said = syllabus.problems(syllabus.PLANS, found)
    assert any("03_kv_cache is unreadable" in line for line in said)
    assert any("01_attention, which has 1" in line for line in said)  # the toy has 1 exercise, a plan wants 2
    assert syllabus.main(["--notebooks", str(tmp_path)]) == 1  # prints the table, then says what is wrong
    out, err = capsys.readouterr()
    assert "| 00_start_here | missing |" in out and "02_why_a_cache is missing" in err


def test_every_real_lesson_parses():
    found = syllabus.lessons(NOTEBOOKS)
    assert [name for name, lesson in found.items() if lesson.problem] == []
    for name, lesson in found.items():
        assert lesson.words > 1000 and lesson.seconds > 0, name  # prose, and executed with Jupyter's timestamps
        if name in syllabus.PART_ONE + syllabus.PART_TWO:
            assert lesson.exercises >= 2, name  # the template: at least two "Your turn"
        if name in syllabus.PART_ONE + syllabus.PART_TWO[:-1]:
            assert lesson.corners == 1, name


def test_every_plan_adds_up_to_its_length_and_fits():
    found = syllabus.lessons(NOTEBOOKS)
    assert syllabus.problems(syllabus.PLANS, found) == []
    for sessions in syllabus.PLANS.values():
        for session in sessions:
            rows = syllabus.timetable(session, found)
            assert sum(r.minutes for r in rows) == session.length
            assert rows[-1].kind == "buffer" and rows[-1].minutes >= 0
            assert all(r.minutes > 0 for r in rows[:-1])
            assert all(a.start + a.minutes == b.start for a, b in zip(rows, rows[1:], strict=False))


def test_a_90_minute_and_a_3_hour_session_reach_part_two():
    """Issue 18: the short plans never reached lessons 11-12. A second session after part one does."""
    reached = {}
    for sessions in syllabus.PLANS.values():
        for session in sessions:
            lessons = {b.what for b in session.blocks if b.kind in ("live", "demo")}
            reached.setdefault(session.length, set()).update(lessons)
    assert "12_interview_drill" in reached[90]
    assert {"11_shrink_and_stretch", "12_interview_drill"} <= reached[180]


def test_homework_after_a_later_session_leaves_out_what_was_done_before():
    found = syllabus.lessons(NOTEBOOKS)
    text = syllabus.homework(syllabus.PLANS["3 hours, after part one"], found)
    assert "01_attention" not in text and "08_real_model" not in text and "10_precision whole" in text


def test_parts_three_and_four_are_never_homework_of_a_plan_for_parts_one_and_two():
    """Lesson 14 builds on lessons 09 and 13, lesson 15 on part three; the plans listed them whole as homework after a
    first session."""
    found = syllabus.lessons(NOTEBOOKS)
    for sessions in syllabus.PLANS.values():
        text = syllabus.homework(sessions, found)
        assert not [name for name in syllabus.PART_THREE + syllabus.PART_FOUR if f"{name} whole" in text]
        assert "sessions of their own" in text


def test_a_plan_that_overruns_is_reported_and_still_adds_up():
    found = {"01_attention": syllabus.Lesson("01_attention", words=238 * 50, exercises=2)}
    session = Session("short", 0, 60, (Block("talk", "welcome", 5), Block("live", "01_attention", live=2)))
    rows = syllabus.timetable(session, found)
    assert [r.minutes for r in rows] == [5, 66, -11] and rows[-1].text == "OVER by 11 min"
    assert syllabus.problems({"tight": (session,)}, found) == ["tight, short: over its 60 min by 11 min"]


def test_the_guide_shows_what_the_command_prints_now():
    """The guide's timing tables are generated: re-executing a lesson or editing a plan must be followed by
    `python -m kvlesson.teaching.syllabus --write docs/instructor_guide.md`."""
    text = GUIDE.read_text(encoding="utf-8")
    assert text.count(syllabus.START) == text.count(syllabus.END) == 1
    assert syllabus.guide_block(text) == syllabus.markdown(NOTEBOOKS), (
        "docs/instructor_guide.md is out of date: run "
        "python -m kvlesson.teaching.syllabus --write docs/instructor_guide.md")


def test_the_shipped_map_is_what_the_notebooks_hold_now():
    """Lesson 00 plans the series from the map the package ships, not from its sibling notebooks (a lesson opened
    alone has none): re-executing or editing a lesson must be followed by
    `python -m kvlesson.teaching.syllabus --write-data`."""
    assert syllabus.DATA.read_text(encoding="utf-8") == syllabus.data_text(syllabus.lessons(NOTEBOOKS)), (
        "kvlesson/teaching/syllabus.json is out of date: run python -m kvlesson.teaching.syllabus --write-data")
    assert syllabus.shipped() == syllabus.lessons(NOTEBOOKS)  # every count, heading and second reads back equal


def test_the_map_reads_back_as_the_lessons_it_was_written_from(tmp_path):
    for name in syllabus.LESSONS:
        write(tmp_path, name, CELLS)
    path = tmp_path / "map.json"
    assert syllabus.main(["--notebooks", str(tmp_path), "--write-data", str(path)]) == 1  # the toys break the plans
    got = syllabus.shipped(path)
    assert got == syllabus.lessons(tmp_path) and list(got) == list(syllabus.LESSONS)
    assert got["04_offset_mask"].sections == (("1. Your turn", 2), ("2. Interview corner", 6), ("2.1 A follow-up", 0))


def test_a_map_with_a_hole_is_refused_and_nothing_is_written(tmp_path, capsys):
    write(tmp_path, "01_attention", CELLS)
    (tmp_path / "03_kv_cache.ipynb").write_text('{"cells": [')
    with pytest.raises(ValueError, match=r"02_why_a_cache \(missing\).*03_kv_cache \(unreadable"):
        syllabus.data_text(syllabus.lessons(tmp_path))
    path = tmp_path / "map.json"
    assert syllabus.main(["--notebooks", str(tmp_path), "--write-data", str(path)]) == 1
    assert not path.exists() and "cannot map lessons that were not read" in capsys.readouterr().err


def test_write_replaces_only_the_marked_block(tmp_path):
    write(tmp_path, "01_attention", CELLS)
    guide = tmp_path / "guide.md"
    guide.write_text(f"before\n{syllabus.START}\nold numbers\n{syllabus.END}\nafter\n")
    syllabus.main(["--notebooks", str(tmp_path), "--write", str(guide)])
    text = guide.read_text()
    assert text.startswith(f"before\n{syllabus.START}\n") and text.endswith(f"{syllabus.END}\nafter\n")
    assert syllabus.guide_block(text) == syllabus.markdown(tmp_path) and "old numbers" not in text
    guide.write_text("no markers")
    assert syllabus.main(["--notebooks", str(tmp_path), "--write", str(guide)]) == 1
    assert guide.read_text() == "no markers"


def guide_script(first_line):
    """The fenced Python block of the guide that starts with `first_line`, unindented."""
    text = GUIDE.read_text(encoding="utf-8")
    for _indent, body in re.findall(r"^( *)```python\n(.*?)^\1```", text, re.M | re.S):
        if body.lstrip().startswith(first_line):
            return textwrap.dedent(body)
    raise LookupError(f"no python block starting with {first_line!r} in the guide")


def test_the_guides_verdict_script_reads_each_exercises_checker(tmp_path):
    """Section 4 of the guide: one line per exercise of the answer key, read from the student's run by cell id."""
    def cell(kind, source, id_, outputs=()):
        made = md(source) if kind == "md" else code(source)
        made["id"] = id_
        if kind == "code":
            made["outputs"] = list(outputs)
        return made

    exercise = "def {0}(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"
    key = [cell("md", "# 99 · toy", "m0")]
    for n, name in enumerate(["passes", "slips", "crashed", "deleted", "never_ran"]):
        key += [cell("code", exercise.format(name), f"e{n}"), cell("code", f"checks.check({name})", f"c{n}")]
    key[-4]["source"] = key[-4]["source"].replace("def deleted(x)", "class Deleted")
    result = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
              "data": {"text/plain": ["PASS: all good"]}}
    stream = {"output_type": "stream", "name": "stdout", "text": ["note\n", "NOT YET: off by one\n", "Hint: +1\n"]}
    error = {"output_type": "error", "ename": "NameError", "evalue": "name 'crashed' is not defined", "traceback": []}
    done = [cell("code", "extra = 1", "new", [stream])]  # a cell the student added, first: ids, not places, count
    done += [c for c in key if c["id"] != "c3"]  # the student deleted the fourth checker cell
    for c, out in zip([c for c in done if c["id"] in ("c0", "c1", "c2")], (result, stream, error), strict=True):
        c["outputs"] = [out]
    paths = write(tmp_path, "key", key), write(tmp_path, "done", done)
    script = tmp_path / "verdicts.py"
    script.write_text(guide_script("# verdicts.py"))
    run = subprocess.run([sys.executable, str(script), *map(str, paths)], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == [
        "passes: PASS: all good",
        "slips: NOT YET: off by one",
        "crashed: ERROR NameError: name 'crashed' is not defined",
        "Deleted: checker cell missing from the student's copy",
        "never_ran: no verdict (the cell did not run)",
    ]


def test_the_30_second_answer_fits_in_30_seconds():
    """Issue 32: "the 30-second answer" of lesson 00 was 168 words, over a minute aloud. At most 80 words: each run of
    characters between spaces that holds a letter or a digit counts (`j <= S - T + i` is four)."""
    cells = syllabus.read_cells(NOTEBOOKS / "00_start_here.ipynb")
    (cell,) = [c for c in cells if c["cell_type"] == "markdown" and "The 30-second answer" in syllabus._source(c)]
    quoted = " ".join(line[1:] for line in syllabus._source(cell).splitlines() if line.startswith(">"))
    words = [w for w in quoted.split() if re.search(r"[A-Za-z0-9]", w)]
    assert 40 <= len(words) <= 80, f"{len(words)} words"
