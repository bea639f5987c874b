"""How long each lesson takes in a room, estimated from what its notebook holds, and the workshop plans built on it.

No room has timed these lessons yet. Until one has, a lesson's minutes are an estimate from what can be counted or
measured in the notebook itself:
  - its words of prose (markdown cells) at WPM = 238 words per minute, the average silent reading rate of adults for
    English non-fiction in Brysbaert's meta-analysis (Journal of Memory and Language 109, 104047, 2019);
  - its exercises done live, EXERCISE_MINUTES = 8 each: an assumption;
  - its interview corners answered aloud, CORNER_MINUTES = 2 each, an assumption: only lesson 00's interview sprint
    adds them (a workshop reads them with the prose);
  - the seconds its code cells took in the notebook's last full run, from the timestamps Jupyter records.

    python -m kvlesson.teaching.syllabus                                     # per-lesson table and plans, as Markdown
    python -m kvlesson.teaching.syllabus --write docs/instructor_guide.md    # the same, into the guide's marked block
    python -m kvlesson.teaching.syllabus --write-data                         # the package's map of the lessons

The map (kvlesson/teaching/syllabus.json, shipped in the wheel) holds what `lessons()` counts in every notebook,
headings included, so that lesson 00 can plan the series from the installed package alone (`shipped()`): a lesson
opened on its own, on a hosted notebook service say, has no sibling notebooks to read. Re-executing a lesson changes
its run seconds, so both commands follow every re-execution (a test fails while either is stale).
"""
import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

WPM = 238  # words per minute: silent reading, English non-fiction (Brysbaert 2019)
EXERCISE_MINUTES = 8  # per exercise done live: an assumption to replace with a room's own timing
CORNER_MINUTES = 2  # per interview corner answered aloud: an assumption
BEGIN = "### BEGIN SOLUTION"  # the nbgrader marker that opens an exercise's solution (as kvlesson.teaching.student)
START, END = "<!-- syllabus:start -->", "<!-- syllabus:end -->"  # the guide's generated block
DATA = Path(__file__).with_name("syllabus.json")  # the map of the lessons the package ships (`shipped()`)

PART_ONE = ("01_attention", "02_why_a_cache", "03_kv_cache", "04_offset_mask", "05_gqa", "06_rope",
            "07_sliding_window", "08_real_model")
PART_TWO = ("09_many_sequences", "10_precision", "11_shrink_and_stretch", "12_interview_drill")
PART_THREE = ("13_scheduler", "14_speculative")
PART_FOUR = ("15_many_devices", "16_server")
LESSONS = ("00_start_here", *PART_ONE, *PART_TWO, *PART_THREE, *PART_FOUR)


def count_words(text):
    """Words in `text`: runs of letters and digits, an apostrophe's tail kept (don't, lesson's)."""
    return len(re.findall(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?", text))


def _source(cell):
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def words_of_prose(cells):
    """Words in the markdown cells: what a reader reads, code and outputs left out."""
    return sum(count_words(_source(c)) for c in cells if c.get("cell_type") == "markdown")


def exercises(cells):
    """Code cells holding a solution block: one exercise each."""
    return sum(any(line.strip() == BEGIN for line in _source(c).splitlines())
               for c in cells if c.get("cell_type") == "code")


def interview_corners(cells):
    """Markdown headings named "Interview corner"."""
    return sum(line.startswith("#") and "interview corner" in line.lower()
               for c in cells if c.get("cell_type") == "markdown" for line in _source(c).splitlines())


def cell_seconds(cell):
    """How long a code cell took in the notebook's last run, from Jupyter's timestamps; 0 if it has none."""
    t = cell.get("metadata", {}).get("execution", {})
    keys = ("iopub.execute_input", "shell.execute_reply")
    if not all(key in t for key in keys):
        return 0.0
    start, end = (datetime.fromisoformat(t[key].replace("Z", "+00:00")) for key in keys)
    return (end - start).total_seconds()


def run_seconds(cells):
    """Seconds the code cells took in the notebook's last full run, to the microsecond (Jupyter's timestamps count
    microseconds; the rounding drops float noise, so the figure reads back from the shipped map unchanged)."""
    return round(sum(cell_seconds(c) for c in cells if c.get("cell_type") == "code"), 6)


def sections(cells):
    """{heading: words of prose under it, its subsections' included} for every markdown heading below the title (##
    and deeper): what a reader told to read that section reads. Issue 32: "4. The decode floor", whose prose sits in
    4.1 to 4.3, counted 0 words."""
    found, within = {}, []  # within: the (level, heading) of every heading the current line sits under
    for cell in cells:
        for line in _source(cell).splitlines() if cell.get("cell_type") == "markdown" else []:
            if line.startswith("##"):
                level, heading = len(line) - len(line.lstrip("#")), line.lstrip("# ").replace("`", "")
                within = [(n, h) for n, h in within if n < level] + [(level, heading)]
                found[heading] = 0
                continue
            for _, heading in within:
                found[heading] += count_words(line)
    return found


def anchor(heading):
    """The id JupyterLab gives a heading (its text, spaces made hyphens): `lesson.ipynb#` + this opens the lesson
    there, in the lab and on the site (scripts/site_hooks.py gives each page's headings the same ids)."""
    return heading.replace(" ", "-")


def estimated_minutes(words, live=0, corners=0, seconds=0.0):
    """Whole minutes, rounded up: reading at WPM, EXERCISE_MINUTES per live exercise, CORNER_MINUTES per
    interview corner, and the cells' run time."""
    return math.ceil(words / WPM + live * EXERCISE_MINUTES + corners * CORNER_MINUTES + seconds / 60)


@dataclass(frozen=True)
class Lesson:
    """What one lesson's notebook holds; `problem` says why there is nothing to count ("" when it was read)."""

    name: str
    words: int = 0
    exercises: int = 0
    corners: int = 0
    seconds: float = 0.0
    problem: str = ""
    sections: tuple = ()  # ((heading, words of prose under it), ...) for every heading below the title, in order

    def minutes(self, live=None):
        """Estimated minutes in a room: its prose read, `live` of its exercises done there (all when None), its
        cells run. Interview corners are read with the prose; only the interview sprint adds time to answer them."""
        return estimated_minutes(self.words, self.exercises if live is None else live, 0, self.seconds)


def read_cells(path):
    """The cells of a notebook file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def read_lesson(folder, name):
    """The Lesson `name` in `folder`; a missing or unreadable notebook gives a Lesson whose `problem` says so."""
    path = Path(folder) / f"{name}.ipynb"
    if not path.exists():
        return Lesson(name, problem="missing")
    try:
        cells = read_cells(path)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a notebook half-written by an editor, say
        return Lesson(name, problem=f"unreadable ({type(e).__name__})")
    return Lesson(name, words_of_prose(cells), exercises(cells), interview_corners(cells), run_seconds(cells),
                  sections=tuple(sections(cells).items()))


def lessons(folder="notebooks"):
    """{name: Lesson} for every lesson of the series, in order, counted in the notebooks of `folder`."""
    return {name: read_lesson(folder, name) for name in LESSONS}


# ---- the map the package ships: the same Lessons, for a lesson that has no notebooks beside it ----

def data_text(found):
    """The map of `found` ({name: Lesson}, as `lessons()` gives) as the package ships it: JSON, one object per
    lesson. ValueError naming every lesson that could not be read, because a map with a hole would mislead."""
    unread = [f"{lesson.name} ({lesson.problem})" for lesson in found.values() if lesson.problem]
    if unread:
        raise ValueError(f"cannot map lessons that were not read: {', '.join(unread)}")
    return json.dumps({name: {"words": lesson.words, "exercises": lesson.exercises, "corners": lesson.corners,
                              "seconds": lesson.seconds, "sections": dict(lesson.sections)}
                       for name, lesson in found.items()}, indent=1, ensure_ascii=False) + "\n"


def shipped(path=DATA):
    """{name: Lesson} for every lesson, in order, read from the map the package ships: what `lessons()` counted in
    the notebooks when the map was last written (`--write-data`)."""
    found = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: Lesson(name, got["words"], got["exercises"], got["corners"], got["seconds"],
                         sections=tuple(got["sections"].items())) for name, got in found.items()}


# ---- plans: blocks of a session; a lesson block's minutes are its estimate, the buffer takes what is left ----

@dataclass(frozen=True)
class Block:
    """One line of a timetable. kind: "live" (students run the lesson and do `live` of its exercises), "demo"
    (the instructor runs it on the projector; no exercises), "break", or "talk" (a fixed-length item)."""

    kind: str
    what: str  # a lesson's name for live and demo, else what happens
    minutes: int = 0  # for break and talk; a lesson block's minutes are estimated
    live: int = 0  # exercises done live, for a live block


@dataclass(frozen=True)
class Session:
    title: str
    start: int  # minutes after midnight (0: times count from the session's start)
    length: int  # minutes, breaks included
    blocks: tuple
    before: tuple = ()  # lessons the room finished before this session (no homework for them)


def live(name, n):
    return Block("live", name, live=n)


def demo(name):
    return Block("demo", name)


def pause(minutes, what="break"):
    return Block("break", what, minutes)


def talk(minutes, what):
    return Block("talk", what, minutes)


PLANS = {
    "90 minutes": (Session("one session, 90 minutes", 0, 90, (
        talk(5, "welcome; the machine check already ran at home; open `student/`"),
        demo("01_attention"),
        live("03_kv_cache", 2),
        pause(5),
        live("04_offset_mask", 2),
        talk(3, "wrap-up: the 30-second answer (lesson 00, 3.3) to a neighbour"),
    )),),
    "3 hours": (Session("one session, 3 hours", 0, 180, (
        talk(10, "welcome; everyone runs lesson 00's machine check and opens `student/`"),
        live("01_attention", 2),
        live("02_why_a_cache", 1),
        pause(10),
        live("03_kv_cache", 2),
        live("04_offset_mask", 2),
        pause(10),
        live("05_gqa", 2),
        talk(5, "wrap-up: the 30-second answer (lesson 00, 3.3) to a neighbour"),
    )),),
    # a 90-minute or 3-hour room that starts from zero spends it on part one; these are its second session
    "90 minutes, after part one": (Session("the interview drill, 90 minutes", 0, 90, before=PART_ONE, blocks=(
        talk(5, "welcome; lesson 12's rules (how to run it, the score sheet); open `student/`"),
        live("12_interview_drill", 6),
        talk(5, "wrap-up: read the score sheets together; the suspects are homework"),
    )),),
    "3 hours, after part one": (Session("part two, 3 hours", 0, 180, before=PART_ONE, blocks=(
        talk(10, "recap of part one: each pair says the 30-second answer; the model already fetched on every laptop"),
        live("09_many_sequences", 1),
        pause(10),
        demo("11_shrink_and_stretch"),
        live("12_interview_drill", 6),
        pause(10),
        talk(10, "wrap-up: the score sheets, and what to re-read"),
    )),),
    "two days": (
        Session("day 1: part one", 9 * 60 + 30, 7 * 60, (
            talk(15, "welcome; lesson 00's machine check on every laptop; open `student/`"),
            live("01_attention", 2),
            live("02_why_a_cache", 3),
            pause(15),
            live("03_kv_cache", 2),
            live("04_offset_mask", 2),
            pause(60, "lunch"),
            live("05_gqa", 3),
            live("06_rope", 3),
            pause(15),
            live("07_sliding_window", 2),
            live("08_real_model", 2),
            talk(10, "wrap-up of day 1: what the cache stores, and why decode is bandwidth-bound"),
        )),
        Session("day 2: part two", 9 * 60 + 30, 7 * 60, (
            talk(10, "recap of day 1: each pair says the 30-second answer"),
            live("09_many_sequences", 3),
            pause(15),
            live("10_precision", 2),
            live("11_shrink_and_stretch", 3),
            pause(60, "lunch"),
            live("12_interview_drill", 14),
            pause(15),
            talk(10, "wrap-up: the score sheets, and what to re-read"),
        )),
    ),
}


@dataclass(frozen=True)
class Row:
    """One line of a timetable: when it starts (minutes after midnight), how long, what kind, what happens."""

    start: int
    minutes: int
    kind: str  # a Block's kind, or "buffer" for the last row
    text: str


def block_minutes(block, found):
    """Minutes of one block: fixed for breaks and talks, estimated for a lesson (0 for a lesson not found)."""
    if block.kind in ("break", "talk"):
        return block.minutes
    lesson = found[block.what]
    if lesson.problem:
        return 0
    return lesson.minutes(live=block.live if block.kind == "live" else 0)


def describe(block, found):
    """What happens in a block, in a few words."""
    if block.kind not in ("live", "demo"):
        return block.what
    lesson = found[block.what]
    if lesson.problem:
        return f"{block.what} ({lesson.problem})"
    if block.kind == "demo":
        return f"{block.what} on the projector, no exercises"
    rest = lesson.exercises - block.live
    return f"{block.what}: {block.live} of {lesson.exercises} exercises live" + (f", {rest} homework" if rest else "")


def timetable(session, found):
    """[Row] for a session. The last row is the buffer that makes the blocks add up to the session's length:
    negative minutes when they do not fit."""
    rows, t = [], session.start
    for block in session.blocks:
        minutes = block_minutes(block, found)
        rows.append(Row(t, minutes, block.kind, describe(block, found)))
        t += minutes
    slack = session.start + session.length - t
    text = "buffer: questions, catching up, a slower room" if slack >= 0 else f"OVER by {-slack} min"
    return rows + [Row(t, slack, "buffer", text)]


def problems(plans, found):
    """What is wrong with the plans, given the lessons found: sessions that overrun, missing lessons, more live
    exercises than a lesson has. An empty list means every plan adds up."""
    said = []
    for name, sessions in plans.items():
        for session in sessions:
            where = f"{name}, {session.title}"
            slack = timetable(session, found)[-1].minutes
            if slack < 0:
                said.append(f"{where}: over its {session.length} min by {-slack} min")
            for block in session.blocks:
                if block.kind not in ("live", "demo"):
                    continue
                lesson = found.get(block.what)
                if lesson is None or lesson.problem:
                    said.append(f"{where}: lesson {block.what} is {lesson.problem if lesson else 'not in the series'}")
                elif not 0 <= block.live <= lesson.exercises:
                    said.append(f"{where}: {block.live} live exercises in {block.what}, which has {lesson.exercises}")
    return said


# ---- Markdown ----

def clock(minutes):
    """Minutes -> "h:mm"."""
    return f"{minutes // 60}:{minutes % 60:02d}"


def lesson_table(found):
    """The per-lesson table, Markdown."""
    lines = ["| lesson | words of prose | reading (min) | exercises | interview corners | cells run (s) | "
             "estimate, all exercises live (min) |", "|---|--:|--:|--:|--:|--:|--:|"]
    for lesson in found.values():
        if lesson.problem:
            lines.append(f"| {lesson.name} | {lesson.problem} | | | | | |")
            continue
        lines.append(f"| {lesson.name} | {lesson.words:,} | {lesson.words / WPM:.1f} | {lesson.exercises} | "
                     f"{lesson.corners} | {lesson.seconds:.0f} | {lesson.minutes()} |")
    return "\n".join(lines)


def plan_table(session, found):
    """One session's timetable, Markdown, ending with the buffer and the end time."""
    lines = ["| start | min | block | kind |", "|--:|--:|---|---|"]
    lines += [f"| {clock(r.start)} | {r.minutes} | {r.text} | {r.kind} |" for r in timetable(session, found)]
    lines.append(f"| {clock(session.start + session.length)} | | end, {session.length} min after the start | |")
    return "\n".join(lines)


def homework(sessions, found):
    """Lessons and exercises left for home after a plan, with their estimated minutes."""
    done = {name: math.inf for session in sessions for name in session.before}
    for session in sessions:
        for block in session.blocks:
            if block.kind == "live":
                done[block.what] = done.get(block.what, 0) + block.live
            elif block.kind == "demo":
                done.setdefault(block.what, 0)
    items = []
    for name in PART_ONE + PART_TWO:  # parts three and four build on part two: sessions of their own
        lesson = found[name]
        if lesson.problem:
            continue
        if name not in done:
            items.append(f"{name} whole (about {lesson.minutes()} min)")
        elif lesson.exercises > done[name]:
            n = lesson.exercises - done[name]
            items.append(f"{name}: {n} exercise{'s' if n > 1 else ''} ({n * EXERCISE_MINUTES} min)")
    return ("Homework: " + ("; ".join(items) if items else "none") + ". Part three (" + ", ".join(PART_THREE)
            + ") builds on lesson 09 and part four (" + ", ".join(PART_FOUR) + ") on part three: sessions of their "
            "own after part two, not homework.")


def markdown(folder="notebooks", plans=None):
    """The lesson table and every plan, as the instructor guide shows them."""
    found, plans = lessons(folder), PLANS if plans is None else plans
    parts = [f"Each lesson block: its prose at {WPM} words per minute, {EXERCISE_MINUTES} min per exercise done "
             "live, and its cells' run time, rounded up to whole minutes. A demo block has no exercises.", "",
             lesson_table(found)]
    for name, sessions in plans.items():
        parts += ["", f"#### Plan: {name}"]
        for session in sessions:
            parts += ["", f"{session.title}:", "", plan_table(session, found)]
        parts += ["", homework(sessions, found)]
    return "\n".join(parts) + "\n"


def replace_block(text, block):
    """`text` with what lies between the START and END markers replaced by `block`; ValueError without them."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"no {START} ... {END} block to replace")
    return f"{head}{START}\n{block}{END}{tail}"


def guide_block(text):
    """What lies between the START and END markers of `text` (without the newline after START)."""
    body = text.partition(START)[2].partition(END)[0]
    return body[1:] if body.startswith("\n") else body


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.teaching.syllabus", description=__doc__.split("\n")[0])
    parser.add_argument("--notebooks", default="notebooks", help="folder of the lessons (default: notebooks)")
    parser.add_argument("--write", metavar="GUIDE", help="replace the marked block of this Markdown file instead "
                                                         "of printing")
    parser.add_argument("--write-data", metavar="MAP", nargs="?", const=str(DATA),
                        help=f"write the map of the lessons instead of printing (default: {DATA.name} in the package)")
    args = parser.parse_args(argv)
    if args.write_data and not written(args.write_data, lambda _: data_text(lessons(args.notebooks))):
        return 1
    block = markdown(args.notebooks)
    if args.write and not written(args.write, lambda text: replace_block(text, block)):
        return 1
    if not (args.write or args.write_data):
        print(block, end="")
    said = problems(PLANS, lessons(args.notebooks))
    for line in said:
        print(f"kvlesson.teaching.syllabus: {line}", file=sys.stderr)
    return 1 if said else 0


def written(path, make):
    """Write `make(the file's text)` into `path` (make is given "" for a file not there yet); False after saying on
    stderr why nothing was written."""
    path = Path(path)
    try:
        path.write_text(make(path.read_text(encoding="utf-8") if path.exists() else ""), encoding="utf-8")
    except (OSError, ValueError) as e:
        print(f"kvlesson.teaching.syllabus: {path}: {e}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
