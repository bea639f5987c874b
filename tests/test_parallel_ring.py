"""Ring attention on real ranks equals kvlesson.attention on one process, and the tests catch the mask's bugs.

Each launch runs CASES random cases (seeded, the same on every rank: H, Hkv, d, S up to 40, T = S or T < S), every P
from 1 to 4, both layouts, and split-KV decode; float64, so one process and P ranks agree to rounding (1e-12).
Mutants, each run on real ranks: every block masked by its local index (the classic bug), and an offset one
position off (a block's positions shifted by one), written into a script that patches the program and runs it.
"""
import textwrap

import numpy as np
import pytest

from kvlesson import attention
from kvlesson.parallel import launch, ring

CASES = 12


def errors(run):
    """-> the largest |ring - attention| of every case of a run."""
    return [float(np.abs(c["out"] - attention(c["q"], c["k"], c["v"])).max()) for c in run.result["cases"]]


@pytest.mark.parametrize("P", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", [["--layout", "contiguous"], ["--layout", "zigzag"], ["--split-kv"]])
def test_ring_attention_on_P_ranks_equals_attention(P, mode):
    run = launch.mpiexec(P, "ring", "--cases", CASES, "--seed", 10 * P, *mode, timeout=60)
    shapes = [(c["S"], c["T"]) for c in run.result["cases"]]
    assert any(S == T for S, T in shapes) and any(T < S for S, T in shapes)  # both kinds of case ran
    assert max(errors(run)) < 1e-12


def test_masking_each_block_by_its_local_index_fails_the_comparison():
    run = launch.mpiexec(3, "ring", "--cases", CASES, "--mask", "local", timeout=60)
    wrong = [e > 1e-3 for e in errors(run)]
    assert sum(wrong) >= CASES - 2, wrong  # a case with S < 3 can escape: every block then is one position


def test_an_offset_one_position_off_fails_the_comparison(tmp_path):
    mutant = tmp_path / "off_by_one.py"
    mutant.write_text(textwrap.dedent("""
        from kvlesson.parallel import launch, ring

        real = ring.partial_attention
        ring.partial_attention = lambda q, k, v, pos_q, pos_k: real(q, k, v, pos_q, pos_k + 1)  # the mutant
        launch.main(ring.program, ring.arguments())
    """))
    run = launch.launch(2, [str(mutant), "--cases", str(CASES), "--layout", "zigzag"], timeout=60)
    assert max(errors(run)) > 1e-3


def test_a_contiguous_layout_idles_rank_0_and_zigzag_balances_the_work():
    """Scores computed per rank (whole blocks, as a kernel computes them; a block wholly in a rank's future is
    skipped), T = S = 64 on 4 ranks: contiguous gives ranks 0..3 1, 2, 3, 4 blocks of 16 x 16; zigzag 4 half-blocks
    each."""
    work = {}
    for kind in ring.LAYOUTS:
        run = launch.mpiexec(4, "ring", "--S", 64, "--layout", kind, timeout=60)
        work[kind] = [sum(w) for w in run.result["cases"][0]["work"]]
        assert max(errors(run)) < 1e-12
    assert work["contiguous"] == [256, 512, 768, 1024]
    assert work["zigzag"] == [640] * 4


def test_the_layouts_hand_out_every_position_once():
    for S in (0, 1, 7, 64, 65):
        for P in (1, 2, 3, 4):
            for kind in ring.LAYOUTS:
                held = ring.layout(S, P, kind)
                assert len(held) == P and sorted(np.concatenate(held).tolist()) == list(range(S))
    assert [h.tolist() for h in ring.layout(8, 2, "zigzag")] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    with pytest.raises(ValueError, match="layout must be one of"):
        ring.layout(8, 2, "striped")


def test_one_rank_in_process_keeps_float32_and_equals_attention():
    """ring_attention itself, on a one-rank communicator (no message at P = 1): float32 in, float32 out."""
    from types import SimpleNamespace

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 5, 8), (2, 9, 8), (2, 9, 8)))
    out, lse, work = ring.ring_attention(SimpleNamespace(rank=0, size=1), q, k, v, np.arange(4, 9), [np.arange(9)])
    assert out.dtype == lse.dtype == np.float32 and work == [5 * 9]
    np.testing.assert_allclose(out, attention(q, k, v), atol=1e-5)
