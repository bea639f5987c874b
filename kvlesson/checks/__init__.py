"""Checkers for the "your turn" exercises.

Each checker runs your function against kvlesson's reference on several shapes, edge cases
included, and returns a Verdict: a pass, or what is wrong with a hint at why.
"""
from kvlesson.checks._verdict import Verdict, yours_or_ours  # noqa: F401  what every checker returns
from kvlesson.checks.attention import *  # noqa: F403  lesson 01
from kvlesson.checks.cache import *  # noqa: F403  lesson 03
from kvlesson.checks.drill import *  # noqa: F403  lesson 12
from kvlesson.checks.gqa import *  # noqa: F403  lesson 05
from kvlesson.checks.many import *  # noqa: F403  lesson 09
from kvlesson.checks.mask import *  # noqa: F403  lesson 04
from kvlesson.checks.precision import *  # noqa: F403  lesson 10
from kvlesson.checks.real_model import *  # noqa: F403  lesson 08
from kvlesson.checks.rope import *  # noqa: F403  lesson 06
from kvlesson.checks.shrink import *  # noqa: F403  lesson 11
from kvlesson.checks.why_cache import *  # noqa: F403  lesson 02
from kvlesson.checks.window import *  # noqa: F403  lesson 07
