"""Failover with replay (docs/failover.md), a real pull: in the namespace
cluster, the cable between hosts 0 and 1 goes down (`ip link set ... down`) in the middle of
a loop of all_reduce (tcp's C lane); with failover on by default (the pair has several
paths), the pair carries on over the management network, tbrun saying so in one line, and
every result is right. Host 0's end of the cable is the one set down: its kernel counts its
failed sends as local congestion (no retransmission timeout, no keepalive end), so it learns
of the failure from rank 1, which asks through the store.

The second test: real pulls with two cables per pair of hosts (Cluster.add_second_cables),
one job of 3 ranks on 3 hosts, a loop of all_reduce of 256 KiB that the test disturbs as it
runs (no pause: data in flight), each event after the last one's effect: (1) host 0's end of
the first cable to host 1 set down: the pair goes on over the second cable (rank 1's watcher
finds it, rank 0 learns from rank 1's ask); (2) host 1's end of the second cable set down:
over the management network; (3) host 0's end of the first cable set up again: the pair
moves back to it (fail-back: rank 1's probe); (4) rank 2 stopped (SIGSTOP) for 3 s, then
continued: its pairs do not move; (5) host 1's end of the first cable set down: over the
management network again; (6) the results so far are checked, then host 1's end of the
management network set down: no path is left, and the job fails named (the rank, the link),
promptly."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

from tbcoll.core.extensions import c_extension

from .conftest import assert_no_rank_left, finish, results, tbrun_on

JOB = """
import json
import os
import time
import numpy as np
import tbcoll

with tbcoll.init() as comm:
    x = np.arange(32768, dtype=np.float64)
    wrong = 0
    for call in range(60):
        if call == 20:
            comm.barrier()
            if comm.rank == 0:
                print("pull the cable", flush=True)
                while not os.path.exists(PULLED):
                    time.sleep(0.01)
        total = comm.all_reduce(x + comm.rank)
        wrong += not np.array_equal(total, 3 * x + 3)
    paths = {line.split()[2].rstrip(":"): line.split(", over ")[1].split(";")[0]
             for line in comm.describe().splitlines() if ", over " in line}
    print(json.dumps({"wrong": wrong, "paths": paths}))
"""


def pull_when_asked(p, cable: list[str], pulled) -> float:
    """Once the job says "pull the cable", set it down (cable: `ip ... link set <dev>`) and
    touch pulled, which the job waits for; when it went down (monotonic)."""
    seen, deadline = "", time.monotonic() + 60
    while "pull the cable" not in seen and time.monotonic() < deadline:
        if select.select([p.stdout], [], [], 1)[0]:
            seen += p.stdout.readline()
    assert "pull the cable" in seen, seen
    subprocess.run([*cable, "down"], check=True)
    pulled.write_text("")
    return time.monotonic()


def test_a_pulled_cable_fails_over_to_the_management_network(cluster, script, tmp_path):
    pulled = tmp_path / "pulled"
    hostfile = cluster.mesh_hostfile(tmp_path, [1, 1, 1])
    job = script(JOB.replace("PULLED", repr(str(pulled))))
    p = tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp",
                 "--comm-timeout", 20, job)  # failover: on by default (several paths)
    cable = ["ip", "-n", cluster.ns(0), "link", "set", "tb1"]
    try:
        down = pull_when_asked(p, cable, pulled)
        code, out, err = finish(p, timeout=90)
        took = time.monotonic() - down
    finally:
        subprocess.run([*cable, "up"], check=True)
    assert code == 0, out + err
    got = results(out)
    assert [got[rank]["wrong"] for rank in range(3)] == [0, 0, 0], out
    assert got[0]["paths"] == {"1": "management", "2": "cable 1"}, got
    assert got[1]["paths"] == {"0": "management", "2": "cable 1"}, (got, err)
    said = [line for line in err.splitlines() if " lost after " in line]  # tbrun's, one
    assert len(said) == 1 and said[0].startswith("tbrun: rank 0 <-> rank 1: cable 1 ("), err
    assert "; now over management (" in said[0], err
    assert took < 30, (took, err)  # detection (~1.5 s), the asking peer's look (1 s), replay
    assert_no_rank_left(cluster)


PULLS = """
import json
import os
import sys
import time
import numpy as np
import tbcoll


def path_to(comm, rank):
    for line in comm.describe().splitlines():
        if line.strip().startswith(f"to rank {rank}:"):
            return line.split(", over ")[1].split(";")[0]


with tbcoll.init() as comm:
    x = np.arange(32767, dtype=np.float64)
    wrong = calls = 0
    seen = path_to(comm, 1 - (comm.rank == 1)) if comm.rank < 2 else None
    print("looping", flush=True)
    stop = False
    while not stop:  # rank 0 says when, in the call's last element
        said = float(comm.rank == 0 and os.path.exists(STOP))
        total = comm.all_reduce(np.append(x + comm.rank, said))
        wrong += not np.array_equal(total[:-1], 3 * x + 3)
        stop, calls = total[-1] > 0, calls + 1
        if comm.rank == 0 and calls % 8 == 0 and (now := path_to(comm, 1)) != seen:
            seen = now
            print(f"path {now}", flush=True)
    comm.barrier()
    paths = {r: path_to(comm, r) for r in range(3) if r != comm.rank}
    print(json.dumps({"rank": comm.rank, "wrong": wrong, "calls": calls, "paths": paths}),
          flush=True)
    comm.barrier()
    if comm.rank == 0:
        print("last path", flush=True)
    while True:
        comm.all_reduce(np.append(x, 0.0))
"""


def job_of(pid: int) -> str | None:
    """The script a python process runs (its first argument ending in .py), if any."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    return next((a for a in argv if a.endswith(".py")), None)


class Job:
    """tbrun's lines as they come: stdout's (tags taken off) and stderr, read from the pipes
    unbuffered (a buffered readline would keep lines that select() no longer sees)."""

    def __init__(self, p: subprocess.Popen) -> None:
        self.p, self.lines, self.err, self._rest, self._seen = p, [], "", b"", 0

    def wait_for(self, wanted: str, within: float = 20) -> None:
        """Until a line after the last one waited for is wanted."""
        self._wait(lambda: wanted in self.lines[self._seen:], wanted, within)
        self._seen = self.lines.index(wanted, self._seen) + 1

    def wait_for_records(self, key: str, count: int, within: float = 20) -> None:
        """Until count ranks have printed their record with key."""
        self._wait(lambda: len(self.records(key)) >= count, f"{count} records", within)

    def wait_for_error(self, wanted: str, within: float = 20) -> None:
        self._wait(lambda: wanted in self.err, repr(wanted), within)

    def _wait(self, done, what: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {within} s: {self.lines}\n{self.err}")
            if not self._read(0.2):
                raise AssertionError(f"tbrun has ended: {self.lines}\n{self.err}")

    def finish(self, timeout: float) -> int:
        """Wait for tbrun to end (killed past timeout); its status."""
        self.p.stdin.close()
        try:
            self.p.wait(timeout)
        finally:
            self.p.kill()
        while self._read(0):
            pass
        return self.p.wait()

    def records(self, key: str) -> dict[int, dict]:
        found = [json.loads(line) for line in self.lines if line.startswith("{")]
        return {r["rank"]: r for r in found if key in r}

    def _read(self, wait: float) -> bool:
        """Read what either pipe has (waiting up to wait); False once stdout has ended."""
        alive = True
        for pipe in select.select([self.p.stdout, self.p.stderr], [], [], wait)[0]:
            chunk = os.read(pipe.fileno(), 1 << 16)
            if pipe is self.p.stderr:
                self.err += chunk.decode(errors="replace")
                continue
            *whole, self._rest = (self._rest + chunk).split(b"\n")
            self.lines += [line.decode().partition("] ")[2] for line in whole]
            alive = bool(chunk)
        return alive


def test_pulled_cables_then_the_last_path_and_a_stopped_peer(cluster, script, tmp_path):
    cluster.add_second_cables()
    stop = tmp_path / "stop"
    hostfile = cluster.mesh_hostfile(tmp_path, [1, 1, 1], cables=2)
    job_file = str(script(PULLS.replace("STOP", repr(str(stop)))))
    p = tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp", "--comm-timeout", 20,
                 "-x", "TBCOLL_FAILOVER=1", job_file)
    down = [("ip", "-n", cluster.ns(0), "link", "set", cluster.cable(0, 1)),
            ("ip", "-n", cluster.ns(1), "link", "set", cluster.cable(1, 0, True)),
            ("ip", "-n", cluster.ns(1), "link", "set", "mgmt"),
            ("ip", "-n", cluster.ns(1), "link", "set", cluster.cable(1, 0))]
    job = Job(p)
    try:
        job.wait_for("looping")
        subprocess.run([*down[0], "down"], check=True)
        job.wait_for("path cable 2")
        subprocess.run([*down[1], "down"], check=True)
        job.wait_for("path management")
        subprocess.run([*down[0], "up"], check=True)
        job.wait_for("path cable 1")  # fail-back: the first cable answers again
        stopped = [pid for pid in cluster.pids(2) if job_of(pid) == job_file]
        assert stopped, cluster.pids(2)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(3)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        subprocess.run([*down[3], "down"], check=True)  # cable 1 again, at host 1's end
        job.wait_for("path management")
        stop.write_text("")
        job.wait_for("last path")
        job.wait_for_records("wrong", 3)  # (rank 1's comes over the management network)
        subprocess.run([*down[2], "down"], check=True)
        pulled = time.monotonic()
        job.wait_for_error("no path left to fail over to")
        took = time.monotonic() - pulled
        subprocess.run([*down[2], "up"], check=True)  # so that tbrun reaches rank 1 to end it
        code = job.finish(timeout=60)
        err = job.err
    finally:
        for link in down:
            subprocess.run([*link, "up"], check=True)
    got = job.records("wrong")
    assert sorted(got) == [0, 1, 2], (job.lines, err)
    assert [got[r]["wrong"] for r in range(3)] == [0, 0, 0], got
    assert got[0]["paths"] == {"1": "management", "2": "cable 1"}, got
    assert got[1]["paths"] == {"0": "management", "2": "cable 1"}, got
    assert got[2]["paths"] == {"0": "cable 1", "1": "cable 1"}, got
    said = [line for line in err.splitlines() if line.startswith("tbrun: rank ")
            and ("lost after" in line or "back to" in line)]  # tbrun's, one per event
    assert len(said) == 4 and all(line.startswith("tbrun: rank 0 <-> rank 1: ") for line in said)
    assert " cable 1 (" in said[0] and "now over cable 2 (" in said[0], said
    assert " cable 2 (" in said[1] and "now over management (" in said[1], said
    assert " back to cable 1 (" in said[2] and "the preferred path answers again" in said[2]
    assert " cable 1 (" in said[3] and "now over management (" in said[3], said
    if c_extension("tbcoll.transports.tcp._sockets") is not None:  # C's watcher found them
        # (tbrun tells the view of the end that found it first: either's watcher, or the
        # other's ask)
        assert any("nothing acknowledged for" in said[n] for n in (0, 1, 3)), said
    assert code != 0, err
    assert "no path left to fail over to" in err, err
    assert "lost connection to rank 1" in err, err
    assert took < 15, (took, err)
    assert_no_rank_left(cluster)


HOSTPAIR = """
import json
import os
import time
import numpy as np
import tbcoll


def paths(comm):
    return {line.split()[2].rstrip(":"): line.split(", over ")[1].split(";")[0]
            for line in comm.describe().splitlines() if ", over " in line}


with tbcoll.init() as comm:
    x = np.arange(32768, dtype=np.float64)
    wrong, calls, seen = 0, 0, None
    comm.barrier()
    if comm.rank in (0, 2):  # the leaders' rail alone carries traffic when the cable goes
        if comm.rank == 0:
            print("pull the cable", flush=True)
        stop = False
        while not stop:  # rank 0 says when, in the message's last element
            if comm.rank == 0:
                if seen is None and os.path.exists(PULLED):
                    seen = time.monotonic()
                stop = seen is not None and time.monotonic() - seen > 2.5
                comm.send(np.append(x + calls, float(stop)), 2)
            else:
                got = comm.recv(np.empty(x.size + 1), 0)
                wrong += not np.array_equal(got[:-1], x + calls)
                stop = got[-1] > 0
            calls += 1
        comm.send(np.full(4, 7.0), 3 - comm.rank)  # to the idle rank of the other host
        at_go = paths(comm)
    else:  # idle, waiting on the other host's leader: the pair is used only after
        got = comm.recv(np.empty(4), 3 - comm.rank)
        at_go = paths(comm)  # before any other use
        wrong += not np.array_equal(got, np.full(4, 7.0))
    total = comm.all_reduce(x + comm.rank)
    wrong += not np.array_equal(total, 4 * x + 6)
    print(json.dumps({"wrong": wrong, "at_go": at_go, "described": comm.describe()}))
"""


def test_a_pair_of_hosts_fails_over_as_one(cluster, script, tmp_path):
    """2 hosts x 2 ranks: host 0's end of the cable goes down while only ranks 0 and 2 send;
    the pairs with nothing in flight (0-3, 1-2, 1-3) move at once with theirs: each shows the
    management network before it is used again (2.5 s later: keepalive alone would take ~4 s),
    and tbrun says so in one line of the pair of hosts, every result right."""
    pulled = tmp_path / "pulled"
    mesh = json.loads(cluster.mesh_hostfile(tmp_path, [2, 2, 1]).read_text())
    hosts = mesh["hosts"][:2]
    for host in hosts:
        host["links"] = host["links"][:2]
    hostfile = tmp_path / "two-hosts.json"
    hostfile.write_text(json.dumps({"hosts": hosts}))
    job = script(HOSTPAIR.replace("PULLED", repr(str(pulled))))
    p = tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp", "--comm-timeout", 20, job)
    cable = ["ip", "-n", cluster.ns(0), "link", "set", cluster.cable(0, 1)]
    try:
        pull_when_asked(p, cable, pulled)
        code, out, err = finish(p, timeout=90)
    finally:
        subprocess.run([*cable, "up"], check=True)
    assert code == 0, out + err
    got = results(out)
    assert [got[rank]["wrong"] for rank in range(4)] == [0, 0, 0, 0], out
    across = {0: ("2", "3"), 1: ("2", "3"), 2: ("0", "1"), 3: ("0", "1")}
    for rank, peers in across.items():
        assert got[rank]["at_go"] == dict.fromkeys(peers, "management"), (rank, got, err)
    said = [line for line in err.splitlines() if " lost after " in line]  # tbrun's, one
    hosts = f"{cluster.address(0)} <-> {cluster.address(1)}"  # the hostfile's names
    assert len(said) == 1 and said[0].startswith(f"tbrun: {hosts}: cable 1 ("), err
    assert "; now over management (" in said[0] and "4 pairs of ranks moved" in said[0], err
    # the idle rail's pair (1-3) moved because its hosts' pair did, found by a leader
    assert f"({hosts}: cable 1 failed, found by rank " in got[1]["described"], got[1]
    assert_no_rank_left(cluster)
