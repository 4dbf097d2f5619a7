"""tbrun across hosts: three network namespaces with an sshd each (tests/harness/netns.py),
tbrun started in the first, ranks on all three over ssh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ..conftest import REPO, tagged_lines
from .conftest import HOSTS, assert_no_rank_left, finish, results, tbrun_on

ALL_REDUCE = """
import json, os, socket
import numpy as np
import tbcoll

with tbcoll.init() as comm:
    x = np.arange(4, dtype=np.float64) + comm.rank
    total = comm.all_reduce(x)
    gathered = comm.all_gather(np.array([comm.rank], dtype=np.int32))
    # "  to rank 1: 10.202.1.1:40000 -> 10.202.1.2:41000, over cable 1; ...": the peer's
    # address, by rank
    links = {line.split()[2].rstrip(":"): line.split(" -> ")[1].split()[0].rstrip(",")
             .rpartition(":")[0] for line in comm.describe().splitlines() if "->" in line}
    print(json.dumps({"rank": comm.rank, "node": comm.node_rank, "backend": comm.backend,
                      "total": total.tolist(), "gathered": gathered.tolist(), "peers": links,
                      "cwd": os.getcwd(), "greeting": os.environ.get("GREETING"),
                      "netns": os.readlink("/proc/self/ns/net")}))
"""

def test_hosts_have_their_own_shared_memory_and_names(cluster):
    """A segment made on host 0 is not on host 1 nor on the real machine, whose mounts the
    hosts' /dev/shm never reach; each host answers to its own name, which all resolve."""
    name = f"tbcoll-isolation-{os.getpid()}"
    make = ("from multiprocessing import resource_tracker, shared_memory\n"
            f"s = shared_memory.SharedMemory({name!r}, create=True, size=4096)\n"
            "resource_tracker.unregister(s._name, 'shared_memory')\n")

    def on(i: int, *argv: str) -> str:
        return subprocess.run(cluster.exec_argv(i, *argv), capture_output=True, text=True,
                              check=True, timeout=30).stdout

    on(0, sys.executable, "-c", make)
    try:
        assert name in on(0, "ls", "/dev/shm").split()
        assert name not in on(1, "ls", "/dev/shm").split()
        assert not os.path.exists(f"/dev/shm/{name}")
        names = [on(i, "hostname").strip() for i in range(HOSTS)]
        assert names == [cluster.hostname(i) for i in range(HOSTS)]
        assert on(1, "getent", "hosts", names[2]).split()[0] == cluster.address(2)
        with open("/proc/self/mounts") as mounts:
            assert "tbcoll-shm" not in mounts.read()
    finally:
        on(0, "rm", "-f", f"/dev/shm/{name}")


def test_tcp_job_over_three_hosts_with_slots(cluster, script, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("".join(f"{cluster.address(i)} slots=2\n" for i in range(HOSTS)))
    code, out, err = finish(tbrun_on(cluster, "--hostfile", hostfile, "--map-by", "node",
                                     "-x", "GREETING=hello", "--cwd", tmp_path,
                                     script(ALL_REDUCE)))
    assert code == 0, out + err
    got = results(out)
    assert sorted(got) == list(range(2 * HOSTS))
    for rank, r in got.items():
        assert r["node"] == rank % HOSTS  # --map-by node deals ranks round the hosts
        assert r["backend"] == "tcp"  # auto on several hosts
        assert r["total"] == [sum(range(6)) + 6 * k for k in range(4)]
        assert r["gathered"] == list(range(6))
        assert r["greeting"] == "hello" and r["cwd"] == str(tmp_path)
    assert_one_namespace_per_host(got, HOSTS)
    assert_no_rank_left(cluster)


def assert_one_namespace_per_host(got: dict[int, dict], hosts: int) -> None:
    """Ranks of a host share its network namespace; no two hosts share one."""
    by_node = {}
    for r in got.values():
        by_node.setdefault(r.get("node", r["rank"] % hosts), set()).add(r["netns"])
    assert all(len(ns) == 1 for ns in by_node.values()), by_node
    assert len(set.union(*by_node.values())) == hosts, by_node


# An unmodified mpi4py program and tbcoll's mpi backend, in one job: COMM_WORLD first, then
# tbcoll.init() over the same world (a job over three hosts costs seconds to start).
MPI_ACROSS_HOSTS = """
import json, os
import numpy as np
from mpi4py import MPI
import tbcoll

world = MPI.COMM_WORLD
mpi_total = np.empty(2)
world.Allreduce(np.full(2, world.rank + 1.0), mpi_total)
with tbcoll.init() as comm, tbcoll.init(backend="tcp") as tcp:
    total = tcp.all_reduce(np.array([1.0]))
    print(json.dumps({"rank": comm.rank, "size": world.size, "mpi_total": mpi_total.tolist(),
                      "backend": comm.backend, "total": total[0],
                      "node": int(os.environ["TBCOLL_NODE_RANK"]),
                      "local": int(os.environ["TBCOLL_LOCAL_RANK"]),
                      "store": os.environ["TBCOLL_STORE"],
                      "netns": os.readlink("/proc/self/ns/net")}))
"""


def test_mpi_job_over_three_hosts_gets_its_contract_and_the_store(cluster, script):
    """mpi4py's world spans the hosts; under --backend mpi each rank's node and local rank
    follow from where Hydra placed it, and TBCOLL_STORE is tbrun's store at the address its
    host reaches: tcp meets there."""
    pytest.importorskip("mpi4py")
    hosts = ",".join(f"{cluster.address(i)}:2" for i in range(HOSTS))
    # Each host has its own /dev/shm and name (tests/harness/netns.py): MPICH sees three nodes,
    # shared memory inside each and the network between them, as on real machines.
    code, out, err = finish(tbrun_on(cluster, "--backend", "mpi", "-H", hosts, "--map-by", "node",
                                     script(MPI_ACROSS_HOSTS)))
    assert code == 0, out + err
    got = results(out)
    assert sorted(got) == list(range(2 * HOSTS))
    for rank, r in got.items():
        assert r["mpi_total"] == [21.0, 21.0] and r["size"] == 6
        assert (r["backend"], r["total"]) == ("mpi", 2.0 * HOSTS)
        assert (r["node"], r["local"]) == (rank % HOSTS, rank // HOSTS)
        host = r["store"].rpartition(":")[0]
        assert host == "127.0.0.1" if r["node"] == 0 else host != "127.0.0.1", r
    assert_one_namespace_per_host(got, HOSTS)  # rank r on host r % 3, as --map-by node says
    assert_no_rank_left(cluster)


def test_tcp_uses_the_cable_between_each_pair_of_hosts(cluster, script, tmp_path):
    hostfile = cluster.mesh_hostfile(tmp_path)
    code, out, err = finish(tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp",
                                     script(ALL_REDUCE)))
    assert code == 0, out + err
    got = results(out)
    for rank, r in got.items():
        assert r["total"] == [3 + 3 * k for k in range(4)]
        # rank i reaches rank j at j's end of their cable, not over the management network
        assert r["peers"] == {str(j): cluster.link(j, rank) for j in range(HOSTS) if j != rank}
    assert_one_namespace_per_host(got, HOSTS)


def test_the_main_job_across_hosts(cluster, tmp_path):
    """examples/tp_forward.py tensor-parallel over three hosts, each pair over its cable."""
    code, out, err = finish(tbrun_on(cluster, "--hostfile", cluster.mesh_hostfile(tmp_path),
                                     REPO / "examples" / "tp_forward.py"), timeout=120)
    assert code == 0, out + err
    assert "max abs error against the float64 reference" in out and "(OK" in out
    assert_no_rank_left(cluster)


def test_an_unmodified_mlx_script_across_hosts(cluster, script, tmp_path):
    """MLX's ring backend between the hosts, with the hostfile MLX gets written on each."""
    pytest.importorskip("mlx.core")
    code, out, err = finish(tbrun_on(cluster, "--backend", "mlx", "--hostfile",
                                     cluster.mesh_hostfile(tmp_path), script("""
        import json, os
        import mlx.core as mx

        group = mx.distributed.init(strict=True, backend="ring")
        total = mx.distributed.all_sum(mx.array([group.rank() + 1.0]))
        print(json.dumps({"rank": group.rank(), "total": total.tolist(),
                          "netns": os.readlink("/proc/self/ns/net")}))
        """)))
    assert code == 0, out + err
    got = results(out)
    assert all(r["total"] == [6.0] for r in got.values()) and sorted(got) == [0, 1, 2]
    assert_one_namespace_per_host(got, HOSTS)
    assert_no_rank_left(cluster)


def test_a_failing_remote_rank_takes_down_every_host(cluster, script):
    code, out, err = finish(tbrun_on(
        cluster, "-H", ",".join(f"{cluster.address(i)}:2" for i in range(HOSTS)),
        script("import os, sys, time\n"
               "if os.environ['RANK'] == '5': sys.exit(7)\n"
               "time.sleep(60)\n")), timeout=40)
    assert code == 7
    assert f"rank 5 on {cluster.address(2)}" in err and "exited with status 7" in err
    assert_no_rank_left(cluster)


def test_ctrl_c_reaches_remote_ranks(cluster, script):
    p = tbrun_on(cluster, "-H", ",".join(cluster.address(i) for i in range(HOSTS)),
                 # "up" inside the try: a SIGINT that came between the two used to miss it
                 script("import time\n"
                        "try:\n    print('up', flush=True)\n    time.sleep(60)\n"
                        "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
                        "    raise SystemExit(5)\n"))
    started = []
    while len(started) < HOSTS:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        started.append(line)
    p.send_signal(signal.SIGINT)
    code, out, err = finish(p, timeout=30)
    assert code == 128 + signal.SIGINT
    assert sorted(tagged_lines(out)) == list(range(HOSTS)), out + err
    assert all(lines == ["interrupted"] for lines in tagged_lines(out).values()), out
    assert_no_rank_left(cluster)


def test_remote_ranks_die_with_a_killed_tbrun(cluster, script):
    p = tbrun_on(cluster, "-H", ",".join(cluster.address(i) for i in range(HOSTS)),
                 script("import time\nprint('up', flush=True)\ntime.sleep(60)\n"))
    for _ in range(HOSTS):
        assert p.stdout.readline(), p.stderr.read()
    p.kill()  # SIGKILL: tbrun cannot tear anything down itself
    p.wait()
    assert_no_rank_left(cluster)  # ssh's end of file made tbcoll.launch.remote kill each rank


@pytest.mark.parametrize("end", ["normal", "kill -9"])
def test_what_ranks_detach_dies_on_every_host(cluster, script, end):
    """Each rank leaves a child in a session of its own and a double-forked daemon: on the
    remote hosts tbcoll.launch.remote (their subreaper) kills them when its rank ends, or when
    tbrun is gone; on tbrun's host tbrun does, or its janitor after kill -9."""
    p = tbrun_on(cluster, "-H", ",".join(cluster.address(i) for i in range(HOSTS)), script("""
        import os, subprocess, sys, time
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "1000"])
            os._exit(0)
        os.wait()
        print("up", flush=True)
        if sys.argv[1] == "stay":
            time.sleep(60)
        """), "end" if end == "normal" else "stay")
    try:
        if end == "normal":
            code, out, err = finish(p)
            assert code == 0 and len(out.splitlines()) == HOSTS, out + err
        else:
            for _ in range(HOSTS):
                assert p.stdout.readline(), p.stderr.read()
            p.kill()
            p.wait()
        assert_no_rank_left(cluster)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for i in range(HOSTS):  # what a failure left in the test's own namespaces
            for pid in cluster.pids(i):
                os.kill(pid, signal.SIGKILL)


def test_timeout_stops_remote_ranks(cluster, script):
    start = time.monotonic()
    code, _, err = finish(tbrun_on(cluster, "-H", f"{cluster.address(1)}:2", "--timeout", 3,
                                   script("import time\ntime.sleep(60)\n")), timeout=40)
    assert code == 124, err
    assert time.monotonic() - start < 20
    assert_no_rank_left(cluster)


def test_an_unreachable_host_is_named_in_bounded_time(cluster, script):
    nobody = "10.201.0.99"
    start = time.monotonic()
    code, _, err = finish(tbrun_on(cluster, "-H", f"{cluster.address(1)},{nobody}",
                                   "--connect-timeout", 2, script("import time\ntime.sleep(60)\n")),
                          timeout=40)
    assert code == 255
    assert f"rank 1 on {nobody}" in err and f"ssh {nobody} true" in err
    assert time.monotonic() - start < 15
    assert_no_rank_left(cluster)


def test_a_python_missing_on_a_remote_host_is_named(cluster, script):
    code, _, err = finish(tbrun_on(cluster, "-H", cluster.address(1), "--python", "/no/python",
                                   "--timeout", 30, script("print(1)")),
                          timeout=40)
    assert code == 127
    assert f"a command not found on {cluster.address(1)}" in err and "/no/python" in err


def test_missing_remote_directory_is_reported(cluster, script):
    code, _, err = finish(tbrun_on(cluster, "-H", cluster.address(1), "--cwd", "/no/such/dir",
                                   script("print('never')")), timeout=40)
    assert code == 2
    assert "working directory /no/such/dir does not exist" in err


def test_doctor_checks_ssh_versions_and_every_link(cluster, tmp_path):
    code, out, err = finish(tbrun_on(cluster, "doctor", "--hostfile",
                                     cluster.mesh_hostfile(tmp_path)))
    assert code == 0, out + err
    for i in (1, 2):
        assert f"ok    ssh {cluster.address(i)}: reached" in out
    assert "versions:" in out and "on every host" in out
    for i in range(HOSTS):
        for j in range(HOSTS):
            if i != j:  # host i reaches host j at j's end of their cable
                assert (f"ok    link {cluster.address(i)} -> {cluster.address(j)}: "
                        f"{cluster.link(j, i)} answers") in out


def test_doctor_reports_a_link_that_does_not_answer(cluster, tmp_path):
    hosts = json.loads(cluster.mesh_hostfile(tmp_path).read_text())["hosts"]
    hosts[1]["links"][0] = "10.203.0.1"  # an address on no cable
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(hosts))
    code, out, _ = finish(tbrun_on(cluster, "doctor", "--hostfile", broken))
    assert code == 1
    assert f"FAIL  link {cluster.address(0)} -> {cluster.address(1)}: 10.203.0.1:" in out


def test_json_hostfile_from_probing_the_hosts(cluster):
    names = [cluster.address(i) for i in range(HOSTS)]
    code, out, err = finish(tbrun_on(cluster, "hostfile", "--json", *names))
    assert code == 0, err
    written = json.loads(out)
    assert [h["ips"] for h in written["hosts"]] == [[name] for name in names]
    assert "Thunderbolt discovery skipped: macOS only" in err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_stdin_reaches_ranks_on_remote_hosts(cluster, script):
    """Rank 0 on another host reads tbrun's input over ssh; with --stdin all, every rank."""
    hosts = f"{cluster.address(1)}:1,{cluster.address(2)}:1"
    path = script("import sys\nprint(repr(sys.stdin.read()))\n")
    code, out, err = finish(tbrun_on(cluster, "-H", hosts, path), input="100\n")
    assert code == 0, out + err
    assert tagged_lines(out) == {0: ["'100\\n'"], 1: ["''"]}
    code, out, err = finish(tbrun_on(cluster, "-H", hosts, "--stdin", "all", path),
                            input="x" * 300_000)
    assert code == 0, out + err
    assert tagged_lines(out) == {r: [repr("x" * 300_000)] for r in range(2)}


def test_a_pulled_cable_ends_the_job_in_seconds_naming_it(cluster, script, tmp_path):
    """Cables work loose: `ip link set tb2 down` on host 1 mid-job, under --no-failover (else
    the pair goes on over the management network: test_failover_pull). TCP alone stays silent
    (the job used to hang for the whole --comm-timeout, then blame rank 0); keepalive ends
    the waiting ranks' connections within seconds, and the messages name the link."""
    path = script("""
        import sys, time
        import numpy as np
        import tbcoll
        comm = tbcoll.init()
        for i in range(100000):
            comm.all_reduce(np.ones(4))
            if i == 20 and comm.rank == 0:
                print("ready", flush=True)
            time.sleep(0.005)
    """)
    proc = tbrun_on(cluster, "--hostfile", cluster.mesh_hostfile(tmp_path), "--backend", "tcp",
                    "--comm-timeout", 120, "--no-failover", path)
    cable = ["ip", "-n", cluster.ns(1), "link", "set", "tb2"]
    try:
        assert proc.stdout.readline().strip() == "[0] ready"
        subprocess.run([*cable, "down"], check=True)
        pulled = time.monotonic()
        code, out, err = finish(proc, timeout=60)
        took = time.monotonic() - pulled
    finally:
        subprocess.run([*cable, "up"], check=True)
    assert code != 0, out + err
    assert took < 15, err
    assert cluster.link(1, 2) in err and cluster.link(2, 1) in err, err  # the cable, by name
    assert "tbrun: the link between rank 1 on" in err and "and rank 2 on" in err, err
    assert "rank 0 did not answer" not in err
    assert_no_rank_left(cluster)


def test_where_every_rank_was_comes_back_from_every_host(cluster, script, tmp_path):
    path = script("""
        import os, signal, time, numpy as np, tbcoll
        comm = tbcoll.init()
        comm.all_reduce(np.ones(4))
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # tbrun's SIGCONT goes through ssh
            time.sleep(60)
        comm.all_reduce(np.ones(4))
    """)
    code, out, err = finish(tbrun_on(
        cluster, "-H", ",".join(cluster.address(i) for i in range(HOSTS)), "--comm-timeout", 3,
        "--dump-dir", tmp_path / "dumps", path), timeout=60)
    assert code == 1, out + err
    assert f"ranks 0, 2: all_reduce #2 float64 32 B at {path}:8 (failed)" in err
    assert any(f"rank 1: not in a call (1 made), at {path}:{line}" in err for line in (6, 7))
    (folder,) = (tmp_path / "dumps").glob("*/dump-1")
    dump = json.loads((folder / "rank-1.json").read_text())
    assert dump["rank"] == 1 and any(s["main"] for s in dump["stacks"])
    assert_no_rank_left(cluster)
