"""The floor under an RDMA transport, measured in the RDMA lab (Soft-RoCE in a VM), in one run.

    python benchmarks/rdma_floor.py --rounds 3                 # as root, after `make rdma-lab`
    python benchmarks/rdma_floor.py --rounds 3 --systems ib_write_lat,ib_write_bw,tbcoll-rdma

Boots the lab once, then in each round runs every system in turns (A B C .. then reversed),
each as its own command in the VM, at 8 B and 16 MB:
  ib_write_lat  perftest, RC, rxe0's IPv4-mapped GID (-x 1): one-way time (t_typical)
  ib_write_bw   perftest, same device: bandwidth (BW average; perftest's MB are 2^20 B)
  tcp           a bare Python socket ping-pong to the veth's address (benchmarks/socket_floor.py):
                half a round trip, the receiver polling (MSG_DONTWAIT) and blocking in recv
  mpich-tcp     mpi4py all_reduce under mpiexec, MPICH's UCX over TCP on the veth's address
  mpich-ud      the same over rxe0 with UCX's ud_verbs (its rc_verbs did not run on rxe here)
  tbcoll-tcp    tbcoll all_reduce, `tbrun -np 2 --backend tcp` (every algorithm; best shown)
  tbcoll-rdma   the same with --backend rdma
and prints the medians over rounds, with the issue's two goals for all_reduce at np=2: 8 B
within 2.0x ib_write_lat's one-way time, 16 MB bus bandwidth at least 0.7x ib_write_bw's.

All of it is one guest kernel: traffic to the veth's own address (tcp, MPICH) goes through the
kernel's loopback path, and rxe0 sends its packets to itself through rxe's loopback, never on
the wire. Emulation (QEMU TCG) makes everything ~10x slower than the host and noisy: compare
systems with each other, as ratios, not with other machines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # socket_floor, compare; tests.harness.rdmalab

SIZES = (8, 16 << 20)
DEFAULT_SYSTEMS = "ib_write_lat,ib_write_bw,tcp,mpich-tcp,mpich-ud,tbcoll-tcp,tbcoll-rdma"
PORT = 18571  # perftest's; a port apart from test_rdma_lab's
# the environment of MPICH's ranks per system: UCX's transport and device
MPICH_ENV = {"mpich-tcp": {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "rxelab0"},
             "mpich-ud": {"UCX_TLS": "ud_verbs,self", "UCX_NET_DEVICES": "rxe0:1"}}
BACKEND = {"tbcoll-tcp": "tcp", "tbcoll-rdma": "rdma"}


def iters_for(nbytes: int) -> int:
    """Iterations per measurement: many at 8 B, a few at 16 MB (~0.3 s each here)."""
    return 1000 if nbytes <= 4096 else 5


# --- inside the lab ---------------------------------------------------------------------------

def perftest(tool: str, nbytes: int) -> list[str]:
    """Run perftest's tool as server and client on $RDMALAB_DEVICE; the client's result line."""
    argv = [tool, "-d", os.environ["RDMALAB_DEVICE"], "-x", "1", "-s", str(nbytes),
            "-n", str(iters_for(nbytes)), "-p", str(PORT)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        for _ in range(60):  # until the server listens
            client = subprocess.run([*argv, os.environ["RDMALAB_ADDRESS"]], capture_output=True,
                                    text=True, timeout=300)
            if client.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"{tool} -s {nbytes}: {client.stderr.strip()}")
    finally:
        server.wait(timeout=300)
    for line in client.stdout.splitlines():
        fields = line.split()
        if fields[:1] == [str(nbytes)] and len(fields) > 4:
            return fields
    raise SystemExit(f"{tool}: no result line in:\n{client.stdout}")


def measure_perftest(tool: str) -> dict:
    result = {}
    for n in SIZES:
        for _ in range(3):  # under emulation perftest once printed t_typical "inf": run again
            fields = perftest(tool, n)
            if tool == "ib_write_lat":  # #bytes #iter t_min t_max t_typical t_avg ...
                figure = {"time_us": float(fields[4])}
            else:  # #bytes #iter BW-peak BW-average MsgRate
                gbps = float(fields[3]) * 2**20 / 1e9
                figure = {"time_us": n / gbps / 1e3 if gbps else math.inf, "gbps": gbps}
            if math.isfinite(figure["time_us"]):
                result[n] = figure
                break
    return result


def measure_tcp() -> dict:
    from socket_floor import bare_half_round_trip

    host = os.environ["RDMALAB_ADDRESS"]
    return {n: {"time_us": bare_half_round_trip(n, iters_for(n), poll=True, host=host),
                "blocking_us": bare_half_round_trip(n, iters_for(n), poll=False, host=host)}
            for n in SIZES}


def measure_all_reduce(system: str) -> dict:
    """all_reduce at np=2 under mpiexec or tbrun; this file's --rank-of worker does the calls."""
    me = [sys.executable, __file__, "--rank-of", system]
    bin_dir = Path(sys.executable).parent
    if system in BACKEND:
        argv = [str(bin_dir / "tbrun"), "-np", "2", "--no-tag-output", "--backend",
                BACKEND[system], *me]
    else:
        argv = [str(bin_dir / "mpiexec"), "-n", "2", *me]
    env = {**os.environ, **MPICH_ENV.get(system, {})}
    env.pop("TBCOLL_ALGO", None)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    rows = [json.loads(line[5:]) for line in p.stdout.splitlines() if line.startswith("ROWS ")]
    if p.returncode or not rows:
        raise SystemExit(f"{system} failed ({p.returncode}):\n{p.stdout[-2000:]}\n"
                         f"{p.stderr[-2000:]}")
    result = {}
    for row in rows[0]:
        if row["wrong"]:
            raise SystemExit(f"{system} {row['algorithm']}: {row['wrong']} wrong elements at "
                             f"{row['size']} B")
        best = result.get(row["size"])
        if best is None or row["time_us"] < best["time_us"]:
            result[row["size"]] = {"time_us": row["time_us"], "gbps": row["busbw"],
                                   "algorithm": row["algorithm"]}
    return result


def rank_worker(system: str) -> None:
    """One rank of measure_all_reduce's job: every size, with its own iteration count."""
    import numpy as np

    from tbcoll.bench.descriptors import DESCRIPTORS
    from tbcoll.bench.harness import sweep_interleaved

    desc = DESCRIPTORS["all_reduce"]
    if system in BACKEND:
        import tbcoll

        comm = tbcoll.init(BACKEND[system])
        contenders = [(system, comm, a) for a in ["default", *comm.algorithms("all_reduce")]]
    else:
        from compare import MpiPeer

        comm = MpiPeer()
        contenders = [(system, comm, "native")]
    rows = []
    for n in SIZES:
        rows += sweep_interleaved(contenders, desc, [n], np.dtype(np.float32), "sum", [False],
                                  iters_for(n) // 5 or 1, warmup=2)
    if comm.rank == 0:
        print("ROWS " + json.dumps([r.as_dict() for r in rows]), flush=True)


def in_lab(system: str) -> None:
    """Measure one system (in the VM) and print its figures as one RESULT line."""
    if system.startswith("ib_write"):
        result = measure_perftest(system)
    elif system == "tcp":
        result = measure_tcp()
    else:
        result = measure_all_reduce(system)
    print("RESULT " + json.dumps(result), flush=True)


# --- on the host -----------------------------------------------------------------------------

def run_rounds(systems: list[str], rounds: int) -> dict:
    """Boot the lab, run every system once per round in turns; figures per system and size."""
    from tests.harness.rdmalab import Lab, why_not_available

    reason = why_not_available()
    if reason:
        raise SystemExit(f"the RDMA lab cannot run here: {reason}")
    figures: dict = {s: {n: [] for n in SIZES} for s in systems}
    with Lab() as lab:
        print(f"# lab: {lab.device} on {lab.netdev} ({lab.address}), ready in "
              f"{lab.boot_seconds:.1f} s", flush=True)
        for round_ in range(rounds):
            for system in systems if round_ % 2 == 0 else reversed(systems):
                started = time.monotonic()
                p = lab.run([sys.executable, __file__, "--in-lab", system], timeout=900)
                lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
                if p.returncode or not lines:
                    raise SystemExit(f"{system} failed in the lab ({p.returncode}):\n"
                                     f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
                for size, figure in json.loads(lines[0][7:]).items():
                    figures[system][int(size)].append(figure)
                print(f"# round {round_ + 1}: {system} in {time.monotonic() - started:.0f} s",
                      flush=True)
    return figures


def median(figures: list[dict], key: str) -> float | None:
    values = [f[key] for f in figures if key in f]
    return statistics.median(values) if values else None


def report(figures: dict, rounds: int) -> str:
    lat = {n: median(figures.get("ib_write_lat", {}).get(n, []), "time_us") for n in SIZES}
    bw = {n: median(figures.get("ib_write_bw", {}).get(n, []), "gbps") for n in SIZES}
    lines = [f"# medians over {rounds} rounds; time in us (one way for perftest and tcp, per "
             "call for all_reduce), GB/s (bus bandwidth for all_reduce)",
             "| system | 8 B time | 16 MB time | 16 MB GB/s | 8 B / ib_write_lat "
             "| 16 MB GB/s / ib_write_bw |", "|---|---:|---:|---:|---:|---:|"]

    def cell(value: float | None, form: str = "{:.1f}") -> str:
        return "" if value is None else form.format(value)

    for system, by_size in figures.items():
        small, large = by_size[SIZES[0]], by_size[SIZES[1]]
        t_small, t_large = median(small, "time_us"), median(large, "time_us")
        gbps = median(large, "gbps")
        if gbps is None and t_large:
            gbps = SIZES[1] / t_large / 1e3
        names = [system] + ([f"{system} (blocking)"] if system == "tcp" else [])
        for name in names:
            if name.endswith("(blocking)"):
                t_small, t_large = median(small, "blocking_us"), median(large, "blocking_us")
                gbps = SIZES[1] / t_large / 1e3
            ratio_small = t_small / lat[SIZES[0]] if lat[SIZES[0]] and t_small else None
            ratio_large = gbps / bw[SIZES[1]] if bw[SIZES[1]] and gbps else None
            lines.append(f"| {name} | {cell(t_small)} | {cell(t_large, '{:.0f}')} | "
                         f"{cell(gbps, '{:.3f}')} | {cell(ratio_small, '{:.2f}')} | "
                         f"{cell(ratio_large, '{:.2f}')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS,
                        help=f"comma-separated, in turn order (default {DEFAULT_SYSTEMS}; "
                        "also tbcoll-rdma)")
    parser.add_argument("--json", type=Path, help="write every figure of every round")
    parser.add_argument("--in-lab", help=argparse.SUPPRESS)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        rank_worker(args.rank_of)
    elif args.in_lab:
        in_lab(args.in_lab)
    else:
        systems = args.systems.split(",")
        figures = run_rounds(systems, args.rounds)
        print(report(figures, args.rounds))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
