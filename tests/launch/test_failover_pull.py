"""Failover with replay (work in progress, docs/failover.md), a real pull: in the namespace
cluster, the cable between hosts 0 and 1 goes down (`ip link set ... down`) in the middle of
a loop of all_reduce; under TBCOLL_FAILOVER=1 the pair carries on over the management
network, tbrun saying so in one line, and every result is right. Host 0's end of the cable
is the one set down: its kernel counts its failed sends as local congestion (no
retransmission timeout, no keepalive end), so it learns of the failure from rank 1, which
asks through the store."""

from __future__ import annotations

import select
import subprocess
import time

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


def test_a_pulled_cable_fails_over_to_the_management_network(cluster, script, tmp_path):
    pulled = tmp_path / "pulled"
    hostfile = cluster.mesh_hostfile(tmp_path, [1, 1, 1])
    job = script(JOB.replace("PULLED", repr(str(pulled))))
    p = tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp",
                 "--comm-timeout", 20, "-x", "TBCOLL_FAILOVER=1", job)
    cable = ["ip", "-n", cluster.ns(0), "link", "set", "tb1"]
    try:
        seen, deadline = "", time.monotonic() + 60
        while "pull the cable" not in seen and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], 1)[0]:
                seen += p.stdout.readline()
        assert "pull the cable" in seen, seen
        subprocess.run([*cable, "down"], check=True)
        pulled.write_text("")
        down = time.monotonic()
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
