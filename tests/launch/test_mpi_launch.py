"""tbrun --backend mpi hands the job to mpiexec: an unmodified mpi4py program runs, its output
is tagged per line, and failures, timeouts and exports behave as in any tbrun job."""

import json
import os
import time

import pytest

from tbcoll.core.errors import TbcollError
from tbcoll.job.topology import JobHost, Layout

from ..conftest import (
    hydra_topology_files,
    left_behind,
    mpich_segments,
    pid_alive,
    tagged_lines,
    tbrun,
)

pytest.importorskip("mpi4py")

MPI4PY_SCRIPT = """
import json, os
from pathlib import Path
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
total = np.empty(3)
comm.Allreduce(np.full(3, comm.rank + 1.0), total)
root_value = comm.bcast({"from": "root"} if comm.rank == 0 else None, root=0)
right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
got = comm.sendrecv(comm.rank * 100, dest=right, source=left)
# a -x value given with no value (tbrun's own) must be on no process's command line
seen = [p for p in Path("/proc").glob("[0-9]*/cmdline")
        if b"hunter2" in p.read_bytes()] if Path("/proc").is_dir() else []
print(json.dumps({"rank": comm.rank, "size": comm.size, "total": total.tolist(),
                  "bcast": root_value, "from_left": got, "pid": os.getpid(),
                  "colour": os.environ.get("COLOUR"), "secret": os.environ.get("SECRET"),
                  "secret_on_command_lines": len(seen)}))
print("no newline at the end", end="")
"""


def test_an_unmodified_mpi4py_program_runs_under_tbrun(script):
    """Its output tagged per line, -x exports delivered; -x values (tokens, keys) reach the
    ranks through mpiexec's environment, not -genv: every local user can read a command
    line."""
    p = tbrun("--backend", "mpi", "-np", 3, "-x", "COLOUR=teal", "-x", "SECRET",
              script(MPI4PY_SCRIPT), timeout=120,
              env={**os.environ, "SECRET": "hunter2"})  # -x NAME: tbrun's own value
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert sorted(lines) == [0, 1, 2]
    for rank, (first, last) in lines.items():
        result = json.loads(first)
        assert result["size"] == 3 and result["rank"] == rank
        assert result["total"] == [6.0, 6.0, 6.0]
        assert result["bcast"] == {"from": "root"}
        assert result["from_left"] == 100 * ((rank - 1) % 3)
        assert result["colour"] == "teal"
        assert result["secret"] == "hunter2" and result["secret_on_command_lines"] == 0
        assert last == "no newline at the end"  # whole lines, each tagged once


def test_a_failing_mpi_rank_fails_the_job(script):
    before, topologies = mpich_segments(), hydra_topology_files()
    start = time.monotonic()
    p = tbrun("--backend", "mpi", "-np", 3, script(
        "import os, sys, time\nfrom mpi4py import MPI\n"
        "print(os.getpid(), flush=True)\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "if MPI.COMM_WORLD.rank == 1: sys.exit(9)\n"
        "time.sleep(60)\n"), timeout=60)
    assert p.returncode == 9, p.stdout + p.stderr
    assert time.monotonic() - start < 30
    assert "mpiexec" in p.stderr and "exited with status 9" in p.stderr
    pids = [int(lines[0]) for lines in tagged_lines(p.stdout).values()]
    assert len(pids) == 3 and not any(pid_alive(pid) for pid in pids)
    assert not left_behind(mpich_segments() - before)  # what the aborted ranks left, tbrun removed
    assert not left_behind(hydra_topology_files() - topologies)


def test_timeout_stops_an_mpi_job(script):
    before = mpich_segments()
    p = tbrun("--backend", "mpi", "-np", 2, "--timeout", 2, "--grace", 1, script(
        "import os, time\nfrom mpi4py import MPI\nprint(os.getpid(), flush=True)\n"
        "time.sleep(60)\n"), timeout=60)
    assert p.returncode == 124, p.stdout + p.stderr
    pids = [int(lines[0]) for lines in tagged_lines(p.stdout).values()]
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)
    assert not left_behind(mpich_segments() - before)


def test_dry_run_shows_the_mpiexec_command():
    p = tbrun("--backend", "mpi", "-np", 4, "-H", "a:2,b:2", "--map-by", "node", "--dry-run",
              "true", timeout=30)
    assert p.returncode == 0, p.stderr
    assert "mpiexec -n 4" in p.stdout
    assert "-hosts a,b -rankmap 0,1,0,1" in p.stdout


@pytest.mark.parametrize("stall", ["time.sleep(60)", "os.kill(os.getpid(), signal.SIGSTOP)"])
def test_comm_timeout_bounds_mpi_collectives(script, stall):
    """A late or frozen peer: MPI's own collective would wait forever; tbcoll's gives up
    after --comm-timeout with a CommError, and the job ends."""
    before = mpich_segments()
    start = time.monotonic()
    p = tbrun("--backend", "mpi", "-np", 2, "--comm-timeout", 2, script(f"""
        import os, signal, time
        import numpy as np
        import tbcoll
        comm = tbcoll.init()
        comm.barrier()
        if comm.rank == 1:
            {stall}
        comm.all_reduce(np.ones(4))
    """), timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert time.monotonic() - start < 20
    assert ("all_reduce on rank 0: timed out after 2 s (TBCOLL_TIMEOUT) waiting for "
            "MPI_Allgather") in p.stderr  # a small all_reduce: one MPI_Allgather
    assert "tbrun: rank 0 exited with status 1" in p.stderr
    assert not left_behind(mpich_segments() - before)


def test_a_cut_short_abort_is_still_pinned_on_the_rank_that_raised(capfd):
    """Hydra's teardown may cut the aborting rank's "MPI_Abort" line and its own exit codes:
    the rank whose Python traceback came through is then named (seen once in CI)."""
    from tbcoll.launch.output import OutputRouter
    from tbcoll.launch.starters.mpiexec import MPIEXEC, explain_failure

    output = OutputRouter(3, True, None)
    output.write(2, "err", b"Traceback (most recent call last):\n  ...\nValueError: boom\n")
    output.write(MPIEXEC, "err", b"some words of mpiexec's\n")
    assert explain_failure(1, 3, [0, 0, 0], output) == 1
    output.close()
    assert "tbrun: rank 2 exited with status 1 (its Python exception, above)" in \
        capfd.readouterr().err


def test_a_ranks_own_report_names_it_when_mpich_said_nothing(tmp_path, monkeypatch, capfd):
    """sys.exit(3) leaves no traceback: the report the rank wrote before aborting names it
    (Hydra's teardown cut everything else twice in CI)."""
    from tbcoll.launch import mpirank
    from tbcoll.launch.output import OutputRouter
    from tbcoll.launch.starters.mpiexec import explain_failure, reported

    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    monkeypatch.setenv(mpirank.REPORTS, str(job_dir))
    mpirank.report_failure("2", 3)
    output = OutputRouter(3, True, None)
    assert explain_failure(3, 3, [0, 0, 0], output, reported(job_dir)) == 3
    output.close()
    assert "tbrun: rank 2 exited with status 3;" in capfd.readouterr().err

    job_dir.chmod(0o755)  # a directory others could write to is not written in
    mpirank.report_failure("1", 4)
    assert reported(job_dir) == [(2, 3)]


CONTRACT = ("TBCOLL_RANK", "TBCOLL_SIZE", "TBCOLL_LOCAL_RANK", "TBCOLL_LOCAL_SIZE",
            "TBCOLL_NODE_RANK", "TBCOLL_BACKEND", "TBCOLL_STORE", "TBCOLL_TOKEN",
            "TBCOLL_HOSTFILE", "TBCOLL_TIMEOUT", "TBCOLL_JOB", "RANK", "WORLD_SIZE",
            "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("program", ["python", "sh"])
def test_mpi_ranks_get_the_whole_launch_contract(script, program):
    """mpiexec gives every rank the same environment: tbcoll.launch.mpirank makes it each rank's
    own contract, for a Python rank and for any other program alike."""
    if program == "python":
        argv = [script("import os\nfor item in os.environ.items(): print('='.join(item))")]
    else:
        argv = ["sh", "-c", "env"]
    p = tbrun("--backend", "mpi", "-np", 2, "--comm-timeout", 42, *argv, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert sorted(lines) == [0, 1]
    seen = {rank: dict(line.split("=", 1) for line in rank_lines if "=" in line)
            for rank, rank_lines in lines.items()}
    for rank, env in seen.items():
        assert [name for name in CONTRACT if name not in env] == []
        assert env["TBCOLL_RANK"] == env["RANK"] == str(rank)
        assert env["TBCOLL_LOCAL_RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["TBCOLL_SIZE"] == env["WORLD_SIZE"] == "2"
        assert env["TBCOLL_LOCAL_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["TBCOLL_NODE_RANK"] == "0" and env["TBCOLL_BACKEND"] == "mpi"
        assert env["TBCOLL_TIMEOUT"] == "42" and env["MASTER_ADDR"] == "127.0.0.1"
        host, port = env["TBCOLL_STORE"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0 and int(env["MASTER_PORT"]) > 0
        assert json.loads(env["TBCOLL_HOSTFILE"]) == {
            "hosts": [{"name": "localhost", "ranks": [0, 1]}]}
        assert len(env["TBCOLL_TOKEN"]) == 64 and len(env["TBCOLL_JOB"]) == 16
        assert "TBCOLL_MPI_LAUNCH" not in env  # tbrun's note to the wrapper, token included
    for shared in ("TBCOLL_TOKEN", "TBCOLL_JOB", "TBCOLL_STORE", "MASTER_PORT"):
        assert seen[0][shared] == seen[1][shared]


def test_mpi_ranks_reach_the_store(script):
    """TBCOLL_STORE is tbrun's store under --backend mpi too: tcp's rendezvous goes through it,
    and tbcoll.init() still picks MPI."""
    p = tbrun("--backend", "mpi", "-np", 2, script("""
        import numpy as np
        import tbcoll
        with tbcoll.init() as comm, tbcoll.init(backend="tcp") as tcp:
            total = tcp.all_reduce(np.array([tcp.rank + 1.0]))
            print(comm.backend, tcp.backend, comm.rank == tcp.rank, total[0])
    """), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert tagged_lines(p.stdout) == {0: ["mpi tcp True 3.0"], 1: ["mpi tcp True 3.0"]}


def test_the_rank_wrapper_places_ranks_by_the_topology():
    """Node and local rank, and the store as the rank's host reaches it, follow from the
    hosts' ranks (here --map-by node over two hosts), with MPI's rank and size."""
    from tbcoll.launch.mpirank import LAUNCH, MpiJob, rank_environment

    topology = Layout((JobHost("a", (0, 2), "10.0.0.1"), JobHost("b", (1, 3), "10.0.0.2")))
    job = MpiJob(size=4, backend="mpi", stores=("127.0.0.1:7000", "10.0.0.1:7000"), token="t",
                 topology=topology, timeout=9.0, job="j", master=("10.0.0.1", 7001),
                 master_overrides={"MASTER_PORT": "29500"})
    env = rank_environment({"PMI_RANK": "3", "PMI_SIZE": "4", LAUNCH: job.encode()})
    assert (env["TBCOLL_RANK"], env["TBCOLL_NODE_RANK"], env["TBCOLL_LOCAL_RANK"],
            env["TBCOLL_LOCAL_SIZE"], env["TBCOLL_STORE"]) == ("3", "1", "1", "2", "10.0.0.1:7000")
    assert (env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "10.0.0.1", "29500")
    with pytest.raises(TbcollError, match="MPI says this is rank 3 of 2, but tbrun started 4"):
        rank_environment({"PMI_RANK": "3", "PMI_SIZE": "2", LAUNCH: job.encode()})
    assert rank_environment({"PMI_RANK": "1", "PMI_SIZE": "4"}) == {  # a plain mpiexec
        "RANK": "1", "WORLD_SIZE": "4"}


EARLY_EXIT = """
import os
import numpy as np
import tbcoll

comm = tbcoll.init()
comm.all_reduce(np.ones(4))
if comm.rank == 1:
    os._exit(0)  # no MPI_Finalize, while the others are in the next all_reduce
comm.all_reduce(np.ones(4))
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_a_rank_that_leaves_early_with_os_exit_fails_the_job_and_is_named(script, np_):
    before = mpich_segments()
    p = tbrun("--backend", "mpi", "-np", np_, script(EARLY_EXIT), timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    killed = "rank 0" if np_ == 2 else "ranks 0, 2"
    assert (f"rank 1 exited with status 0 (os._exit) without MPI_Finalize while the others "
            f"ran on; mpiexec then killed {killed}") in p.stderr
    assert not left_behind(mpich_segments() - before)


def test_a_rank_that_left_is_blamed_only_where_others_were_killed(tmp_path):
    from tbcoll.launch.starters.mpiexec import killed, left_early

    (tmp_path / "left-1").write_text("0\n")
    (tmp_path / "ended-0").write_text("0\n")
    assert left_early(tmp_path, [0, 1]) == []  # every rank ended by itself
    assert left_early(tmp_path, [0, 1, 2]) == [1] and killed(tmp_path, [0, 1, 2]) == [2]
