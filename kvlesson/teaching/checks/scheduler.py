"""Checkers for lesson 13: the chained block keys of automatic prefix caching, and the token budget of one step.

Block keys may come from any hash function, so the first checker tests what a key must do rather than what it is:
key i is the same for two sequences exactly when their first (i + 1) * block_size tokens are the same. It then names
the slips that break it: a block keyed on its own tokens only (two prompts share a block they must not), keys that
depend on later tokens or the length, a key for the partly filled last block, tokens summed or sorted (order lost),
tokens joined into text without a separator. The budget checker compares with kvlesson's split and names a budget
that forgets the decodes, chunks larger than a prompt needs, a budget spent twice, an even split, the wrong order.
"""
import math

import numpy as np

from kvlesson.serving.engine import split_budget
from kvlesson.serving.paged import PagedKVCache, block_hashes
from kvlesson.teaching.checks.delegation import refuse_delegation
from kvlesson.teaching.verdict import Slip, as_number, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_block_hashes", "check_split_budget", "check_blocks_to_start", "check_preemption"]


# ------------------------------------------------------------------------------------------------ block keys

A, B, C = [5, 9, 2, 7], [1, 1, 3, 8], [6, 0, 4, 4]

_CHAIN_HINT = ("hash the key of the block before together with this block's tokens (the first block has no key before "
               "it), so that key i stands for every token from the start up to the end of block i")


def _keys(fn, ids, bs, case, crash_hint=None):
    """The learner's keys for ids, as a list of hashable values, or a NOT YET."""
    given = list(ids)
    got = run(fn, given, bs, case=case, crash_hint=crash_hint)
    if given != list(ids):
        reject(f"for {case}: your function changed ids", "read the token ids; the engine keeps using them")
    if isinstance(got, np.ndarray) and got.ndim == 1:
        got = got.tolist()
    if not isinstance(got, (list, tuple)):
        reject(f"for {case}: your function returned {type(got).__name__}; expected a list of keys",
               "one key per full block, in order, in a list")
    for key in got:
        try:
            hash(key)
        except TypeError:
            reject(f"for {case}: a key is a {type(key).__name__}, which cannot be hashed",
                   "the cache looks blocks up by key in a dict: return something hashable (bytes, an int, a tuple)")
    return list(got)


@checker
def check_block_hashes(fn):
    """fn(ids, block_size) -> [key of each full block]: key i must be equal for two sequences exactly when their first
    (i + 1) * block_size token ids are equal. Any hash will do (kvlesson's chains sha256 over the key before)."""
    refuse_delegation(fn, block_hashes, "paged.block_hashes")
    for case, ids, bs, want in [("three full blocks and two tokens more (block_size 4)", A + B + C + [1, 2], 4, 3),
                                ("one full block (block_size 4)", A, 4, 1),
                                ("three tokens, less than a block (block_size 4)", A[:3], 4, 0),
                                ("no tokens at all", [], 4, 0), ("blocks of one token", [3, 1, 4], 1, 3)]:
        got = _keys(fn, ids, bs, case)
        if len(got) != want:
            hint = ("only full blocks get a key: a partly filled one may still grow, and its key would then be "
                    "wrong" if len(got) > want else "every full block gets a key, the last full one too: "
                    "len(ids) // block_size of them")
            reject(f"for {case}: you returned {len(got)} keys; expected {want}", hint)
    _real_vocabulary(fn)
    if _keys(fn, A + B, 4, "the same ids twice") != _keys(fn, A + B, 4, "the same ids twice"):
        reject("the same ids gave different keys on two calls", "a key must be a function of the tokens only: no "
                                                                "random salt, no counter, no object ids")
    same, other = _keys(fn, A + B + C, 4, "A + B + C"), _keys(fn, A + B + A, 4, "A + B + A")
    if same[:2] != other[:2]:
        reject("A + B + C and A + B + A begin with the same two blocks, and got different keys for them",
               "key i may depend on ids[: (i + 1) * block_size] only, not on later tokens or on the length")
    if same[2] == other[2]:
        reject("A + B + C and A + B + A differ in their third block, and got the same key for it",
               "the key of a block must change when the block's own tokens change")
    longer = _keys(fn, A + B + [1, 2], 4, "A + B and two tokens more")[:2]
    if _keys(fn, A + B, 4, "A + B") != longer or _keys(fn, A + B + C, 4, "A + B + C")[:2] != longer:
        reject("A + B, A + B + [1, 2] and A + B + C begin with the same two blocks, and got different keys for them",
               "block i is ids[i * block_size : (i + 1) * block_size] whatever the length of ids (np.array_split "
               "cuts other blocks), and its key names those tokens and the ones before them, nothing else: not "
               "len(ids), not the tokens after the block")
    if _keys(fn, C + B, 4, "C + B")[1] == _keys(fn, A + B, 4, "A + B")[1]:
        reject("A + B and C + B share their second block's tokens after different first blocks, and got the same "
               "key for it: a new request would reuse keys and values computed after the wrong prefix (wrong text)",
               _CHAIN_HINT)
    if len(set(_keys(fn, A + A + A, 4, "A + A + A"))) != 3:
        reject("A + A + A holds the same tokens in each of its three blocks, and two of them got the same key",
               _CHAIN_HINT)
    if _keys(fn, [9, 5, 2, 7], 4, "[9, 5, 2, 7]") == _keys(fn, A, 4, "[5, 9, 2, 7]"):
        reject("[5, 9, 2, 7] and [9, 5, 2, 7] got the same key", "the order of tokens matters: hash the sequence, "
                                                                  "not a sum, a sorted list or a set")
    if _keys(fn, [1, 23], 2, "[1, 23]") == _keys(fn, [12, 3], 2, "[12, 3]"):
        reject("the blocks [1, 23] and [12, 3] got the same key",
               "joined into text without a separator both read '123': hash the ids themselves (a tuple, or bytes of "
               "fixed width), or put a separator between them")
    _every_prefix(fn)
    return passed("a key is equal exactly when every token up to the end of its block is: shared prefixes share keys, "
                  "the same block after another prefix does not, partial blocks get none")


# ids a real vocabulary reaches (SmolLM2's go to 49,151, Llama 3's to 128,255), each equal to 1 below 2**8 and 2**16:
# a key over bytes narrower than the id (uint8, uint16, bytes(list)) cannot tell them apart
WIDE = [1, 257, 65537, 128001]


def _wide_hint(error):
    if isinstance(error, (ValueError, OverflowError)):
        return ("token ids are not bytes: they run up to the vocabulary's size (49,151 for SmolLM2), and bytes() of a "
                "list takes 0..255 only. Convert with np.asarray(block, dtype=np.int64).tobytes(), or hash a tuple")
    return None


def _real_vocabulary(fn):
    """Ids past 255 and past 65,535 must work and must keep their keys apart."""
    case = "the block [49151, 300, 256, 5] (SmolLM2's ids reach 49,151)"
    _keys(fn, [49151, 300, 256, 5], 4, case, crash_hint=_wide_hint)
    keys = [_keys(fn, [t], 1, f"the one-token block [{t}]", crash_hint=_wide_hint)[0] for t in WIDE]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        if keys[i] == keys[j]:
            reject(f"the one-token blocks [{WIDE[i]}] and [{WIDE[j]}] got the same key",
                   f"{WIDE[j]} - {WIDE[i]} = {WIDE[j] - WIDE[i]:,} is a multiple of 2**{8 if j == 1 else 16}: your key "
                   "keeps only the low bytes of each id (uint8, uint16). Token ids reach 128,255 in Llama 3's "
                   "vocabulary: convert with dtype=np.int64")


def _every_prefix(fn, bs=2):
    """Many random sequences of every length over a few ids, small and wide, so that prefixes repeat: key i equal
    exactly when the first (i + 1) * bs tokens are equal, whatever comes after them."""
    rng = np.random.default_rng(13)
    owner, key_of = {}, {}  # key -> the prefix it stood for; prefix -> its key
    for n in range(100):
        ids = rng.choice([0, 2, *WIDE], int(rng.integers(0, 4 * bs))).tolist()
        for i, key in enumerate(_keys(fn, ids, bs, f"random sequence {n + 1}, {ids}")):
            prefix = tuple(ids[: (i + 1) * bs])
            if owner.setdefault(key, prefix) != prefix:
                reject(f"the prefixes {list(owner[key])} and {list(prefix)} got the same key",
                       "different prefixes must get different keys; a weak mix (a sum, an xor, a small modulus, ids "
                       "cut to fewer bytes) collides: use a real hash of the key before and the block's tokens, "
                       "such as hashlib.sha256 over int64 bytes")
            if key_of.setdefault(prefix, key) != key:
                reject(f"the prefix {list(prefix)} got two different keys in two sequences (the second {ids})",
                       "key i may depend on ids[: (i + 1) * block_size] only: not on len(ids), not on the tokens "
                       "after its block, and block i is ids[i * block_size : (i + 1) * block_size]")


# ------------------------------------------------------------------------------------------------ the budget

_BUDGET_CASES = [  # (what, decodes, prefills, budget)
    ("3 decodes and prefills of 10, 5 and 2 tokens, a budget of 16", 3, [10, 5, 2], 16),
    ("no decodes and one prompt of 20 tokens, a budget of 16", 0, [20], 16),
    ("16 decodes that fill a budget of 16, and two prompts of 4", 16, [4, 4], 16),
    ("2 decodes and prompts of 3 and 4 that fit, a budget of 16", 2, [3, 4], 16),
    ("5 decodes and no prefill, a budget of 8", 5, [], 8),
    ("1 decode and prompts of 7 and 9, a budget of 8", 1, [7, 9], 8),
    ("4 decodes and prompts of 2, 100 and 1, a budget of 32", 4, [2, 100, 1], 32),
]


def _each_capped_only(decodes, prefills, budget):
    return [min(p, budget - decodes) for p in prefills]


def _no_cap(decodes, prefills, budget):
    left, out = budget - decodes, []
    for _ in prefills:
        out.append(left)
        left = 0
    return out


def _even(decodes, prefills, budget):
    share = (budget - decodes) // max(len(prefills), 1)
    return [min(p, share) for p in prefills]


_BUDGET_SLIPS = [
    Slip("decodes not counted", lambda d, p, b: split_budget(0, p, b),
         "for {case}: the prefill chunks take the whole budget, as if the decodes cost nothing",
         "every running decode takes one token of the same budget, and goes first: the prefills share what is left, "
         "budget - decodes. Otherwise a step runs more than max_batch_tokens tokens"),
    Slip("each capped alone", _each_capped_only,
         "for {case}: each prefill is given up to everything the decodes left, so together they overspend it",
         "subtract each chunk from what is left before the next prefill takes its own"),
    Slip("whole rest to the first", _no_cap,
         "for {case}: a chunk is larger than what its prefill still needs",
         "a prefill takes min(what it still needs, what is left): no more than its prompt holds"),
    Slip("even split", _even, "for {case}: the budget is split evenly between the prefills",
         "first come, first served: the oldest prefill takes what it needs first, and the next ones what is left; an "
         "even split leaves every prompt waiting longer for its first token"),
    Slip("reversed", lambda d, p, b: split_budget(d, p[::-1], b)[::-1],
         "for {case}: the last prefill is served first", "give the budget in the order the prefills are listed"),
    Slip("one short", lambda d, p, b: split_budget(d + 1, p, b) if d < b else None,
         "for {case}: one token of the budget is never used", "what the decodes leave is budget - decodes exactly"),
]


@checker
def check_split_budget(fn):
    """fn(decodes, prefills, budget) -> [chunk for each prefill]: the decodes' tokens first, one each; then what is
    left to the prefills in order, each taking what it still needs or what is left, whichever is less."""
    refuse_delegation(fn, split_budget, "engine.split_budget")
    for case, decodes, prefills, budget in _BUDGET_CASES:
        want = split_budget(decodes, prefills, budget)
        got = run(fn, decodes, list(prefills), budget, case=case)
        if isinstance(got, np.ndarray):
            got = got.tolist()
        if not isinstance(got, (list, tuple)):
            reject(f"for {case}: your function returned {type(got).__name__}; expected a list of chunk sizes",
                   "one number of tokens for each prefill, in order")
        if len(got) != len(want):
            reject(f"for {case}: you returned {len(got)} chunks for {len(prefills)} prefills",
                   "one chunk per prefill, 0 for one that gets nothing this step")
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in got):
            reject(f"for {case}: a chunk is not a whole number of tokens ({got})", "use integers (//, min), not /")
        got = [int(c) for c in got]
        if got == want:
            continue
        slip = first_slip(got, _BUDGET_SLIPS, (decodes, list(prefills), budget), same=lambda g, w: g == list(w))
        if slip is not None:
            reject_slip(slip, case)
        if min(got, default=0) < 0:
            reject(f"for {case}: you returned a negative chunk ({got})", "when nothing is left, a prefill gets 0")
        reject(f"for {case}: you returned {got}; expected {want}",
               "decodes first (one token each), then each prefill in order takes min(what it needs, what is left)")
    return passed("decodes are paid first, prefills take what is left in order, none more than it needs, and no step "
                  "spends more than its budget")


# ------------------------------------------------------------------------------------------------ admission


def blocks_to_start(P, cached, block_size, idle=False):
    """Blocks a request of P prompt tokens takes from blocks_free to start, when the prefix cache holds the first
    `cached` full blocks of its prompt: in use by other sequences, or idle (cached, nobody using them). Asked of a real
    pool (PagedKVCache.cached_cost, what the Engine admits by), not worked out here: this is the answer's source."""
    pool = PagedKVCache(math.ceil(P / block_size) + cached + 1, block_size, 1, 1)
    ids = list(range(1, P + 1))
    held = pool.new_sequence()
    pool.sequence(held).append(np.zeros((1, cached * block_size, 1)), np.zeros((1, cached * block_size, 1)))
    pool.publish(held, ids)
    if idle:
        pool.free(held)
    return pool.cached_cost(ids, P - 1)[1]  # the Engine caps the cached prefix at P - 1: the last token must run


_START_CASES = [  # (what, P, cached, block_size, idle)
    ("a prompt of 40 tokens, nothing cached, blocks of 16", 40, 0, 16, False),
    ("a prompt of 48 tokens, nothing cached, blocks of 16", 48, 0, 16, False),
    ("a prompt of 40 tokens whose first 2 blocks of 16 are cached and in use", 40, 2, 16, False),
    ("a prompt of 48 tokens whose 3 blocks of 16 are all cached and in use", 48, 3, 16, False),
    ("a prompt of 48 tokens whose first block of 16 is cached and in use", 48, 1, 16, False),
    ("a prompt of 40 tokens whose first 2 blocks of 16 are cached, nobody using them", 40, 2, 16, True),
    ("a prompt of 48 tokens whose 3 blocks of 16 are all cached, nobody using them", 48, 3, 16, True),
    ("a prompt of 4 tokens, all cached in blocks of 1 and in use", 4, 4, 1, False),
    ("a prompt of 1 token, nothing cached, blocks of 4", 1, 0, 4, False),
    ("a prompt of 8 tokens whose 2 blocks of 4 are all cached and in use", 8, 2, 4, False),
]

_START_SLIPS = [
    Slip("worst case", lambda P, c, bs, idle: math.ceil(P / bs) + 1, "",
         "admission on current need counts the prompt's blocks only, not room for the answer: the answer's blocks "
         "are taken one at a time as it crosses block boundaries"),
    Slip("floor", lambda P, c, bs, idle: P // bs - (0 if idle else c) + (c * bs == P and not idle), "",
         "a partly filled last block is a block too: ceil(P / block_size), not P // block_size"),
    Slip("cache ignored", lambda P, c, bs, idle: math.ceil(P / bs), "",
         "blocks found in the prefix cache and in use by another sequence are shared, not taken from the free list: "
         "they cost nothing"),
    Slip("last token forgotten", lambda P, c, bs, idle: math.ceil(P / bs) - (0 if idle else c), "",
         "when every block of the prompt is cached, the request still runs its last prompt token (its logits give "
         "the first new token), and writing that position's key and value into a block another sequence shares "
         "copies the block first (copy-on-write): one block"),
    Slip("idle for free", lambda P, c, bs, idle: math.ceil(P / bs) - c + (c * bs == P), "",
         "a cached block nobody uses counts among blocks_free (it is evicted when a free block is wanted): taking "
         "it leaves one block fewer for everyone else, so it costs one, like a fresh block. It is not shared once "
         "taken, so no copy is needed either"),
]


@checker
def check_blocks_to_start(fn):
    """fn(P, cached, block_size, idle) -> how many blocks a request of P prompt tokens takes from blocks_free to start,
    when its first `cached` full blocks are in the prefix cache, in use by others (idle False) or by nobody (True)."""
    refuse_delegation(fn, blocks_to_start, "check_blocks_to_start's reference")
    answers = [(case, (P, cached, bs, idle), as_number(run(fn, P, cached, bs, idle, case=case), case, integer=True))
               for case, P, cached, bs, idle in _START_CASES]
    for case, args, got in answers:
        want = blocks_to_start(*args)
        if got != want:
            slip = slip_for_answers(answers, args, got, _START_SLIPS)
            reject(f"for {case} you said {got} block{'s' if got != 1 else ''}; the pool takes {want}",
                   slip.hint if slip else "count the blocks that hold the prompt, ceil(P / block_size); take away the "
                                          "cached ones others use; add what writing its last token costs")
    return passed(f"on {len(_START_CASES)} prompts, partly, wholly or not cached, shared or idle, your count is what "
                  "the pool takes: ceil(P / block_size) blocks, less the shared cached ones, plus one copy when the "
                  "whole prompt is cached")


def slip_for_answers(answers, args, got, slips):
    """The slip that gives every answer the learner gave, else the first that gives this one, else None."""
    def gives(slip, a, g):
        try:
            return slip.wrong(*a) == g
        except Exception:  # a slip that does not apply to these inputs
            return False

    return (next((sl for sl in slips if all(gives(sl, a, g) for _, a, g in answers)), None)
            or next((sl for sl in slips if gives(sl, args, got)), None))


# ------------------------------------------------------------------------------------------------ preemption


def preempted(lengths, free, block_size):
    """The victims of one step's decodes, in the order they go -> [indices]: sequences holding lengths[i] positions,
    admitted in that order and all decoding; free blocks in the pool; no prefix caching. Each decode, oldest first,
    takes a new block when its next position starts one; while none is free, the newest running sequence (perhaps
    the decode itself) is preempted and its blocks are freed. The Engine's rule (Engine._decodes), written plainly."""
    running, victims, spent = list(range(len(lengths))), [], 0
    for i in range(len(lengths)):
        if i not in running:
            continue
        need = int(lengths[i] % block_size == 0)
        while i in running and need > free - spent:
            victim = running.pop()
            victims.append(victim)
            free += math.ceil(lengths[victim] / block_size)
        spent += need if i in running else 0
    return victims


_PREEMPT_CASES = [  # (what, lengths, free, block_size)
    ("3 sequences of 10, 16 and 7 positions, 0 free blocks, blocks of 4", [10, 16, 7], 0, 4),
    ("4 sequences of 8, 8, 8 and 9 positions, 1 free block, blocks of 4", [8, 8, 8, 9], 1, 4),
    ("2 sequences of 8 and 4 positions, 0 free blocks, blocks of 4: the newest needs a block itself", [8, 4], 0, 4),
    ("3 sequences of 16, 3 and 16 positions, 0 free blocks, blocks of 16", [16, 3, 16], 0, 16),
    ("5 sequences of 12, 20, 4, 17 and 8 positions, 1 free block, blocks of 4", [12, 20, 4, 17, 8], 1, 4),
    ("3 sequences of 5, 6 and 7 positions, 0 free blocks, blocks of 4: nobody needs a block", [5, 6, 7], 0, 4),
    ("4 sequences of 16 positions each, 2 free blocks, blocks of 16", [16, 16, 16, 16], 2, 16),
    ("one sequence of 4 positions, 0 free blocks, blocks of 4", [4], 0, 4),
    ("4 sequences of 8, 8, 5 and 5 positions, 0 free blocks, blocks of 4", [8, 8, 5, 5], 0, 4),
    ("4 sequences of 8, 8, 1 and 1 positions, 0 free blocks, blocks of 4", [8, 8, 1, 1], 0, 4),
    ("3 sequences of 4 positions each, 0 free blocks, blocks of 4", [4, 4, 4], 0, 4),
]


def _oldest_first(lengths, free, bs):
    running, victims, spent = list(range(len(lengths))), [], 0
    for i in range(len(lengths)):
        if i not in running:
            continue
        need = int(lengths[i] % bs == 0)
        while i in running and need > free - spent:
            victim = running.pop(0)
            victims.append(victim)
            free += math.ceil(lengths[victim] / bs)
        spent += need if i in running else 0
    return victims


def _needy_itself(lengths, free, bs):
    victims, spent = [], 0
    for i, n in enumerate(lengths):
        if n % bs == 0:
            if free - spent < 1:
                victims.append(i)
            else:
                spent += 1
    return victims


def _variant(lengths, free, bs, *, need=None, frees=None, spend=True):
    running, victims, spent = list(range(len(lengths))), [], 0
    for i in range(len(lengths)):
        if i not in running:
            continue
        wants = need(lengths[i], bs) if need else int(lengths[i] % bs == 0)
        while i in running and wants > free - spent:
            victim = running.pop()
            victims.append(victim)
            free += frees(lengths[victim], bs) if frees else math.ceil(lengths[victim] / bs)
        spent += wants if i in running and spend else 0
    return victims


_PREEMPT_SLIPS = [
    Slip("oldest evicted", _oldest_first, "",
         "evict the most recently admitted sequence, the end of the list: the oldest has waited longest and holds the "
         "most work, and evicting by age the other way could starve it forever"),
    Slip("the needy one evicted", _needy_itself, "",
         "the sequence that needs the block is not the victim unless it is the newest: evict from the newest end "
         "until the block fits, and count the blocks each victim frees"),
    Slip("boundary off by one", lambda n, f, bs: _variant(n, f, bs, need=lambda L, b: int((L + 1) % b == 0)), "",
         "a sequence holding L positions writes its next token at position L, which starts a new block exactly when "
         "L % block_size == 0 (L positions fill L / block_size blocks), not when (L + 1) % block_size == 0"),
    Slip("floor of the freed blocks", lambda n, f, bs: _variant(n, f, bs, frees=lambda L, b: L // b), "",
         "a victim frees every block it holds, its partly filled last block too: ceil(L / block_size)"),
    Slip("blocks spent forgotten", lambda n, f, bs: _variant(n, f, bs, spend=False), "",
         "a block one decode takes in this step is no longer free for the next decode of the same step: count the "
         "blocks spent as you go"),
]


@checker
def check_preemption(fn):
    """fn(lengths, free, block_size) -> the indices of the sequences preempted this step, in the order they go:
    lengths[i] positions held by the i-th running sequence (admitted in that order, all decoding), `free` blocks free.
    Decodes go oldest first; a decode whose next position starts a block needs one; while none is free, the newest
    running sequence is preempted and its blocks freed."""
    refuse_delegation(fn, preempted, "check_preemption's reference")
    answers = []
    for case, lengths, free, bs in _PREEMPT_CASES:
        got = run(fn, list(lengths), free, bs, case=case)
        if isinstance(got, np.ndarray) and got.ndim == 1:
            got = got.tolist()
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, (int, np.integer)) and
                                                         not isinstance(x, (bool, np.bool_)) for x in got):
            reject(f"for {case} you returned {got!r:.60}; expected a list of sequence indices",
                   "return the indices (0 = the oldest) of the sequences preempted, in the order they go; [] for none")
        answers.append((case, (list(lengths), free, bs), [int(x) for x in got]))
    for case, args, got in answers:
        want = preempted(*args)
        if got != want:
            slip = slip_for_answers(answers, args, got, _PREEMPT_SLIPS)
            reject(f"for {case} you preempted {got}; the engine preempts {want}",
                   slip.hint if slip else "walk the decodes oldest first; each needs a block when lengths[i] % "
                                          "block_size == 0; while none is free, preempt the newest still running "
                                          "(perhaps itself) and add its ceil(length / block_size) blocks to the free "
                                          "count")
    return passed(f"on {len(_PREEMPT_CASES)} steps your victims are the engine's: decodes oldest first, a block only "
                  "at a boundary, the newest evicted until the block fits, every block a victim held freed")


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_block_hashes.reference = block_hashes
check_split_budget.reference = split_budget
check_blocks_to_start.reference = blocks_to_start
check_preemption.reference = preempted
