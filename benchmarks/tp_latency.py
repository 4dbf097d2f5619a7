"""Tokens/s of tensor- and pipeline-parallel decoding against link latency, on namespace hosts
whose cables have an emulated one-way latency (TBCOLL_LINK_DELAY_US), beside the planner's
prediction (tbcoll.bench.planner). Needs root.

    sudo python benchmarks/tp_latency.py --hosts 1,2,4 --delays 0,4,30,300 --plot tp.png

Hosts are network namespaces (tests/harness/netns.py), each rank one host, joined by veth
cables; every rank gets one BLAS thread, so a host is one core (the hosts share this machine's
cores and memory: the planner is told the bandwidth each host achieved). The decoder is
tbcoll.tp.llama in benchmarks/tp_decode.py's worker (tp: two all_reduce per layer per token; pp:
the layers split in stages, send/recv between them), on a random checkpoint of a Llama shape: by
default TinyLlama's proportions at a quarter of its width (hidden 512, 8 layers), which on one
core here takes about what TinyLlama takes on an M3 Ultra per layer, so that the links matter as
much as they do there; --shape tinyllama for the real width. Every run's tokens must equal the
one-host run's.

First the emulation's accuracy: an 8 B ping-pong between two hosts at each delay, and the time
of an all_reduce of the hidden state on each host count. Then per (hosts, delay, mode) the
median over rounds (every row once a round, in turns) of tokens/s and communication share, and
the planner's tokens/s, given: the memory bandwidth each host achieved (TP: bytes of weights
per rank / compute time per token of the delay-0 TP run on that many hosts, which share this
machine's memory; PP, whose stages take turns: the one-host run's), the ping-pong's one-way
time as alpha, and the measured all_reduce. The delay-0 TP rows calibrate compute; every other
row checks the planner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the cluster is the test suite's (tests/harness/netns.py)

from tbcoll.bench.planner import Link, Shape, plan  # noqa: E402
from tests.harness.netns import Cluster, why_not_available  # noqa: E402

BIN = Path(sys.executable).parent
SHAPES = {  # Llama shapes: TinyLlama-1.1B's, and the same proportions at a quarter width
    "tinyllama": dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, num_hidden_layers=4),
    "quarter": dict(hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                    num_key_value_heads=4, vocab_size=32000, num_hidden_layers=8),
}
PROBE = """
import statistics, sys, time
import numpy as np
import tbcoll
comm = tbcoll.init()
x, one_way = np.zeros(2, np.float32), []
for _ in range(300):
    started = time.perf_counter()
    if comm.rank == 0:
        comm.send(x, 1); comm.recv(x, 1)
    elif comm.rank == 1:
        comm.recv(x, 0); comm.send(x, 0)
    one_way.append((time.perf_counter() - started) / 2)
hidden = np.ones(int(sys.argv[1]), np.float32)
for _ in range(50):
    comm.all_reduce(hidden)
started = time.perf_counter()
for _ in range(300):  # back to back, as a decoder's are: no barrier to skew the ranks
    comm.all_reduce(hidden)
if comm.rank == 0:
    print("ONE_WAY", statistics.median(one_way[50:]) * 1e6)
    print("ALL_REDUCE", (time.perf_counter() - started) / 300 * 1e6)
"""


class Runner:
    def __init__(self, cluster: Cluster, folder: Path) -> None:
        self.cluster, self.folder = cluster, folder

    def hostfile(self, hosts: int) -> Path:
        """The first `hosts` hosts with their cables, one rank each."""
        c = self.cluster
        path = self.folder / f"hosts{hosts}.json"
        path.write_text(json.dumps({"hosts": [
            {"ssh": c.address(i), "ips": [c.address(i)],
             "links": [None if j == i else c.link(i, j) for j in range(hosts)]}
            for i in range(hosts)]}))
        return path

    def tbrun(self, hosts: int, delay_us: float, program: list[str]) -> str:
        where = (["-np", "1"] if hosts == 1 else
                 ["--ssh", self.cluster.ssh, "--hostfile", str(self.hostfile(hosts))])
        argv = self.cluster.exec_argv(
            0, str(BIN / "tbrun"), *where, "--backend", "tcp", "--no-tag-output",
            "-x", f"TBCOLL_LINK_DELAY_US={delay_us:g}", "-x", "OMP_NUM_THREADS=1",
            "-x", "OPENBLAS_NUM_THREADS=1", "-x", "MKL_NUM_THREADS=1", sys.executable, *program)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
        if p.returncode:
            raise SystemExit(f"{' '.join(program)} on {hosts} hosts at {delay_us} us failed:\n"
                             f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,4", help="host counts (default %(default)s)")
    parser.add_argument("--delays", default="0,4,30,300",
                        help="one-way latencies added per cable, us (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3, help="runs of every row, in turns; "
                        "the table gives each row's median (default %(default)s)")
    parser.add_argument("--shape", choices=SHAPES, default="quarter")
    parser.add_argument("--layers", type=int, help="override the shape's layer count")
    parser.add_argument("--plot", metavar="PNG")
    parser.add_argument("--json", metavar="FILE", help="write every row")
    args = parser.parse_args()
    hosts_list = [int(n) for n in args.hosts.split(",")]
    delays = [float(d) for d in args.delays.split(",")]
    if reason := why_not_available():
        raise SystemExit(f"cannot build the cluster: {reason}")
    config = {**SHAPES[args.shape], **({"num_hidden_layers": args.layers} if args.layers else {})}
    from tbcoll.tp.llama import LlamaConfig, write_random_checkpoint

    shape = Shape.from_config(config, 4)  # float32, as tbcoll.tp.llama computes
    rows, accuracy = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        checkpoint = folder / "model"
        checkpoint.mkdir()
        write_random_checkpoint(checkpoint, LlamaConfig(**config), seed=0)
        (folder / "probe.py").write_text(PROBE)
        cluster = Cluster("tbcl", folder, max(max(hosts_list), 2))
        try:
            cluster.start()
            runner = Runner(cluster, folder)
            for hosts in [n for n in hosts_list if n > 1]:
                for delay in delays:
                    out = runner.tbrun(hosts, delay, [str(folder / "probe.py"), str(shape.hidden)])
                    accuracy[hosts, delay] = [float(out.split(name)[1].split()[0])
                                              for name in ("ONE_WAY", "ALL_REDUCE")]
            worker = [str(REPO / "benchmarks" / "tp_decode.py"), "--worker", str(checkpoint)]
            runs = [(hosts, delay, mode) for hosts in hosts_list
                    for delay in (delays if hosts > 1 else delays[:1])
                    for mode in (("tp", "pp") if hosts > 1 else ("tp",))]
            results: dict[tuple, list[dict]] = {run: [] for run in runs}
            for _ in range(args.rounds):  # every row once a round, in turns
                for hosts, delay, mode in runs:
                    out = runner.tbrun(hosts, delay, [*worker, mode, str(args.tokens)])
                    results[hosts, delay, mode].append(
                        json.loads(out.split("RESULT ", 1)[1].splitlines()[0]))
            for (hosts, delay, _), seen in results.items():
                middle = sorted(seen, key=lambda r: r["tokens_per_s"])[len(seen) // 2]
                rows.append({**middle, "hosts": hosts, "delay_us": delay,
                             "same_tokens": all(r["tokens"] == seen[0]["tokens"] for r in seen),
                             "rounds": [r["tokens_per_s"] for r in seen]})
        finally:
            cluster.stop()
    report(rows, accuracy, shape, args)


def report(rows: list[dict], accuracy: dict[tuple[int, float], list[float]], shape: Shape,
           args: argparse.Namespace) -> None:
    base = rows[0]
    print("# emulated link, measured between namespace hosts (us): 8 B one way (ranks 0-1, "
          f"median), all_reduce of the hidden state ({shape.hidden * 4} B, mean of 300 in a row)")
    print("| hosts | TBCOLL_LINK_DELAY_US | one way | one way - at 0 | all_reduce |")
    print("|---:|---:|---:|---:|---:|")
    for (hosts, delay), (one_way, reduce) in accuracy.items():
        print(f"| {hosts} | {delay:g} | {one_way:.1f} | "
              f"{one_way - accuracy[hosts, min(d for _, d in accuracy)][0]:.1f} | {reduce:.1f} |")
    print(f"\n# greedy decoding, {shape.layers} layers, hidden {shape.hidden}, float32 "
          f"({shape.weight_bytes / 1e6:.0f} MB), {args.tokens} tokens; one host = one core")
    print("| hosts | delay us | mode | tokens/s | speed-up | comm share | planner GB/s/host "
          "| planner tokens/s | planner error | same tokens |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    worst = 0.0
    for row in rows:
        n = row["hosts"]
        bandwidth = achieved(rows, n if row["mode"] == "tp" else 1, shape)
        one_way, reduce = accuracy.get((n, row["delay_us"]), (0.0, 0.0))
        link = Link(one_way * 1e-6, 1 / 1.7e9, reduce * 1e-6)  # veth moves ~1.7 GB/s
        predicted = next(p for p in plan(shape, n, bandwidth, link)
                         if p.mode == row["mode"]).tokens_per_s
        error = predicted / row["tokens_per_s"] - 1
        calibration = row["mode"] == "tp" and row["delay_us"] == min(r["delay_us"] for r in rows)
        if not calibration:
            worst = max(worst, abs(error))
        row["planner_tokens_per_s"] = predicted
        print(f"| {n} | {row['delay_us']:g} | {row['mode']} | {row['tokens_per_s']:.1f} | "
              f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x | {row['comm_share']:.0%} | "
              f"{bandwidth / 1e9:.1f} | {predicted:.1f} | "
              f"{'(calibration)' if calibration else f'{error:+.0%}'} | "
              f"{row['same_tokens'] and row['tokens'] == base['tokens']} |")
    print(f"\nplanner's worst error outside the calibration rows: {worst:.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"probe": [[*key, *value] for key, value in
                                                         accuracy.items()], "rows": rows}))
    if args.plot:
        plot(rows, args.plot)


def achieved(rows: list[dict], hosts: int, shape: Shape) -> float:
    """Each host's memory bandwidth in the first TP run on `hosts` hosts: the bytes of weights
    it read per token over the time per token it did not spend in collectives."""
    row = next(r for r in rows if r["hosts"] == hosts and r["mode"] == "tp")
    compute = row["ms_per_token"] * 1e-3 * (1 - row["comm_share"])
    return shape.weight_bytes / hosts / compute


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for hosts in sorted({r["hosts"] for r in rows if r["hosts"] > 1}):
        for mode, style in (("tp", "-o"), ("pp", "--s")):
            mine = sorted((r for r in rows if r["hosts"] == hosts and r["mode"] == mode),
                          key=lambda r: r["delay_us"])
            ax.plot([max(r["delay_us"], 1) for r in mine], [r["tokens_per_s"] for r in mine],
                    style, label=f"{mode.upper()}, {hosts} hosts")
    ax.axhline(rows[0]["tokens_per_s"], color="grey", linestyle=":", label="1 host")
    ax.set_xscale("log")
    ax.set_xlabel("emulated one-way link latency, us (0 plotted at 1)")
    ax.set_ylabel("tokens/s")
    ax.set_title("Greedy decoding over namespace hosts: TP against PP")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
