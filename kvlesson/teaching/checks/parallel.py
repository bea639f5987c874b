"""Checkers for lesson 15: which KV heads a rank holds, the zigzag layout, and the bytes a decode rank receives.

check_kv_heads runs the learner's fn(rank, P, H, Hkv) on every rank of SmolLM2 at P = 1, 3 and 9 and of Llama 3.1 70B
at tensor parallelism 2 to 64, against kvlesson.parallel.tensor.heads. The slips it names: KV heads dealt round robin
(rank r gets r % Hkv), KV heads split as if P always divided them (nothing left for a rank when P > Hkv), the rank's
query heads for its KV heads, and one KV head a rank whatever P.

check_zigzag runs fn(S, P) for S a multiple of 2P and checks, in this order: P lists, every position exactly once,
the same number of positions a rank, then the causal work each rank's queries do, which names the imbalance, and last
the order itself (chunk r and chunk 2P - 1 - r); the hint says what the answer looks like (contiguous, chunks r and
P + r, striped).

check_decode_bytes runs fn(cfg, tp, nbytes) -> bytes one prompt token sends to each rank of a decode instance at
tensor parallelism tp, against 2 x n_layers x max(Hkv / tp, 1) x d x nbytes; the slips: the 2 for K and V, H for
Hkv, Hkv / tp below one head, the whole cache to every rank.
"""
import numpy as np

from kvlesson.configs import MODELS
from kvlesson.parallel import ring, tensor
from kvlesson.teaching.checks.gqa import numeric_answers, numeric_verdict
from kvlesson.teaching.verdict import Slip, as_array, attempt, checker, passed, reject, run

__all__ = ["check_kv_heads", "check_zigzag", "check_decode_bytes"]

SMOL, L70, L8 = MODELS["SmolLM2-135M"], MODELS["Llama 3.1 70B"], MODELS["Llama 3.1 8B"]

# ------------------------------------------------------------------------------------------------ KV heads

_HEAD_CASES = [(SMOL, 3), (SMOL, 9), (SMOL, 1), (L70, 8), (L70, 16), (L70, 2), (L70, 32), (L70, 64)]

_HEAD_SLIPS = [
    Slip("round robin", lambda r, P, H, Hkv: [r % Hkv], "",
         "KV heads are not dealt round robin: rank r holds query heads r*H/P onward, and query head h reads KV head "
         "h // (H / Hkv). Neighbouring ranks share a KV head when P > Hkv"),
    Slip("split as if P divides", lambda r, P, H, Hkv: list(range(r * Hkv // P, (r + 1) * Hkv // P)), "",
         "with P > Hkv there are fewer KV heads than ranks, and a range of Hkv / P < 1 heads is empty for most ranks. "
         "Every rank still needs the KV head its query heads read: find it from the query heads"),
    Slip("query heads", lambda r, P, H, Hkv: list(range(r * H // P, (r + 1) * H // P)), "",
         "those are the rank's query heads. Each group of G = H / Hkv query heads reads one KV head: h // G"),
    Slip("one a rank", lambda r, P, H, Hkv: [r], "",
         "a rank holds one KV head only when P = Hkv; with P < Hkv it holds Hkv / P of them, with P > Hkv the one "
         "its query heads share with P / Hkv - 1 other ranks"),
]


def _ints(got, case, what, example):
    """The learner's answer -> a sorted list of whole numbers, or a NOT YET."""
    a = as_array(got, case)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu" and not np.all(a == np.round(a))):
        reject(f"for {case} your function returned {a.dtype} {a.shape}; expected a list of {what}",
               f"return a flat list of whole numbers, e.g. {example}")
    return sorted(int(x) for x in a)


@checker
def check_kv_heads(fn):
    """fn(rank, P, H, Hkv) -> the KV heads (a list of ints) that rank `rank` of P holds, weights and cache."""
    answers = []  # (case, args, got, want) for every rank of every layout
    for cfg, P in _HEAD_CASES:
        for r in range(P):
            case = f"{cfg.name} (H={cfg.H}, Hkv={cfg.Hkv}) at P={P}, rank {r}"
            got = _ints(run(fn, r, P, cfg.H, cfg.Hkv, case=case), case, "KV head numbers", "[0] or [2, 3]")
            answers.append((case, (r, P, cfg.H, cfg.Hkv), got, list(tensor.heads(cfg, r, P)[1])))
    wrong = [a for a in answers if a[2] != a[3]]
    if wrong:
        case, args, got, want = wrong[0]
        slip = (next((s for s in _HEAD_SLIPS if all(_slip_gives(s, a[1], a[2]) for a in wrong)), None)
                or next((s for s in _HEAD_SLIPS if _slip_gives(s, args, got)), None))  # all it got wrong, or this one
        reject(f"for {case} you say {got}; it holds {want}",
               slip.hint if slip else "list the query heads of the rank, then the KV head each one reads")
    return passed(f"your ranks hold the right KV heads on {len(_HEAD_CASES)} layouts of SmolLM2 and Llama 3.1 70B, "
                  "P from 1 to 64: a share of them when P divides Hkv, one copied to P / Hkv ranks when P > Hkv")


def _slip_gives(slip, args, got):
    try:
        return sorted(slip.wrong(*args)) == got
    except Exception:  # a slip that does not apply here
        return False


# ------------------------------------------------------------------------------------------------ zigzag

_ZIGZAG_CASES = [(16, 2), (16, 4), (24, 3), (8, 4), (40, 5), (4, 1)]


def _causal_work(positions):
    """Score pairs the queries at `positions` compute under the causal mask over a whole text: sum of (p + 1)."""
    return int(sum(int(p) + 1 for p in positions))


def _looks_like(held, S, P):
    """What a wrong layout is, to say so."""
    chunk = S // (2 * P)
    if [list(h) for h in held] == [list(range(r * S // P, (r + 1) * S // P)) for r in range(P)]:
        return "that is the contiguous layout, the one that idles rank 0"
    halves = [sorted([*range(r * chunk, (r + 1) * chunk), *range((P + r) * chunk, (P + r + 1) * chunk)])
              for r in range(P)]
    if [sorted(h) for h in held] == halves:
        return "chunks r and P + r move the late half by the same amount for every rank: rank 0 still does least"
    if [sorted(h) for h in held] == [list(range(r, S, P)) for r in range(P)]:
        return ("that is the striped layout (position p on rank p % P): balanced too, but this exercise asks for the "
                "zigzag of 2P chunks")
    return "cut the S positions into 2P chunks of S / 2P; rank r takes chunk r and chunk 2P - 1 - r"


@checker
def check_zigzag(fn):
    """fn(S, P) -> P lists: rank r's positions, chunk r then chunk 2P - 1 - r of 2P chunks (S a multiple of 2P)."""
    for S, P in _ZIGZAG_CASES:
        case = f"S={S} positions on P={P} ranks"
        got = run(fn, S, P, case=case)
        n = attempt(len, got).value  # None for a thing without a length (a number, a 0-d array)
        if isinstance(got, (str, bytes, dict, set)) or n != P:
            reject(f"for {case} your function returned {type(got).__name__}"
                   f"{'' if n is None else f' of {n}'}; expected {P} lists, one per rank",
                   "return a list of P lists of positions: held[r] is what rank r holds")
        held = [_ints(h, f"{case}, rank {r}", "positions", "[0, 1, 6, 7]") for r, h in enumerate(got)]
        flat = sorted(p for h in held for p in h)
        if flat != list(range(S)):
            missing = sorted(set(range(S)) - set(flat))
            twice = sorted({p for p in flat if flat.count(p) > 1})
            reject(f"for {case} every position must be on exactly one rank; "
                   + (f"missing {missing[:6]}" if missing else "") + (f" twice {twice[:6]}" if twice else ""),
                   "the ranks together hold the whole sequence, each position once")
        sizes = [len(h) for h in held]
        work = [_causal_work(h) for h in held]
        want = [list(h) for h in ring.layout(S, P, "zigzag")]
        if len(set(sizes)) > 1 or max(work) != min(work):
            ratio = max(work) / max(min(work), 1)
            reject(f"for {case} the ranks hold {sizes} positions and their queries score {work} keys under the "
                   f"causal mask: the busiest does {ratio:.1f}x the idlest's work", _looks_like(held, S, P))
        if [sorted(h) for h in held] != want:
            reject(f"for {case} your ranks hold {held}; zigzag gives {want}", _looks_like(held, S, P))
    return passed(f"zigzag: every position once, and equal causal work on every rank, on {len(_ZIGZAG_CASES)} "
                  "sizes from 1 to 5 ranks")


# ------------------------------------------------------------------------------------------------ decode bytes


def decode_bytes(cfg, tp, nbytes):
    """Bytes of one prompt token's cache that each rank of a decode instance at tensor parallelism tp receives."""
    return 2 * cfg.n_layers * max(cfg.Hkv // tp, 1) * cfg.d * nbytes


_BYTES_CASES = [(f"{cfg.name} in {name} at decode TP={tp}", (cfg, tp, nbytes))
                for cfg, name, nbytes, tps in ((SMOL, "float32", 4, (1, 3, 9)), (L8, "bfloat16", 2, (1, 2, 8, 16)),
                                               (L70, "fp8", 1, (8, 16)))
                for tp in tps]

_BYTES_SLIPS = [
    Slip("no 2", lambda cfg, tp, n: decode_bytes(cfg, tp, n) / 2, "the factor 2 is missing",
         "every position has a key AND a value in every layer: 2 x n_layers x heads x d x bytes"),
    Slip("H for Hkv", lambda cfg, tp, n: 2 * cfg.n_layers * max(cfg.H // tp, 1) * cfg.d * n, "you counted query heads",
         "the cache holds the Hkv KV heads, not the H query heads"),
    Slip("fraction", lambda cfg, tp, n: 2 * cfg.n_layers * cfg.Hkv / tp * cfg.d * n,
         "below one KV head a rank", "with tp > Hkv a rank cannot hold a fraction of a head: it holds a whole copy of "
         "one, so max(Hkv / tp, 1) heads"),
    Slip("whole cache", lambda cfg, tp, n: 2 * cfg.n_layers * cfg.Hkv * cfg.d * n, "the whole token to every rank",
         "each decode rank needs only the KV heads its query heads read: Hkv / tp of them (at least one)"),
    Slip("bits", lambda cfg, tp, n: decode_bytes(cfg, tp, n) * 8, "bits, not bytes", "multiply by bytes per element"),
]


@checker
def check_decode_bytes(fn):
    """fn(cfg, tp, nbytes) -> bytes of one prompt token's cache that each decode rank receives (cfg: a Config with
    n_layers, H, Hkv, d; tp: the decode instance's tensor parallelism; nbytes: bytes per element)."""
    answers = numeric_answers(fn, _BYTES_CASES, decode_bytes)
    return numeric_verdict(answers, _BYTES_CASES, _BYTES_SLIPS, "B",
                           "K and V, every layer, the KV heads this rank holds (at least one), d numbers each",
                           f"your bytes per decode rank agree on {len(_BYTES_CASES)} cases, SmolLM2, Llama 3.1 8B "
                           "and 70B, tensor parallelism 1 to 16, copies of a KV head included")
