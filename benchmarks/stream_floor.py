"""tbcoll's tcp all_reduce of large messages against bare loopback TCP streams.

    python benchmarks/stream_floor.py --rounds 5 [--size 16M] [--before /path/to/another/checkout]

In turns (A B A B ...): a bare one-way stream (one process sends SIZE bytes, the other
receives them into a preallocated buffer and answers one byte), a bare two-way exchange
(both send SIZE bytes and receive SIZE bytes at once, a thread sending while the main
thread receives: what an np=2 all_reduce's ranks do), both with tbcoll's socket settings
(TCP_NODELAY, 4 MiB buffers), then `tbrun -np 2 --backend tcp tbcoll-bench all_reduce` of
SIZE, out of place, with the table's algorithm (--before: that of another checkout too, in
the same turns). Prints GB/s (10^9 B/s of SIZE per call or transfer: all_reduce's algbw,
equal to its busbw at np=2) as medians over rounds, and tbcoll's over each bare figure
(issue 35's goal: >= 0.9x the two-way exchange).
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
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent
_BUFFER = 4 << 20  # tbcoll.transports.socket_mesh's socket buffers


def bare_gbps(nbytes: int, iters: int, both_ways: bool) -> float:
    """Median GB/s over iters transfers of nbytes between two processes."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        child = os.fork()
        if child == 0:
            try:
                with socket.create_connection(server.getsockname()[:2]) as sock:
                    _transfers(sock, nbytes, iters, both_ways, timed=False)
            finally:
                os._exit(0)
        sock, _ = server.accept()
    with sock:
        times = _transfers(sock, nbytes, iters, both_ways, timed=True)
    os.waitpid(child, 0)
    return nbytes / statistics.median(times) / 1e9


def _transfers(sock: socket.socket, nbytes: int, iters: int, both_ways: bool,
               timed: bool) -> list[float]:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    out, into, ack = bytearray(nbytes), memoryview(bytearray(nbytes)), bytearray(1)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        if both_ways:
            sender = threading.Thread(target=sock.sendall, args=(out,))
            sender.start()
            _receive(sock, into)
            sender.join()
        elif timed:
            sock.sendall(out)
            _receive(sock, memoryview(ack))
        else:
            _receive(sock, into)
            sock.sendall(ack)
        times.append(time.perf_counter() - start)
    return times


def _receive(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        got += sock.recv_into(view[got:])


def tbcoll_gbps(nbytes: int, iters: int, checkout: str | None = None) -> float:
    """tbcoll-bench's all_reduce algbw (GB/s) over tcp at np=2, out of place (checkout: the
    tbcoll to import, else the one this Python finds)."""
    env = {**os.environ, "PYTHONPATH": checkout} if checkout else None
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.json"
        subprocess.run([str(BIN / "tbrun"), "-np", "2", "--backend", "tcp",
                        str(BIN / "tbcoll-bench"), "all_reduce", "-b", str(nbytes), "-e",
                        str(nbytes), "-n", str(iters), "-r", "3", "--inplace", "no",
                        "--json", str(rows)], check=True, capture_output=True, env=env)
        (row,) = json.loads(rows.read_text())
        return row["algbw"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--iters", type=int, default=10)
    parser.add_argument("--size", default="16M", help="bytes (K and M: binary units)")
    parser.add_argument("--before", help="another checkout's tbcoll, timed in the same turns")
    args = parser.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20}
    size = int(args.size[:-1]) * units[args.size[-1]] if args.size[-1] in units else int(args.size)
    figures: dict[str, list[float]] = {"one-way": [], "two-way": [], "tbcoll": []}
    before: list[float] = []
    for _ in range(args.rounds):
        figures["one-way"].append(bare_gbps(size, args.iters, both_ways=False))
        figures["two-way"].append(bare_gbps(size, args.iters, both_ways=True))
        figures["tbcoll"].append(tbcoll_gbps(size, args.iters))
        if args.before:
            before.append(tbcoll_gbps(size, args.iters, args.before))
    median = {name: statistics.median(values) for name, values in figures.items()}
    print(f"# {size} B over loopback TCP, np=2, GB/s: medians over {args.rounds} rounds [range]")
    print("| bare one-way stream | bare two-way exchange | tbcoll all_reduce (algbw) "
          "| tbcoll / one-way | tbcoll / two-way |")
    print("|---:|---:|---:|---:|---:|")
    cells = [f"{median[name]:.2f} [{min(values):.2f}-{max(values):.2f}]"
             for name, values in figures.items()]
    cells += [f"{median['tbcoll'] / median['one-way']:.2f}",
              f"{median['tbcoll'] / median['two-way']:.2f}"]
    print(f"| {' | '.join(cells)} |")
    if before:
        old = statistics.median(before)
        print(f"\n# tbcoll from {args.before} (before), the same turns: {old:.2f} "
              f"[{min(before):.2f}-{max(before):.2f}] GB/s; after / before "
              f"{median['tbcoll'] / old:.2f}; before / two-way {old / median['two-way']:.2f}")


if __name__ == "__main__":
    main()
