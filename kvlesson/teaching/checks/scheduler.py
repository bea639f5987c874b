"""Checkers for lesson 13: the chained block keys of automatic prefix caching, and the token budget of one step.

Block keys may come from any hash function, so the first checker tests what a key must do rather than what it is:
key i is the same for two sequences exactly when their first (i + 1) * block_size tokens are the same. It then names
the slips that break it: a block keyed on its own tokens only (two prompts share a block they must not), keys that
depend on later tokens or the length, a key for the partly filled last block, tokens summed or sorted (order lost),
tokens joined into text without a separator. The budget checker compares with kvlesson's split and names a budget
that forgets the decodes, chunks larger than a prompt needs, a budget spent twice, an even split, the wrong order.
"""
import numpy as np

from kvlesson.serving.engine import split_budget
from kvlesson.serving.paged import block_hashes
from kvlesson.teaching.checks.delegation import refuse_delegation
from kvlesson.teaching.verdict import Slip, checker, first_slip, passed, reject, reject_slip, run

__all__ = ["check_block_hashes", "check_split_budget"]


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


# what later cells fall back on (checks.yours_or_ours) while an exercise is unsolved
check_block_hashes.reference = block_hashes
check_split_budget.reference = split_budget
