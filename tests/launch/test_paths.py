"""Several paths between a pair of hosts (issue 50's first slice): in the namespace cluster,
a cable down from the start is passed over for the pair's next path, said in one line, and
the job's results are right; describe() names the path each pair uses."""

from __future__ import annotations

import json
import subprocess

from .conftest import assert_no_rank_left, finish, results, tbrun_on

JOB = """
import json
import numpy as np
import tbcoll

with tbcoll.init() as comm:
    total = comm.all_reduce(np.arange(1000, dtype=np.float64) + comm.rank)
    gathered = comm.all_gather(np.full(3, comm.rank, dtype=np.int32))
    comm.send(np.full(5, comm.rank, dtype=np.int64), (comm.rank + 1) % comm.size)
    got = comm.recv(np.empty(5, dtype=np.int64), (comm.rank - 1) % comm.size)
    # "  to rank 1: A:p -> B:p, over cable 2; other paths: cable 1 (...), management (...)"
    paths = {line.split()[2].rstrip(":"): line.split(", over ")[1].split(";")[0]
             for line in comm.describe().splitlines() if ", over " in line}
    print(json.dumps({"total": total[:3].tolist(), "gathered": gathered.tolist(),
                      "got": got.tolist(), "paths": paths}))
"""

DOWN_CABLE = ("10.203.0.1", "10.203.0.2")  # hosts 0 and 1's ends of a cable that is down
NO_CABLE = ("10.204.0.1", "10.204.0.2")  # host 0 and 2's addresses on a cable no host has


def test_a_cable_down_from_the_start_falls_to_the_pairs_next_path(cluster, script, tmp_path):
    """Hosts 0 (ranks 0 and 1: two levels) and 1 (rank 2): a first cable whose far end is
    down (SYNs go unanswered: rank 2 waits for it once, not once per rank of host 0), then
    their working one. Hosts 0 and 2 (rank 3): a first cable whose addresses no interface
    has, then the management network. Hosts 1 and 2: their one cable."""
    hosts = json.loads(cluster.mesh_hostfile(tmp_path, [2, 1, 1]).read_text())["hosts"]
    hosts[0]["links"][1] = [DOWN_CABLE[0], cluster.link(0, 1)]
    hosts[1]["links"][0] = [DOWN_CABLE[1], cluster.link(1, 0)]
    hosts[0]["links"][2], hosts[2]["links"][0] = NO_CABLE
    hostfile = tmp_path / "paths.json"
    hostfile.write_text(json.dumps({"hosts": hosts}))
    here, there = cluster.ns(0), cluster.ns(1)
    subprocess.run(["ip", "link", "add", "tbx1", "netns", here, "type", "veth", "peer",
                    "name", "tbx0", "netns", there], check=True)
    try:
        for ns, dev, address in ((here, "tbx1", DOWN_CABLE[0]), (there, "tbx0", DOWN_CABLE[1])):
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{address}/30", "dev", dev],
                           check=True)
        subprocess.run(["ip", "-n", there, "link", "set", "tbx0", "up"], check=True)
        # host 0's end stays down: host 1's SYNs go into a link with no carrier, unanswered
        code, out, err = finish(tbrun_on(cluster, "--hostfile", hostfile, "--backend", "tcp",
                                         script(JOB)), timeout=60)
    finally:
        subprocess.run(["ip", "-n", here, "link", "del", "tbx1"], check=True)
    assert code == 0, out + err
    got = results(out)
    assert sorted(got) == [0, 1, 2, 3], out
    for rank, r in got.items():
        assert r["total"] == [4 * k + 6 for k in range(3)]
        assert r["gathered"] == [r for r in range(4) for _ in range(3)]
        assert r["got"] == [(rank - 1) % 4] * 5
    for rank in (0, 1):
        assert got[rank]["paths"] == {"2": "cable 2", "3": "management"}, got
    assert got[2]["paths"] == {"0": "cable 2", "1": "cable 2", "3": "cable 1"}, got
    assert got[3]["paths"] == {"0": "management", "1": "management", "2": "cable 1"}, got
    for rank in (0, 1):
        assert (f"rank {rank} <-> rank 2: cable {DOWN_CABLE[0]} does not answer (timed out); "
                f"over {cluster.link(0, 1)} (cable 2)") in err, err
        assert (f"rank {rank} <-> rank 3: cable {NO_CABLE[0]}: rank {rank} does not listen "
                f"there; over {cluster.address(0)} (management)") in err, err
    assert f"rank 0 cannot listen on its cable address {NO_CABLE[0]}" in err, err
    assert "rank 2 <-> rank 3" not in err, err  # their first path answered: not a word
    assert_no_rank_left(cluster)
