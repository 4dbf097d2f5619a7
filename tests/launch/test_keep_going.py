"""tbrun --keep-going, the job's one failure authority: a rank that dies does not end the job,
tbrun declares it failed in the store (tbcoll.job.failures) and the survivors read it; a rank
reported frozen is checked, killed for good if it is frozen and left alone if it is not; the
job's status says a rank died. The verdict's rules alone: tests/launch/test_verdict.py."""

import re
import shutil
import sys

import pytest

from ..conftest import MACOS_LANE, REPO, pid_alive, skip_or_fail, tagged_lines, tbrun, wait_for
from .conftest import assert_no_rank_left, finish, tbrun_on

# np 4: rank 3 kills itself (what it started goes with it); rank 1 stops itself; rank 0
# reports ranks 1 and 2 as frozen once rank 3's death was declared (epoch 1) and rank 1 is
# stopped; rank 2 is alive, waiting in the store. Ranks 0 and 2 print what they read from the
# store and end well.
JOB = """
import os, signal, subprocess, time
import tbcoll
from tbcoll.job.env import keep_going, launch_info
from tbcoll.job.failures import FAILED, FAILED_AT, SUSPECT, format_ranks, parse_failed
from tbcoll.job.rendezvous import Store, tell_tbrun

comm = tbcoll.init()
store = Store.from_launch(launch_info())
store.set(f"test/pid/{comm.rank}", str(os.getpid()))
comm.barrier()
def state(pid):  # ps's: T stopped, Z ended, "" gone (no /proc on a Mac)
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                          text=True).stdout.strip()

if comm.rank == 3:  # what it started, in its process group, goes with it
    store.set("test/child", str(subprocess.Popen(["sleep", "60"]).pid))
    os.kill(os.getpid(), signal.SIGKILL)
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
if comm.rank == 0:
    store.wait([FAILED_AT.format(1)], 30)
    child, until = int(store.get("test/child")), time.monotonic() + 10
    while state(child)[:1] not in ("", "Z") and time.monotonic() < until:
        time.sleep(0.02)
    print("child", state(child)[:1] or "gone")
    pid = int(store.get("test/pid/1"))
    while not state(pid).startswith("T"):
        time.sleep(0.02)
    tell_tbrun(SUSPECT, format_ranks([1, 2]), store=store)
store.wait([FAILED_AT.format(2)], 30)
first, latest = parse_failed(store.get(FAILED_AT.format(1))), parse_failed(store.get(FAILED))
print("keep_going", keep_going(), "first", first[0], sorted(first[1]),
      "latest", latest[0], sorted(latest[1]),
      "pids", *(int(store.get(f"test/pid/{r}")) for r in range(4)))
"""

SSH = str(REPO / "tests" / "harness" / "ssh_here")


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_deaths_and_a_frozen_rank_are_declared_and_the_others_go_on(script, where):
    """Local ranks (shm), and ranks through the ssh starter (tcp over loopback "hosts", each
    rank wrapped by tbcoll.launch.remote): a frozen wrapped rank is killed through its
    wrapper."""
    if shutil.which("ps") is None:  # (the job looks at its stopped rank through ps)
        skip_or_fail("ps is not installed (Debian: procps; `make test` installs it as root)")
    if where == "ssh" and MACOS_LANE:
        pytest.skip("ssh_here runs the wrapper in ssh's process group, so tbrun's SIGKILL of "
                    "ssh ends it before it kills its rank, and the lane has no "
                    "PR_SET_PDEATHSIG (a real ssh's remote wrapper sees its stdin end)")
    hosts = ["--ssh", SSH, "-H", "me@127.0.0.2:2,me@127.0.0.3:2"] if where == "ssh" else []
    p = tbrun("--keep-going", "-np", 4, *hosts, "--timeout", 90, script(JOB), timeout=120)
    check_job(p.returncode, p.stdout, p.stderr,
              r" on me@127\.0\.0\.\d" if where == "ssh" else "")


def test_a_frozen_rank_on_another_host_is_killed_through_real_ssh(cluster, script):
    """The namespace cluster's hosts, each with an sshd: rank 1 on host 1 stops; tbrun kills
    its ssh and closes its input, and the wrapper on host 1 kills the stopped rank (no
    PR_SET_PDEATHSIG does it there: the wrapper lives on until it has)."""
    hosts = f"{cluster.address(0)}:2,{cluster.address(1)}:1,{cluster.address(2)}:1"
    code, out, err = finish(tbrun_on(cluster, "--keep-going", "-H", hosts, "--map-by", "node",
                                     "--timeout", 90, script(JOB)), timeout=120)
    check_job(code, out, err, r"( on 10\.201\.0\.\d+)?")
    assert_no_rank_left(cluster)


def check_job(code: int, out: str, err: str, on: str) -> None:
    """What JOB's ranks printed and tbrun said; on: how tbrun names a rank's host."""
    assert code == 137, out + err
    said = tagged_lines(out)
    assert sorted(said) == [0, 2], out + err
    assert said[0][0] in ("child gone", "child Z"), out
    for rank in (0, 2):
        words = said[rank][-1].split()
        assert words[:9] == ["keep_going", "True", "first", "1", "[3]", "latest", "2", "[1,",
                             "3]"], out
        pids = [int(w) for w in words[10:]]
    died = r"(was killed by signal 9 \(SIGKILL\)|exited with status 137)"
    assert re.search(rf"tbrun: rank 3{on} \(pid \d+\) {died}; the job goes on without it "
                     r"\(--keep-going\): 3 ranks left", err), err
    assert re.search(rf"tbrun: rank 1{on} is frozen \(it answered nothing in 1 s\); killing "
                     r"it for good \(SIGKILL\)", err), err
    assert re.search(rf"tbrun: rank 1{on} \(pid \d+\) {died}; the job goes on without it "
                     r"\(--keep-going\): 2 ranks left", err), err
    assert re.search(rf"tbrun: rank 2{on} was reported as frozen, but it answered tbrun: the "
                     "report is not upheld; it goes on", err), err
    assert re.search(rf"tbrun: 2 ranks failed \(rank 3{on}, rank 1{on}\); 2 ranks went on to "
                     "the end; the job's status is 137, the first failure's", err), err
    wait_for(lambda: not any(map(pid_alive, pids)), 10, "every rank to be gone")


@pytest.mark.parametrize("backend, why", [
    ("mpi", "the PyPI MPICH has no ULFM"),
    ("mlx", "MLX cannot abort a collective"),
])
def test_keep_going_is_refused_where_it_cannot_hold(backend, why):
    p = tbrun("--keep-going", "--backend", backend, "-np", 2, sys.executable, "-c", "pass")
    assert p.returncode == 2 and not p.stdout, p.stderr
    assert p.stderr.startswith(f"tbrun: error: --keep-going with --backend {backend}: "), p.stderr
    assert why in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_keep_going_is_the_ranks_contract_and_an_environment_default(tmp_path):
    """--dry-run shows TBCOLL_KEEP_GOING=1 for every rank, with the flag or TBRUN_KEEP_GOING."""
    import os

    env = {**os.environ, "TBRUN_KEEP_GOING": "1"}
    for args, environ in (((), env), (("--keep-going",), None)):
        p = tbrun(*args, "--dry-run", "-np", 2, sys.executable, "-c", "pass", env=environ)
        assert p.returncode == 0 and p.stdout.count("TBCOLL_KEEP_GOING=1") == 2, p.stdout
    p = tbrun("--dry-run", "-np", 2, sys.executable, "-c", "pass")
    assert "TBCOLL_KEEP_GOING" not in p.stdout


def test_srun_steps_do_not_kill_the_job_under_keep_going(monkeypatch):
    from tbcoll.launch.starters import srun

    monkeypatch.setattr(srun.shutil, "which", lambda name: f"/slurm/bin/{name}")
    assert "--no-kill" in srun.srun_command("n1", "python3", keep_going=True)
    assert "--no-kill" not in srun.srun_command("n1", "python3")



def test_the_check_of_suspects_in_the_store(monkeypatch):
    """Without processes: a report wakes the loop's pipe; a listening peer that answers is
    alive, one that does not is frozen, and a peer that never listened cannot be told."""
    import os

    from tbcoll.launch import authority
    from tbcoll.launch.postmortem import Postmortem

    from tbcoll.job.failures import FAILED, FAILED_AT, SUSPECT, parse_failed
    from tbcoll.job.rendezvous import Store, StoreServer
    from tbcoll.observability.dump_keys import ANSWER_KEY, LISTENING_KEY

    monkeypatch.setattr(authority, "PROBE_WAIT", 0.2)
    with StoreServer("secret") as server, Store(*server.address, "secret") as client:
        judge = authority.Authority(server, Postmortem(server, 4, print))
        wake_r, wake_w = os.pipe()
        judge.wake_with(wake_w)
        client.set(SUSPECT.format(0), "3,1,2,x")
        assert os.read(wake_r, 1) == b"\0" and judge.reports() == [(0, (1, 2, 3), "")]
        assert server.get(SUSPECT.format(0)) == b"3,1,2,x" and judge.reports() == []
        for rank in (1, 2):
            server.set(LISTENING_KEY.format(rank), "1")
        judge.probe((1, 2, 3), "rank 0 reported 1, 2, 3")
        server.set(ANSWER_KEY.format(1, 1), "1")
        assert judge.due(0.0) == []  # rank 2 may still answer
        found = {peer: (frozen, why) for peer, frozen, why in judge.due(judge.deadline)}
        assert found[1] == (False, "it answered tbrun")
        assert found[2] == (True, "it answered nothing in 0.2 s")
        assert found[3][0] is False and "cannot tell" in found[3][1]
        judge.declare(2, (1, 3))
        assert parse_failed(client.get(FAILED)) == parse_failed(client.get(FAILED_AT.format(2)))
        assert parse_failed(client.get(FAILED)) == (2, {1, 3})
        judge.wake_with(None)
        os.close(wake_r)
        os.close(wake_w)
