"""The stall a real pull causes under failover (docs/failover.md): in the namespace cluster
(tests/harness/netns.py, root and iproute2; two cables per pair of hosts), 3 ranks on 3
hosts loop all_reduce of 256 KiB; at a random moment a cable in use is set down, and the
stall is the time from the pull to the end of the longest gap between two calls completing
after it (on the slowest rank). Per job: host 0's end of cable 1 to host 1 (-> cable 2),
then host 1's end of cable 2 (-> management).

    sudo .venv/bin/python benchmarks/failover_stall.py [--jobs 3] [--every 4]

Prints each stall and their p50 and max.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import netns  # noqa: E402

TBRUN = Path(sys.executable).parent / "tbrun"
PULL_EVERY = 4.0  # seconds from one pull to the next (and a stall's bound): --every
JOB = """
import json, os, time
import numpy as np
import tbcoll

with tbcoll.init() as comm:
    x = np.arange(32767, dtype=np.float64)
    done, stop = [], False
    while not stop:  # rank 0 says when, in the call's last element
        said = float(comm.rank == 0 and os.path.exists(STOP))
        stop = comm.all_reduce(np.append(x, said))[-1] > 0
        done.append(time.time())
    with open(f"{OUT}.{comm.rank}", "w") as f:
        json.dump(done, f)
"""


def stall(done: list[float], pulled: float, every: float) -> float:
    """From the pull to the end of the longest gap between completions after it (before the
    next pull, every seconds later)."""
    after = [t for t in done if pulled < t < pulled + every]
    before = [t for t in done if t <= pulled][-1:]
    times = before + after
    gaps = [(b - a, b) for a, b in zip(times, times[1:], strict=False)]
    return max(gaps)[1] - pulled


def one_job(cluster: netns.Cluster, folder: Path, n: int, every: float) -> list[float]:
    stop, out = folder / f"stop{n}", folder / f"done{n}"
    script = folder / f"job{n}.py"
    script.write_text(JOB.replace("STOP", repr(str(stop))).replace("OUT", repr(str(out))))
    hostfile = cluster.mesh_hostfile(folder, [1, 1, 1], cables=2)
    p = subprocess.Popen(cluster.exec_argv(0, str(TBRUN), "--ssh", cluster.ssh, "--hostfile",
                                           str(hostfile), "--backend", "tcp", "-x",
                                           "TBCOLL_FAILOVER=1", str(script)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cables = [("ip", "-n", cluster.ns(0), "link", "set", cluster.cable(0, 1)),
              ("ip", "-n", cluster.ns(1), "link", "set", cluster.cable(1, 0, True))]
    pulls = []
    try:
        time.sleep(3)  # started and looping
        for cable in cables:
            time.sleep(random.uniform(0.5, 1.5))
            subprocess.run([*cable, "down"], check=True)
            pulls.append(time.time())
            time.sleep(every)
        stop.write_text("")
        _, err = p.communicate(timeout=60)
    finally:
        for cable in cables:
            subprocess.run([*cable, "up"], check=True)
    if p.returncode != 0:
        raise SystemExit(f"job {n} failed: {err}")
    done = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(3)]
    return [max(stall(times, pulled, every) for times in done) for pulled in pulls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--every", type=float, default=PULL_EVERY,
                        help="seconds from one pull to the next, and a stall's bound")
    args = parser.parse_args()
    if why := netns.why_not_available():
        raise SystemExit(f"failover_stall needs the namespace cluster: {why}")
    folder = Path(tempfile.mkdtemp(prefix="failover-stall-"))
    cluster = netns.Cluster(f"fs{os.getpid() % 10000}", folder, 3).start()
    try:
        cluster.add_second_cables()
        stalls = []
        for n in range(args.jobs):
            got = one_job(cluster, folder, n, args.every)
            print(f"job {n}: stalls " + ", ".join(f"{s:.2f} s" for s in got), flush=True)
            stalls += got
    finally:
        cluster.stop()
    print(f"{len(stalls)} pulls: p50 {statistics.median(stalls):.2f} s, "
          f"max {max(stalls):.2f} s")


if __name__ == "__main__":
    main()
