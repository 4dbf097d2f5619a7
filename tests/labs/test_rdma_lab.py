"""The RDMA lab runs real commands on a real kernel RDMA device: each test asserts on what came
back from the VM, so none passes without it (where the lab cannot run, they skip, or fail
under TBCOLL_REQUIRE_LABS=1)."""

from __future__ import annotations

import ipaddress
import re
import threading
import time

import pytest

from ..conftest import skip_or_fail
from ..harness import rdmalab

PORT = 18561  # perftest's own default (18515) is left to whoever runs it by hand


def test_rxe0_is_listed_active_with_its_ipv4_mapped_gid(rdma_lab):
    p = rdma_lab.run(["ibv_devices"], timeout=60)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^\s*rxe0\s", p.stdout, re.M), p.stdout
    assert rdma_lab.device == "rxe0"
    p = rdma_lab.run(["sh", "-c", "cat /sys/class/infiniband/rxe0/ports/1/state "
                                  "/sys/class/infiniband/rxe0/ports/1/gids/1"], timeout=60)
    state, gid = p.stdout.split("\n")[:2]
    assert "ACTIVE" in state
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    assert str(mapped) == rdma_lab.address


def perftest_average(output: str, size: int) -> float:
    """t_avg (us) from ib_write_lat's result line for `size` bytes."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0] == str(size) and fields[1].isdigit():
            return float(fields[5])
    raise AssertionError(f"no result line for {size} B in:\n{output}")


def test_ib_write_lat_between_two_processes_on_rxe0(rdma_lab):
    """A server and a client, each its own lab.run (so two at once), connect RC queue pairs
    on rxe0 through its IPv4-mapped GID (index 1) and time 8-byte RDMA writes."""
    common = ["ib_write_lat", "-d", rdma_lab.device, "-x", "1", "-s", "8", "-n", "300",
              "-p", str(PORT)]
    server: dict = {}
    thread = threading.Thread(target=lambda: server.update(p=rdma_lab.run(common, timeout=120)))
    thread.start()
    # the client may start before the server listens: it retries until it connects
    client = rdma_lab.run(["sh", "-c", 'for i in $(seq 60); do "$@" && exit 0; sleep 0.5; done;'
                           " exit 1", "client", *common, rdma_lab.address], timeout=120)
    thread.join(timeout=150)
    assert client.returncode == 0, client.stdout + client.stderr
    assert server["p"].returncode == 0, server["p"].stdout + server["p"].stderr
    latency = perftest_average(client.stdout, 8)
    # perftest times with the CPU's cycle counter, which emulation under load can leave
    # uncalibrated: it then prints inf for a transfer that completed (both ends exited 0)
    assert latency > 0 and (latency < 10_000 or latency == float("inf")), client.stdout


def test_a_command_past_its_timeout_is_killed_with_its_children(rdma_lab):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="ran past its 3 s"):
        rdma_lab.run(["sh", "-c", "sleep 301 & echo begun; sleep 302"], timeout=3)
    assert time.monotonic() - started < 30
    p = rdma_lab.run(["sh", "-c", "ps -eo args | grep '^sleep 30[12]' || true"], timeout=60)
    assert p.stdout == "", f"still running in the lab: {p.stdout}"


def test_status_output_env_and_cwd_come_back(rdma_lab):
    p = rdma_lab.run(["sh", "-c", 'echo "out $LAB_PROBE"; pwd; echo err >&2; exit 7'],
                     timeout=60, env={"LAB_PROBE": "x1"}, cwd="/sys")
    assert (p.returncode, p.stdout, p.stderr) == (7, "out x1\n/sys\n", "err\n")
    with pytest.raises(OSError, match="no-such-command"):
        rdma_lab.run(["no-such-command"], timeout=60)


def test_why_not_available_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(rdmalab.os, "geteuid", lambda: 1000)
    assert "needs root" in rdmalab.why_not_available()
    monkeypatch.setattr(rdmalab.os, "geteuid", lambda: 0)
    monkeypatch.setattr(rdmalab.shutil, "which", lambda tool: None)
    assert "apt-get install" in rdmalab.why_not_available()


def test_an_unavailable_lab_fails_where_labs_are_required(monkeypatch):
    monkeypatch.setenv("TBCOLL_REQUIRE_LABS", "1")
    with pytest.raises(pytest.fail.Exception, match="must have it"):
        skip_or_fail("no lab here")
    monkeypatch.delenv("TBCOLL_REQUIRE_LABS")
    with pytest.raises(pytest.skip.Exception, match="no lab here"):
        skip_or_fail("no lab here")


# A loop of collectives over rdma. After step 10 rank 0 touches the file the lab
# waits for, which takes rxe0's netdev down under the running mesh (every pair is on rxe0), and
# waits until rxe0's port is down: the other ranks are then inside step 11's calls. Each result
# is checked; at the end each rank prints how it reaches the others.
PULLED_JOB = """
import os, time
import numpy as np
import tbcoll

comm = tbcoll.init()
r, n = comm.rank, comm.size
for i in range(30):
    small = comm.all_reduce(np.full(1000, r + i, np.float32), op="sum")  # the C mesh's lane
    assert small[0] == sum(range(n)) + n * i, (i, small[0])
    large = comm.all_reduce(np.full(40000, r * i, np.int64), op="sum")  # the mesh, in pieces
    assert (large == i * sum(range(n))).all(), i
    gathered = comm.all_gather(np.full(3, r + i, np.int32))
    assert gathered.reshape(-1).tolist() == [k + i for k in range(n) for _ in range(3)], i
    send = comm.isend(np.full(20000, r + i, np.int64), (r + 1) % n)  # the stream
    got = comm.recv(np.empty(20000, np.int64), (r - 1) % n)
    send.wait()
    assert (got == (r - 1) % n + i).all(), i
    if i == 10 and r == 0:
        open(os.environ["PULL_FILE"], "w").close()
        end = time.monotonic() + 60
        while "DOWN" not in open("/sys/class/infiniband/rxe0/ports/1/state").read():
            assert time.monotonic() < end, "rxe0 did not go down"
            time.sleep(0.02)
comm.barrier()
print(f"rank {r} ok", flush=True)
print(comm.describe(), flush=True)
"""


def test_a_pair_moves_to_tcp_when_rxe0s_netdev_goes_down(rdma_lab, tmp_path):
    """TBCOLL_FAILOVER=1, 2 ranks: rxelab0 (rxe0's netdev) taken down after step 10 of 30. The
    ranks find the port down or a failed completion, move their pair to tcp (tbrun's line),
    replay what the peer lacked, and finish every collective and message right (3 ranks, every
    pair moving, passed by hand: docs/failover.md)."""
    from ..transports.test_rdma import lab_tbrun
    script = tmp_path / "pulled.py"
    script.write_text(PULLED_JOB)
    script.chmod(0o644)
    pull = f"/tmp/tbcoll-pull-{time.monotonic_ns()}"
    down = ["sh", "-c", f'until [ -e {pull} ]; do sleep 0.05; done; ip link set rxelab0 down']
    downed: dict = {}
    thread = threading.Thread(target=lambda: downed.update(p=rdma_lab.run(down, timeout=200)))
    thread.start()
    try:
        p = lab_tbrun(rdma_lab, script, np=2, timeout=200,
                      env={"TBCOLL_FAILOVER": "1", "PULL_FILE": pull})
    finally:
        if thread.is_alive():
            rdma_lab.run(["touch", pull], timeout=60)
        thread.join(timeout=60)
        restore_rxe0(rdma_lab)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert downed["p"].returncode == 0, downed["p"].stderr
    assert all(f"rank {r} ok" in p.stdout for r in range(2)), out[-4000:]
    # tbrun's one line for the pair (both ends' events): RDMA left for tcp, and why
    moves = re.findall(r"rank 0 <-> rank 1: RDMA rxe0 \(UC\) lost after [\d.]+ s of the job; "
                       r"now over tcp .*, [\d.]+ s \((.*); \d+ bytes sent again\)", out)
    assert len(moves) == 1, out
    # why, as the end that found it first saw it: its device (a failed completion, the port
    # down) or its peer's ask
    assert "RDMA" in moves[0] or "found the" in moves[0], moves
    assert len(re.findall(r"to rank \d: tcp .* \(moved off RDMA", p.stdout)) == 2, p.stdout


def restore_rxe0(lab) -> None:
    """Bring rxelab0 up again and wait until rxe0's port is active (the tests after need it)."""
    p = lab.run(["sh", "-c", "ip link set rxelab0 up; for i in $(seq 200); do grep -q ACTIVE "
                 "/sys/class/infiniband/rxe0/ports/1/state && exit 0; sleep 0.05; done; "
                 "exit 1"], timeout=60)
    assert p.returncode == 0, "rxe0 did not come back"
