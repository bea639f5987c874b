"""The score sheet: a stopwatch per section and the verdicts of its parts.

    sheet = ScoreSheet()
    sheet.start("1. Write it cold")                  # starts this section's clock (and stops the previous one)
    sheet.record("the offset mask", verdict)         # a checker's Verdict, filed under the section that lists it
    print(sheet.report())                            # what was solved: the same text on every machine
    print(sheet.times())                             # how long each section took, against its budget

A part counts as solved when its latest verdict passed; its time is when its first PASS came, measured from the
start of its section. A section's time runs from its start to its last first PASS once every part is solved, and
otherwise to the start of the next section (or to now, while it runs).
"""
import time

from kvlesson.teaching.verdict import Verdict

__all__ = ["PLAN", "ScoreSheet"]

# section -> (budget in minutes, parts); the design section's answers are compared with the model answers by hand
PLAN = {
    "1. Write it cold": (15, ("the offset mask", "a cache", "step")),
    "2. Price it": (15, ("bytes per token", "bytes at a context", "the decode floor")),
    "3. Find the bug": (40, tuple(f"suspect {label}" for label in "ABCDEFGH")),
    "4. Design": (20, ()),
}


class ScoreSheet:
    def __init__(self, plan=None, clock=time.monotonic):
        self.plan = dict(PLAN if plan is None else plan)
        self.clock = clock
        self.started, self.ended = {}, {}  # section -> clock reading
        self.verdicts, self.solved_at = {}, {}  # (section, part) -> latest Verdict, -> seconds to its first PASS
        self.current = None

    def start(self, section):
        """Start `section`'s clock; the running section, if any, stops now."""
        if section not in self.plan:
            raise ValueError(f"no section {section!r}; the plan has {list(self.plan)}")
        now = self.clock()
        if self.current is not None and self.current != section:
            self.ended[self.current] = now
        self.started.setdefault(section, now)
        self.ended.pop(section, None)
        self.current = section
        budget, parts = self.plan[section]
        print(f"{section}: the clock is running. Budget {budget} min"
              + (f" for {len(parts)} parts." if parts else "; compare your answers with the model answers yourself."))

    def record(self, part, verdict):
        """Note a checker's verdict for `part`; returns the verdict, so a cell shows it.

        The part is filed under the section that lists it, so a cell of an earlier section can be run again at any
        time; a section whose clock was never started starts it now.
        """
        owners = [section for section, (_, parts) in self.plan.items() if part in parts]
        if not owners:
            raise ValueError(f"no part {part!r} in the plan; the parts are "
                             f"{[p for _, parts in self.plan.values() for p in parts]}")
        if not isinstance(verdict, Verdict):
            raise TypeError(f"record a checker's Verdict; got {type(verdict).__name__}")
        section = owners[0]
        now = self.clock()
        self.started.setdefault(section, now)
        key = (section, part)
        self.verdicts[key] = verdict
        if verdict.ok and key not in self.solved_at:
            self.solved_at[key] = now - self.started[section]
        return verdict

    def verdict(self, part):
        """The latest verdict recorded for `part`, in whichever section; a NOT YET if it was never checked."""
        found = [v for (_, p), v in self.verdicts.items() if p == part]
        return found[-1] if found else Verdict(False, problem=f"{part} was never checked")

    def solved(self, section):
        """The parts of `section` whose latest verdict passed."""
        return [p for p in self.plan[section][1] if self.verdicts.get((section, p)) and self.verdicts[(section, p)].ok]

    def report(self):
        """What was solved, section by section: no times, so the text is the same wherever it runs."""
        lines, total, solved = [f"{'section':18} solved   parts still open"], 0, 0
        for section, (_, parts) in self.plan.items():
            if not parts:
                lines.append(f"{section:18} {'-':8} self-graded against the model answers")
                continue
            done = self.solved(section)
            total, solved = total + len(parts), solved + len(done)
            still = [p for p in parts if p not in done]
            lines.append(f"{section:18} {len(done)} of {len(parts):<3} {', '.join(still) if still else 'none'}")
        lines.append(f"{'all checked parts':18} {solved} of {total}")
        return "\n".join(lines)

    def times(self):
        """Time per section against its budget, and when each part was first solved."""
        lines = []
        for section, (budget, parts) in self.plan.items():
            if section not in self.started:
                lines.append(f"{section:18} not started (budget {budget} min)")
                continue
            seconds = self._seconds(section)
            over = " OVER" if seconds > budget * 60 else ""
            firsts = [f"{p} at {_clock(self.solved_at[(section, p)])}" for p in parts if (section, p) in self.solved_at]
            lines.append(f"{section:18} {_clock(seconds):>8} of {budget} min{over}"
                         + (f"; {', '.join(firsts)}" if firsts else ""))
        return "\n".join(lines)

    def _seconds(self, section):
        parts = self.plan[section][1]
        if parts and all((section, p) in self.solved_at and self.verdicts[(section, p)].ok for p in parts):
            return max(self.solved_at[(section, p)] for p in parts)
        return self.ended.get(section, self.clock()) - self.started[section]


def _clock(seconds):
    """Seconds -> 'm:ss' (or 'h:mm:ss')."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
