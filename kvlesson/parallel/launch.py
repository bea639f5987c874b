"""P processes, one program: start the ranks of a kvlesson.parallel program, and what each rank runs around it.

From a notebook cell or a test (the calling side):

    run = launch.mpiexec(3, "tensor", "--new-tokens", "64")   # mpiexec -n 3 python -m kvlesson.parallel.tensor ...
    run.result     # the dict rank 0 handed back
    run.output     # what the ranks printed
    run.seconds    # the whole launch, start-up included

In each rank (the program's own `if __name__ == "__main__"`):

    launch.main(program, parser)    # parse the arguments, run program(comm, args) on every rank, hand rank 0's
                                    # result back; an exception on any rank is printed, then that rank calls
                                    # MPI_Abort, which ends every rank: none is left waiting for a message

What an MPI needs on a laptop, or as root in CI, is set here and nowhere else (`environment`, `command`):
  - MPICH (the wheel kvlesson pins on Linux and macOS) runs more ranks than cores and runs as root as it is. Its
    ranks wait for each other by spinning on a core; MPIR_CVAR_ENABLE_HEAVY_YIELD=1 makes a waiting rank sleep
    instead, which measured 5-10x faster than spinning with 9 ranks on 2 cores. MPIEXEC_TIMEOUT bounds the job.
  - Open MPI refuses both without --oversubscribe and OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,
    and takes its bound as --timeout.
The same programs run across machines unchanged: `hosts=["node1", "node2"]` adds MPICH's -hosts (Open MPI's
--host); each host needs the same Python environment and its own copy of the model cache.
"""
import contextlib
import functools
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kvlesson import validate
from kvlesson.weights import f32cache, fetch

PROGRAMS = ("tensor", "ring", "disagg")  # the modules of kvlesson.parallel that run as ranks
TIMEOUT = 120  # seconds a launch may take before the MPI and then this module end it; every lesson run takes a few
ERROR_MARK = "kvlesson.parallel:"  # starts the line a failing rank prints on stderr before it aborts
RESULT = "result.pkl"  # what rank 0 writes into the launch's folder
ERRORS = "error-{rank}.txt"  # what a failing rank writes there too: stderr can be lost when the job is aborted


class RankError(RuntimeError):
    """A launch that did not finish: a rank raised, died, or ran out of time. The message says which and why."""


@dataclass(frozen=True)
class Run:
    result: dict  # what rank 0's program returned
    output: str  # what the ranks printed on stdout
    seconds: float  # wall time of the whole launch: start-up, loading, work


# ------------------------------------------------------------------------------------------------ the calling side


def mpiexec(P, program, *args, timeout=TIMEOUT, hosts=None):
    """Run `mpiexec -n P python -m kvlesson.parallel.<program> *args` -> Run, or raise what went wrong.

    A rank that raised ValueError or TypeError re-raises it here, with the rank's message (bad input stays bad
    input across processes); a rank that died, or a launch that ran out of time, raises RankError.
    """
    if program not in PROGRAMS:
        raise ValueError(f"program must be one of {PROGRAMS}; got {program!r}")
    return launch(P, ["-m", f"kvlesson.parallel.{program}", *map(str, args)], timeout=timeout, hosts=hosts)


def launch(P, python_args, *, timeout=TIMEOUT, hosts=None):
    """mpiexec -n P <this python> *python_args --out <folder> -> Run. The tests launch their own scripts this way."""
    P = validate.integer("P", P, minimum=1)
    timeout = validate.positive("timeout", timeout)
    with tempfile.TemporaryDirectory(prefix="kvlesson-mpi-") as folder:
        argv = [sys.executable, *map(str, python_args), "--out", folder]
        return execute(command(P, argv, timeout, hosts), folder, timeout)


def execute(cmd, folder, timeout=TIMEOUT):
    """Run an mpiexec command line whose rank 0 writes its result into `folder` -> Run, or raise what went wrong."""
    start = time.perf_counter()
    code, out, err = _bounded(cmd, environment(timeout), timeout + 15)  # the MPI's own bound fires first
    seconds = time.perf_counter() - start
    result = Path(folder) / RESULT
    if code == 0 and result.exists():
        return Run(pickle.loads(result.read_bytes()), out, seconds)
    written = sorted(Path(folder).glob(ERRORS.format(rank="*")))  # an abort can cut a rank's stderr short
    raise failure(code, out, "".join(p.read_text(encoding="utf-8") for p in written) + err, timeout)


@functools.cache
def find_mpiexec():
    """The mpiexec of the MPI installed beside this Python (the wheel's), else the first on PATH."""
    here = Path(sys.executable).parent
    for candidate in (here / "mpiexec", Path(sys.prefix) / "Library" / "bin" / "mpiexec.exe"):  # Intel MPI, Windows
        if candidate.exists():
            return str(candidate)
    found = shutil.which("mpiexec")
    if found is None:
        raise RankError('no mpiexec found beside this Python or on PATH: pip install "kvlesson[lessons]" brings one')
    return found


@functools.cache
def is_open_mpi(mpiexec_path):
    """Open MPI's launcher names itself in --version; MPICH's and Intel MPI's say HYDRA."""
    done = subprocess.run([mpiexec_path, "--version"], capture_output=True, text=True, timeout=30)
    return "open mpi" in (done.stdout + done.stderr).lower()


def command(P, argv, timeout, hosts=None):
    """The mpiexec command line for P ranks of argv, with the flags this MPI needs (module docstring)."""
    exe = find_mpiexec()
    if is_open_mpi(exe):
        flags = ["--oversubscribe", "--timeout", str(int(timeout))] + (["--host", ",".join(hosts)] if hosts else [])
    else:
        flags = ["-hosts", ",".join(hosts)] if hosts else []
    return [exe, *flags, "-n", str(P), *argv]


def environment(timeout):
    """This process's environment, plus what the MPI needs and the folder this kvlesson lives in, so that every rank
    imports the same package as the caller."""
    env = dict(os.environ)
    env.update(MPIR_CVAR_ENABLE_HEAVY_YIELD="1", MPIEXEC_TIMEOUT=str(int(timeout)),  # MPICH
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",  # Open MPI, as root
               # one BLAS thread a rank: the ranks are the parallelism, and BLAS threads that spin beside them would
               # fight them for the cores
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    home = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([home, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _bounded(cmd, env, seconds):
    """Run cmd in a process group of its own -> (exit code, stdout, stderr). Past `seconds` the whole group (mpiexec,
    its proxies, every rank) is killed, so that a hung launch can never outlive its caller's bound."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def failure(code, out, err, timeout):
    """The exception a failed launch raises: a rank's own ValueError or TypeError, else RankError saying what
    happened (a rank's exception, a rank that died, the time limit)."""
    said = [line for line in err.splitlines() if line.startswith(ERROR_MARK)]
    if said:
        first = said[0][len(ERROR_MARK):].strip()  # "rank 2 of 4: ValueError: ..."
        kind = re.match(r"rank \d+ of \d+: (\w+):", first)
        error = {"ValueError": ValueError, "TypeError": TypeError}.get(kind[1] if kind else "", RankError)
        return error(first)
    if code is None or "TIMED OUT" in err or "TIMED OUT" in out:
        return RankError(f"the ranks did not finish within {timeout:g} s, so the launch was ended: a rank waits "
                         "for a message that never comes (a missing send, or ranks that called different collectives)")
    tail = " / ".join(line.strip("= ") for line in (err + out).strip().splitlines()[-6:] if line.strip("= "))
    return RankError(f"a rank ended before the program finished (mpiexec exited with code {code}); the MPI said: "
                     f"{tail or 'nothing'}")


# ------------------------------------------------------------------------------------------------ the rank side


def main(program, parser):
    """Parse this rank's arguments, run program(comm, args) -> dict on every rank, and write rank 0's dict for
    mpiexec() to read. Any exception, on any rank, is printed after ERROR_MARK and aborts the whole job."""
    from mpi4py import MPI

    parser.add_argument("--out", help="folder for rank 0's result (mpiexec() passes it)")
    world = MPI.COMM_WORLD
    try:
        args = parser.parse_args()
        result = program(Counted(world), args)
        if world.rank == 0 and args.out:
            (Path(args.out) / RESULT).write_bytes(pickle.dumps(result))
    except BaseException as e:  # SystemExit from argparse included: every rank stops, none waits
        code = e.code if isinstance(e, SystemExit) else 1
        if not isinstance(e, SystemExit) or code:
            said = f"{ERROR_MARK} rank {world.rank} of {world.size}: {type(e).__name__}: {e}\n"
            sys.stderr.write(said)
            sys.stderr.flush()
            out = _out_folder(sys.argv)
            if out is not None:  # a file is there before the abort: the job's stderr may not reach mpiexec in time
                (Path(out) / ERRORS.format(rank=world.rank)).write_text(said, encoding="utf-8")
            world.Abort(code if isinstance(code, int) else 1)
        raise


def _out_folder(argv):
    """-> the folder after --out in a rank's arguments (argparse may have failed before reading it), or None."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--out" and Path(argv[i + 1]).is_dir():
            return argv[i + 1]
    return None


class Counted:
    """An MPI communicator that counts, per call, the calls made and the bytes of the messages this rank hands in.

    The count is of messages, what the program asks for. What crosses the wire depends on the algorithm the MPI
    picks: a ring all-reduce sends 2 (P - 1) / P of its message from every rank, a tree more or less.
    """

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm, self.rank, self.size, self.SUM = comm, comm.rank, comm.size, MPI.SUM
        self.calls, self.bytes, self.seconds = Counter(), Counter(), Counter()

    @contextlib.contextmanager
    def _counted(self, call, nbytes):
        """Count one call of `nbytes` and the seconds this rank spends in it (waiting for the others included)."""
        start = time.perf_counter()
        yield
        self.calls[call] += 1
        self.bytes[call] += int(nbytes)
        self.seconds[call] += time.perf_counter() - start

    def Allreduce(self, send, recv):
        """recv = the sum of every rank's send (NCCL's all_reduce)."""
        with self._counted("Allreduce", send.nbytes):
            self.comm.Allreduce(send, recv, op=self.SUM)

    def Allgather(self, send, recv):
        """recv [P, ...] = every rank's send, in rank order, on every rank (NCCL's all_gather)."""
        with self._counted("Allgather", send.nbytes):
            self.comm.Allgather(send, recv)

    def Sendrecv(self, send, dest, recv, source):
        """Send to `dest` and receive from `source` at once (a ring step: NCCL's send and recv in one group)."""
        with self._counted("Sendrecv", send.nbytes):
            self.comm.Sendrecv(send, dest=dest, recvbuf=recv, source=source)

    def Send(self, buf, dest):
        with self._counted("Send", buf.nbytes):
            self.comm.Send(buf, dest=dest)

    def Recv(self, buf, source):
        with self._counted("Recv", 0):  # the bytes are the sender's; the wait is this rank's
            self.comm.Recv(buf, source=source)

    def Gather(self, send, recv, root=0):
        """Root's recv = every rank's send, side by side in rank order (torch.distributed's gather)."""
        with self._counted("Gather", send.nbytes):
            self.comm.Gather(send, recv, root=root)

    def allgather(self, value):
        """A small Python object from every rank -> [one per rank] (pickled: for shapes and checks, not arrays)."""
        return self.comm.allgather(value)

    def ledger(self):
        """{call: (calls, message bytes)} this rank made so far."""
        return {call: (self.calls[call], self.bytes[call]) for call in self.calls if self.bytes[call]}


def load_weights(comm):
    """-> (Config, weights) on every rank. Rank 0 finds SmolLM2's float32 copy (fetched and written once, as
    kvlesson.llama.load does) and checks its checksums; the other ranks map the same files without checking again."""
    folder = None
    if comm.rank == 0:
        gguf, digest = fetch.model_file()
        folder = f32cache.folder_for(fetch.cache_dir(), gguf, digest)
        if not folder.exists():
            from kvlesson import llama

            llama.load()  # writes the copy
    folder = comm.comm.bcast(folder, root=0)
    config, w, _, _ = f32cache.load(folder, verify=comm.rank == 0)
    return config, w


def agree(comm, what, value):
    """Check that every rank holds the same `value` (shapes, sizes, settings) before any array moves; ValueError naming
    the ranks that differ otherwise, raised on every rank alike. Ranks that disagree on a shape would otherwise post
    receives of one size against sends of another, and wait for each other for ever."""
    values = comm.allgather(value)
    if any(v != values[0] for v in values):
        differ = ", ".join(f"rank {r} has {v!r}" for r, v in enumerate(values) if v != values[0])
        raise ValueError(f"the ranks disagree on {what}: rank 0 has {values[0]!r}, {differ}")
    return value
