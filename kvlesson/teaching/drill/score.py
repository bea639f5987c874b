"""The score sheet: a stopwatch per section, and the parts it checks itself.

    sheet = ScoreSheet()
    sheet.start("1. Write it cold")                  # starts this section's clock (and stops the previous one)
    sheet.check("the offset mask", offset_mask)      # runs the part's own checker on your answer; shows its verdict
    print(sheet.report())                            # what was solved: the same text on every machine
    print(sheet.times())                             # how long each section took, against its budget

The sheet counts only verdicts it issued, each by the checker its plan names for that part (issue 18: a sheet that
filed any Verdict under any part name gave 14 of 14 for `Verdict(True)`), and its plan is read-only (issue 29: a
plan edited after the sheet was made gave 14 of 14 the same way). kvlesson's own answer, the one a checker
compares with, is refused by name rather than scored.

A part counts as solved when its latest verdict passed; its time is when its first PASS came, measured from the
start of its section. A section's time runs from its start to its last first PASS once every part is solved, and
otherwise to the start of the next section (or to now, while it runs).
"""
import time
from types import MappingProxyType

from kvlesson.teaching.verdict import Verdict, failed

__all__ = ["PLAN", "ScoreSheet"]

_SUSPECTS = {f"suspect {label}": f"check_suspect_{label.lower()}" for label in "ABCDEFGH"}

# section -> (budget in minutes, {part: the name of its checker in kvlesson.teaching.checks}); the design section's
# answers are compared with the model answers by hand
def _frozen(plan):
    """A read-only copy of a plan: neither its sections nor any section's parts can be changed afterwards."""
    return MappingProxyType({section: (minutes, MappingProxyType(dict(parts)))
                             for section, (minutes, parts) in plan.items()})


PLAN = _frozen({
    "1. Write it cold": (15, {"the offset mask": "check_offset_mask", "a cache": "check_kv_cache",
                              "step": "check_step"}),
    "2. Price it": (15, {"bytes per token": "check_config_bytes_per_token",
                         "bytes at a context": "check_config_bytes_at",
                         "the decode floor": "check_config_decode_floor"}),
    "3. Find the bug": (40, _SUSPECTS),
    "4. Design": (20, {}),
})


class ScoreSheet:
    def __init__(self, plan=None, clock=time.monotonic):
        """plan: {section: (minutes, {part: checker})}, a checker given by its name in kvlesson.teaching.checks or
        as the function itself; PLAN when None."""
        self._plan = _frozen(plan or PLAN)
        self.clock = clock
        self._started, self._ended = {}, {}  # section -> clock reading
        self._verdicts, self._solved_at = {}, {}  # (section, part) -> latest Verdict, -> seconds to its first PASS
        self._current = None

    @property
    def plan(self):
        """{section: (minutes, {part: checker})}, read-only: a sheet whose plan could be edited after it was made
        would score whatever checker was put in (issue 29: a plan swapped for Verdict(True) gave 14 of 14)."""
        return self._plan

    def start(self, section):
        """Start `section`'s clock; the running section, if any, stops now."""
        if section not in self.plan:
            raise ValueError(f"no section {section!r}; the plan has {list(self.plan)}")
        now = self.clock()
        if self._current is not None and self._current != section:
            self._ended[self._current] = now
        self._started.setdefault(section, now)
        self._ended.pop(section, None)
        self._current = section
        budget, parts = self.plan[section]
        print(f"{section}: the clock is running. Budget {budget} min"
              + (f" for {len(parts)} parts." if parts else "; compare your answers with the model answers yourself."))

    def check(self, part, answer):
        """Run `part`'s checker on `answer`, note its verdict and return it, so a cell shows it.

        The part is filed under the section that lists it, so a cell of an earlier section can be run again at any
        time; a section whose clock was never started starts it now.
        """
        section, check = self._part(part)
        if answer is getattr(check, "reference", None) or _is_kvlessons(answer):
            verdict = failed(f"that is kvlesson's own {getattr(answer, '__name__', 'answer')}, not yours",
                             "the sheet scores your own function: write it in the exercise cell and pass that")
        else:
            verdict = check(answer)
        now = self.clock()
        self._started.setdefault(section, now)
        key = (section, part)
        self._verdicts[key] = verdict
        if verdict.ok and key not in self._solved_at:
            self._solved_at[key] = now - self._started[section]
        return verdict

    def verdict(self, part):
        """The latest verdict the sheet issued for `part`; a NOT YET if it was never checked."""
        section, _ = self._part(part)
        return self._verdicts.get((section, part), failed(f"{part} was never checked"))

    def solved(self, section):
        """The parts of `section` whose latest verdict passed."""
        return [p for p in self.plan[section][1] if self._verdicts.get((section, p), Verdict(False)).ok]

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
            if section not in self._started:
                lines.append(f"{section:18} not started (budget {budget} min)")
                continue
            seconds = self._seconds(section)
            over = " OVER" if seconds > budget * 60 else ""
            firsts = [f"{p} at {_clock(self._solved_at[(section, p)])}" for p in parts
                      if (section, p) in self._solved_at]
            lines.append(f"{section:18} {_clock(seconds):>8} of {budget} min{over}"
                         + (f"; {', '.join(firsts)}" if firsts else ""))
        return "\n".join(lines)

    def _part(self, part):
        """(section, checker function) of a part of the plan; ValueError naming the parts when there is none."""
        for section, (_, parts) in self.plan.items():
            if part in parts:
                check = parts[part]
                if isinstance(check, str):
                    from kvlesson.teaching import checks  # imported here: the checkers import the drill

                    check = getattr(checks, check)
                return section, check
        raise ValueError(f"no part {part!r} in the plan; the parts are "
                         f"{[p for _, parts in self.plan.values() for p in parts]}")

    def _seconds(self, section):
        parts = self.plan[section][1]
        if parts and all(self._verdicts.get((section, p), Verdict(False)).ok for p in parts):
            return max(self._solved_at[(section, p)] for p in parts)
        return self._ended.get(section, self.clock()) - self._started[section]


def _is_kvlessons(answer):
    """True for a function or class kvlesson itself defines: the reference answers, not a learner's."""
    return getattr(answer, "__module__", None) is not None and str(answer.__module__).startswith("kvlesson")


def _clock(seconds):
    """Seconds -> 'm:ss' (or 'h:mm:ss')."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
