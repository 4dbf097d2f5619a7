"""tbcoll's rdma backend against perftest's floor on the same device, A B A B, in one run.

Run inside the RDMA lab (Soft-RoCE in a VM, tests/rdmalab.py), from the repository root:

    python -m tests.rdmalab -- python benchmarks/rdma_floor.py --rounds 2

A: perftest between two processes on the device: ib_write_lat (8 B, its t_avg: one way; and
   ib_send_lat, the SEND/RECV that tbcoll uses) and
   ib_write_bw (16 MiB, its average MB/s), UC queue pairs as tbcoll's default.
B: tbcoll over --backend rdma at np=2: tbcoll-bench all_reduce of 8 B (median time) and of
   16 MiB (median bus bandwidth, 2(n-1)/n x algbw = algbw at np=2), out of place.
Each round runs A then B; the table gives every round and the medians, and the ratios of
the goals (issue 23): 8 B all_reduce <= 2.0x ib_write_lat one-way; 16 MiB busbw >= 0.7x
ib_write_bw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PORTS = iter(range(18571, 18700))  # a fresh port per run: a server's port lingers


def perftest(tool: str, size: int, iters: int, device: str, address: str) -> float:
    """Run a perftest server and client on `device`; the client's result (us or MB/s)."""
    common = [tool, "-d", device, "-x", "1", "-c", "UC", "-s", str(size), "-n", str(iters),
              "-p", str(next(PORTS))]
    server = subprocess.Popen(common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(60):
            client = subprocess.run([*common, address], capture_output=True, text=True,
                                    timeout=120)
            if client.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{tool} did not connect: {client.stdout}{client.stderr}")
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    for line in client.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0] == str(size) and fields[1].isdigit():
            # ib_write_lat: #bytes #iter t_min t_max t_typical t_avg ...; ib_write_bw:
            # #bytes #iter BW_peak BW_average MsgRate
            return float(fields[5] if tool.endswith("_lat") else fields[3])
    raise RuntimeError(f"no result line in {tool}'s output:\n{client.stdout}")


def tbcoll(size: str, iters: int, repeats: int) -> dict:
    """tbcoll-bench all_reduce at np=2 over rdma; its one row."""
    with tempfile.TemporaryDirectory() as folder:
        rows = Path(folder) / "rows.json"
        argv = [str(BIN / "tbrun"), "-np", "2", "--backend", "rdma", str(BIN / "tbcoll-bench"),
                "all_reduce", "-b", size, "-e", size, "-n", str(iters), "-r", str(repeats),
                "--inplace", "no", "--json", str(rows)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{p.stdout}{p.stderr}")
        (row,) = json.loads(rows.read_text())
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    device = os.environ.get("RDMALAB_DEVICE", "rxe0")
    address = os.environ.get("RDMALAB_ADDRESS", "10.99.0.1")
    results: dict[str, list[float]] = {k: [] for k in ("lat", "send", "bw", "small", "busbw")}
    for round_ in range(1, args.rounds + 1):
        results["lat"].append(perftest("ib_write_lat", 8, 1000, device, address))
        results["send"].append(perftest("ib_send_lat", 8, 1000, device, address))
        results["bw"].append(perftest("ib_write_bw", 16 << 20, 20, device, address))
        small = tbcoll("8", 200, 5)
        large = tbcoll("16M", 5, 3)
        results["small"].append(small["time_us"])
        results["busbw"].append(large["busbw"])
        print(f"round {round_}: A ib_write_lat 8 B {results['lat'][-1]:.2f} us one-way "
              f"(ib_send_lat {results['send'][-1]:.2f}), "
              f"ib_write_bw 16 MiB {results['bw'][-1]:.1f} MB/s | B tbcoll rdma np=2 "
              f"all_reduce 8 B {small['time_us']:.2f} us, 16 MiB busbw "
              f"{large['busbw']:.3f} GB/s (#wrong {small['wrong']}, {large['wrong']})",
              flush=True)
    lat, bw = statistics.median(results["lat"]), statistics.median(results["bw"])
    small, busbw = statistics.median(results["small"]), statistics.median(results["busbw"])
    print(f"medians: ib_write_lat {lat:.2f} us, tbcoll 8 B all_reduce {small:.2f} us: "
          f"{small / lat:.2f}x (goal <= 2.0x)")
    print(f"medians: ib_write_bw {bw:.1f} MB/s, tbcoll 16 MiB busbw {busbw * 1000:.1f} MB/s: "
          f"{busbw * 1000 / bw:.2f}x (goal >= 0.7x)")


if __name__ == "__main__":
    main()
