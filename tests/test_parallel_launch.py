"""Launching ranks, and every way a launch goes wrong: each ends in an error that says what happened, never a hang.

Every launch here is bounded twice: MPICH's own MPIEXEC_TIMEOUT, and launch._bounded, which kills mpiexec's whole
process group after the bound plus a margin. The scripts are written into tmp_path and run as the programs are.
"""
import sys
import textwrap
import time

import pytest

from kvlesson.parallel import launch

RING = """
import numpy as np
from kvlesson.parallel import launch


def program(comm, args):
    x = np.full(4, float(comm.rank))  # [4]
    got = np.empty_like(x)
    for step in range(3):
        {fault}
        comm.Sendrecv(x, dest=(comm.rank + 1) % comm.size, recv=got, source=(comm.rank - 1) % comm.size)
        x = got.copy()
    total = np.empty_like(x)
    comm.Allreduce(x, total)
    return {{"total": total.tolist(), "ledger": comm.ledger()}}


launch.main(program, __import__("argparse").ArgumentParser())
"""


def script(tmp_path, fault="pass"):
    path = tmp_path / "ring_script.py"
    path.write_text(textwrap.dedent(RING.format(fault=fault)))
    return str(path)


def test_a_ring_and_an_all_reduce_on_four_ranks_with_their_bytes_counted(tmp_path):
    run = launch.launch(4, [script(tmp_path)], timeout=30)
    assert run.result["total"] == [6.0] * 4  # 0 + 1 + 2 + 3, whatever the ring did to each rank's x
    assert run.result["ledger"] == {"Sendrecv": (3, 3 * 32), "Allreduce": (1, 32)}


def test_a_rank_that_raises_stops_every_rank_and_its_error_arrives_by_name(tmp_path):
    fault = "if comm.rank == 2 and step == 1: raise ValueError('rank two refuses')"
    start = time.perf_counter()
    with pytest.raises(ValueError, match="rank 2 of 4: ValueError: rank two refuses"):
        launch.launch(4, [script(tmp_path, fault)], timeout=30)
    assert time.perf_counter() - start < 25  # the abort ended the others; nobody waited for the time limit


def test_a_rank_that_dies_mid_ring_ends_the_launch_with_a_rank_error(tmp_path):
    fault = "if comm.rank == 1 and step == 1: __import__('os')._exit(3)"
    start = time.perf_counter()
    with pytest.raises(launch.RankError, match="a rank ended before the program finished"):
        launch.launch(4, [script(tmp_path, fault)], timeout=30)
    assert time.perf_counter() - start < 25


@pytest.mark.slow  # waits out the launch's time limit
def test_a_rank_that_never_sends_is_ended_at_the_time_limit(tmp_path):
    fault = "if comm.rank == 0 and step == 1: __import__('time').sleep(60)"
    start = time.perf_counter()
    with pytest.raises(launch.RankError, match="did not finish within 3 s"):
        launch.launch(3, [script(tmp_path, fault)], timeout=3)
    assert time.perf_counter() - start < 3 + 15 + 5  # MPICH's bound, or ours at worst


def test_ranks_that_disagree_on_shapes_are_refused_by_name(tmp_path):
    """Two programs in one job (MPMD: mpiexec A : B), the second rank given another case: `agree` names it."""
    def ranks(n, S):
        return ["-n", str(n), sys.executable, "-m", "kvlesson.parallel.ring", "--S", str(S), "--out", str(tmp_path)]

    cmd = [launch.find_mpiexec(), *ranks(1, 12)[:], ":", *ranks(2, 13)]
    with pytest.raises(ValueError, match=r"the ranks disagree on the run's settings: rank 0 has .*rank 1 has"):
        launch.execute(cmd, tmp_path, timeout=30)


def test_the_launch_knows_its_programs_and_its_arguments():
    with pytest.raises(ValueError, match="program must be one of"):
        launch.mpiexec(2, "pipeline")
    with pytest.raises(ValueError, match="P must be at least 1"):
        launch.mpiexec(0, "ring")
    with pytest.raises(ValueError, match="--layout must be one of"):
        launch.mpiexec(2, "ring", "--layout", "spiral", timeout=30)


def test_what_the_mpi_needs_is_set_in_one_place():
    env = launch.environment(7)
    assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1" and env["MPIEXEC_TIMEOUT"] == "7"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(launch.Path(launch.__file__).resolve().parents[2])
    cmd = launch.command(3, ["python", "x.py"], 7, hosts=["node1", "node2"])
    assert cmd[1:] == ["-hosts", "node1,node2", "-n", "3", "python", "x.py"]  # MPICH's hydra


def test_hosts_run_the_same_program(tmp_path):
    """-hosts names the machines; here the one we have. Across machines each needs the same environment."""
    run = launch.launch(2, [script(tmp_path)], timeout=30, hosts=["localhost"])
    assert run.result["total"] == [1.0] * 4
