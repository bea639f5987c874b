"""Checkers for the "your turn" exercises.

Each checker runs your function against kvlesson's reference on several shapes, edge cases
included, and returns a Verdict: a pass, or what is wrong with a hint at why.
"""
from kvlesson.teaching.checks.attention import *  # noqa: F403  lesson 01
from kvlesson.teaching.checks.cache import *  # noqa: F403  lesson 03
from kvlesson.teaching.checks.drill import *  # noqa: F403  lesson 12
from kvlesson.teaching.checks.gqa import *  # noqa: F403  lesson 05
from kvlesson.teaching.checks.many import *  # noqa: F403  lesson 09
from kvlesson.teaching.checks.mask import *  # noqa: F403  lesson 04
from kvlesson.teaching.checks.parallel import *  # noqa: F403  lesson 15
from kvlesson.teaching.checks.precision import *  # noqa: F403  lesson 10
from kvlesson.teaching.checks.real_model import *  # noqa: F403  lesson 08
from kvlesson.teaching.checks.rope import *  # noqa: F403  lesson 06
from kvlesson.teaching.checks.scheduler import *  # noqa: F403  lesson 13
from kvlesson.teaching.checks.server import *  # noqa: F403  lesson 16
from kvlesson.teaching.checks.shrink import *  # noqa: F403  lesson 11
from kvlesson.teaching.checks.speculative import *  # noqa: F403  lesson 14
from kvlesson.teaching.checks.why_cache import *  # noqa: F403  lesson 02
from kvlesson.teaching.checks.window import *  # noqa: F403  lesson 07
from kvlesson.teaching.verdict import Verdict, yours_or_ours  # noqa: F401  what every checker returns
