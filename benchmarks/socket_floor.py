"""tbcoll's tcp transport against the floor under it: a bare Python socket on loopback.

    python benchmarks/socket_floor.py --rounds 5 [--before /path/to/another/checkout] [--shared]

In turns (A B A B ...): two processes ping-ponging over one TCP socket (TCP_NODELAY,
recv_into a preallocated buffer: the least Python can do per message), blocking in recv and
then polling (MSG_DONTWAIT in a loop, as tbcoll's tcp transport does for its first 50 us),
then `tbrun -np 2 --backend tcp` all_reduce (out=) and send/recv ping-pong. Prints, per size,
the medians over rounds of the medians of half the bare round trips and of tbcoll's times per
call (or per leg), and tbcoll's over the bare ones (issue 25's goal: 8 B all_reduce at np=2
within 2.0x a polling socket's one-way time). A blocking receiver pays the wake-up of an idle
core, which varies with what ran just before; the polling one does not. --before times
another checkout's tbcoll in the same turns (its directory first on PYTHONPATH, as this
one's is where PYTHONPATH names it). --shared times this checkout's calls after two threads
have used its engine at once (its C paths no longer wait in C: tbcoll.transports.stream.turns).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SIZES = (8, 64, 512, 4096)


def bare_half_round_trip(nbytes: int, iters: int, poll: bool, host: str = "127.0.0.1") -> float:
    """Median over iters of half a round trip of nbytes between two processes, in us."""
    with socket.create_server((host, 0)) as server:
        port = server.getsockname()[1]
        child = os.fork()
        if child == 0:
            try:
                with socket.create_connection((host, port)) as sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    echo(sock, nbytes, iters, poll)
            finally:
                os._exit(0)
        sock, _ = server.accept()
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = echo(sock, nbytes, iters, poll, timed=True)
    os.waitpid(child, 0)
    return statistics.median(times) / 2 * 1e6


def echo(sock: socket.socket, nbytes: int, iters: int, poll: bool,
         timed: bool = False) -> list[float]:
    """Send then receive nbytes iters times (timed) or receive then send (the other end)."""
    buf = memoryview(bytearray(nbytes))
    flags = socket.MSG_DONTWAIT if poll else 0
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        if timed:
            sock.sendall(buf)
        got = 0
        while got < nbytes:
            try:
                got += sock.recv_into(buf[got:], 0, flags)
            except BlockingIOError:
                pass
        if not timed:
            sock.sendall(buf)
        times.append(time.perf_counter() - start)
    return times


# Each call timed on its own and the median taken, the bare ping-pong's statistic: a batch's
# mean (tbcoll-bench's) takes in every preemption of a shared machine, a median does not.
_RANK_SCRIPT = """
import json, statistics, sys, time
import numpy as np
import tbcoll

sizes, iters, shared = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "shared"
comm = tbcoll.init()
peer, medians = 1 - comm.rank, {}
if shared:  # a second thread uses a sub-communicator while this one calls: the engine is shared
    import threading
    sub, go = comm.split(0), np.ones(2, np.float32)
    other = threading.Thread(target=lambda: [sub.all_reduce(go) for _ in range(500)])
    other.start()
    for _ in range(500):
        comm.all_reduce(go)
    other.join()
for n in sizes:
    x = np.ones(n // 4, np.float32)
    out = np.empty_like(x)
    for collective in ("all_reduce", "sendrecv"):
        times = []
        for _ in range(iters + iters // 10):  # the first tenth: warm-up
            start = time.perf_counter()
            if collective == "all_reduce":
                comm.all_reduce(x, out=out)
            elif comm.rank == 0:
                comm.send(x, peer)
                comm.recv(out, peer)
            else:
                comm.recv(out, peer)
                comm.send(x, peer)
            times.append(time.perf_counter() - start)
        legs = 2 if collective == "sendrecv" else 1
        medians[f"{collective} {n}"] = statistics.median(times[iters // 10:]) / legs * 1e6
if comm.rank == 0:
    print(json.dumps(medians))
"""


def tbcoll_times(iters: int, checkout: str | None = None, shared: bool = False
                 ) -> dict[str, float]:
    """Rank 0's median time per call (us) of all_reduce and of a sendrecv leg, per size, over
    tcp at np=2 under tbrun, keyed "COLLECTIVE SIZE" (checkout: the tbcoll to import, else
    the one this Python finds; shared: after two threads used the engine at once)."""
    env = {**os.environ, "PYTHONPATH": checkout} if checkout else None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(_RANK_SCRIPT)
        done = subprocess.run([str(BIN / "tbrun"), "-np", "2", "--backend", "tcp", str(script),
                               json.dumps(SIZES), str(iters), "shared" if shared else "alone"],
                              check=True, capture_output=True,
                              text=True, env=env)
    return json.loads(done.stdout.strip().removeprefix("[0]").strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--iters", type=int, default=2000)
    parser.add_argument("--before", help="another checkout's tbcoll, timed in the same turns")
    parser.add_argument("--shared", action="store_true",
                        help="time this checkout's calls after a second thread has used its "
                             "engine at once (tbcoll.transports.stream.turns), not --before's")
    args = parser.parse_args()
    bare = {poll: {n: [] for n in SIZES} for poll in (False, True)}
    ours = {c: {n: [] for n in SIZES} for c in ("all_reduce", "sendrecv")}
    before = {c: {n: [] for n in SIZES} for c in ours} if args.before else {}
    for _ in range(args.rounds):
        for n in SIZES:
            for poll, times in bare.items():
                times[n].append(bare_half_round_trip(n, args.iters, poll))
        for figures, checkout, shared in ((ours, None, args.shared),
                                          (before, args.before, False)):
            if figures:
                for key, t in tbcoll_times(args.iters, checkout, shared).items():
                    collective, n = key.split()
                    figures[collective][int(n)].append(t)
    print(f"# np=2 over loopback TCP, medians over {args.rounds} rounds, us")
    print("| size B | bare, blocking | bare, polling | tbcoll all_reduce | / blocking "
          "| / polling | tbcoll sendrecv (one way) | / blocking | / polling |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in SIZES:
        blocking, polling = (statistics.median(bare[poll][n]) for poll in (False, True))
        cells = [f"{n}", f"{blocking:.1f}", f"{polling:.1f}"]
        for collective in ("all_reduce", "sendrecv"):
            ours_n = statistics.median(ours[collective][n])
            cells += [f"{ours_n:.1f}", f"{ours_n / blocking:.2f}", f"{ours_n / polling:.2f}"]
        print(f"| {' | '.join(cells)} |")
    if before:
        print(f"\n# the same turns, tbcoll from {args.before} (before), us: medians [range]")
        print("| size B | all_reduce before | after | after / before "
              "| sendrecv before | after | after / before |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for n in SIZES:
            cells = [f"{n}"]
            for collective in ("all_reduce", "sendrecv"):
                old, new = before[collective][n], ours[collective][n]
                cells += [f"{statistics.median(old):.1f} [{min(old):.1f}-{max(old):.1f}]",
                          f"{statistics.median(new):.1f} [{min(new):.1f}-{max(new):.1f}]",
                          f"{statistics.median(new) / statistics.median(old):.2f}"]
            print(f"| {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
