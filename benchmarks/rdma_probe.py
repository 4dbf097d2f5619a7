"""Where an rdma 8 B all_reduce's time goes, without tbrun, pytest or the Communicator.

    python benchmarks/rdma_probe.py --lab 2        # as root: boots the RDMA lab, A B .. B A
    python -m tests.harness.rdmalab -- python benchmarks/rdma_probe.py    # one system, in it

Two processes (forked here) open a tbcoll.transports.rdma._verbs.Fabric each on $RDMALAB_DEVICE,
exchange queue-pair info through pipes, and then time, in turns (A B A B ...), by default:
  exchange-ws  a bare two-sided 8 B exchange in C (both SEND, then poll for the peer's;
               Fabric._probe): the floor under the mesh
  mesh-c       the C mesh all_reduce of 8 B (mesh_call) in a C loop (Fabric._probe)
  mesh-raw     the same, one Fabric.mesh call from a Python loop each
  comm         nothing of tbcoll.init's, only what RdmaNative._mesh adds: the same through
               the Python wrapper a communicator calls (RdmaNative.direct_all_reduce)
(--systems names others too: noop, mesh with a deadline, mesh-c1, the other _probe patterns.)
Each figure is the median per call over batches, on rank 0 (both ranks call alike).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402


def rank_main(rank: int, conn, between, args) -> None:
    try:
        measure(rank, conn, between, args)
    except BaseException as e:
        conn.send_bytes(json.dumps({"error": f"rank {rank}: {e!r}"}).encode())
        raise


def measure(rank: int, conn, between, args) -> None:
    from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
    from tbcoll.transports.rdma import _verbs
    from tbcoll.transports.rdma.transport import RdmaNative
    from tbcoll.transports.stream.turns import Turns

    device = os.environ.get("RDMALAB_DEVICE", "rxe0")
    names = [None if k == rank else device for k in range(2)]
    fabric = _verbs.Fabric(rank=rank, size=2, devices=names, rc=False, gid_index=-1,
                           library=None, spin=args.spin)
    peer = 1 - rank
    conn.send_bytes(fabric.info(peer))
    fabric.connect(peer, conn.recv_bytes())
    conn.send_bytes(b"ready")
    conn.recv_bytes()  # both are at RTS: nothing sent now is dropped

    class NoWatch:
        def loss(self):
            return None

    native = RdmaNative(fabric, rank, 2, NoWatch(), 60.0, Turns())
    x = np.full(2, rank + 1, np.float32)
    out = np.empty_like(x)
    dtype, op = DTYPE_CODES[x.dtype], OP_CODES["sum"]

    def mesh(n: int) -> None:
        for _ in range(n):
            mesh_call(fabric, x, out, dtype, op)

    def comm(n: int) -> None:
        for _ in range(n):
            native.direct_all_reduce(x, "sum", 0, out)

    extra: dict = {}

    def probe(flags: int, name: str):
        def run(n: int) -> None:
            seconds, empty, send_wait = fabric._probe(n, flags)
            extra.setdefault(name, []).append((empty / n, send_wait / n * 1e6))
        return run

    def mesh_raw(n: int) -> None:  # Fabric.mesh alone in the loop (no wrapper, 1 s budget)
        for _ in range(n):
            fabric.mesh(_verbs.MESH_ALL_REDUCE, x, out, dtype, op, 1234, 1.0)

    def mesh_c1(n: int) -> None:  # one C mesh call per Python call, no buffers taken
        for _ in range(n):
            fabric._probe(1, 8)

    def noop(n: int) -> None:  # a Python loop calling into the Fabric: the call's own cost
        for _ in range(n):
            fabric.lost(peer)

    systems = {"noop": noop, "mesh": mesh, "comm": comm,
               "pingpong": probe(0, "pingpong"), "pingpong-ws": probe(2, "pingpong-ws"),
               "exchange": probe(1, "exchange"), "exchange-ws": probe(3, "exchange-ws"),
               "exchange-y": probe(5, "exchange-y"), "exchange-wsy": probe(7, "exchange-wsy"),
               "mesh-c": probe(8, "mesh-c"), "mesh-raw": mesh_raw, "mesh-c1": mesh_c1}
    order = [s for s in args.systems.split(",") if s in systems]
    times = {s: [] for s in order}
    mesh(20)
    for batch in range(args.batches):
        for name in order if batch % 2 == 0 else reversed(order):
            # both ranks leave the previous system before either starts the next (a probe
            # message that found the peer still in a mesh call would count as its block)
            between.send_bytes(b"x")
            between.recv_bytes()
            start = time.perf_counter()
            systems[name](args.iters)
            times[name].append((time.perf_counter() - start) / args.iters * 1e6)
    assert out[0] == 3.0, out
    fabric.close()
    conn.send_bytes(json.dumps({"times": times, "extra": extra}).encode())


def mesh_call(fabric, x, out, dtype: int, op: int) -> None:
    """One Fabric.mesh all_reduce, waited for in slices; an error, not a hang, where the
    peer is lost, made another call, or sent nothing for 30 s (UC drops a message silently)."""
    from tbcoll.transports.rdma import _verbs

    deadline = time.monotonic() + 30
    while (result := fabric.mesh(_verbs.MESH_ALL_REDUCE, x, out, dtype, op, 1234, 0.05)) == -1:
        if time.monotonic() > deadline:
            raise TimeoutError("Fabric.mesh: nothing from the peer for 30 s (a lost message?)")
    if result != 0:
        raise RuntimeError(f"Fabric.mesh returned {result} (-2: peer lost; k+1: rank k's call "
                           f"differs)")


def under_tbrun(args) -> None:
    """`tbrun -np 2 --backend rdma python benchmarks/rdma_probe.py --tbcoll`: the Communicator's
    8 B all_reduce with out=, as a user calls it, timed the same way."""
    import threading

    import tbcoll
    from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES

    comm = tbcoll.init()
    x = np.full(2, comm.rank + 1, np.float32)
    out = np.empty_like(x)
    native = comm._group.native
    fabric = native._fabric
    dtype, op = DTYPE_CODES[x.dtype], OP_CODES["sum"]

    def tbcoll_(n: int) -> None:
        for _ in range(n):
            comm.all_reduce(x, out=out)

    def direct(n: int) -> None:
        for _ in range(n):
            native.direct_all_reduce(x, "sum", 0, out)

    def mesh(n: int) -> None:
        for _ in range(n):
            mesh_call(fabric, x, out, dtype, op)

    from tbcoll.collectives import ENTRIES
    from tbcoll.comm.routes import gated

    entry = ENTRIES["all_reduce"]
    first = gated(comm, entry, native.direct_all_reduce)

    def quick(n: int) -> None:
        """comm.all_reduce had its table let it take the one-call path first, as shm's does
        (tbcoll.comm.routes takes it as a whole only where the table says native at every size;
        rdma's says native up to 64 KiB, exactly where direct_all_reduce takes a call, and
        returns None above)."""
        kept, comm._first_all_reduce = comm._first_all_reduce, first
        try:
            tbcoll_(n)
        finally:
            comm._first_all_reduce = kept

    from tbcoll.collectives.base import KNOWN_DTYPES
    from tbcoll.core.dtypes import OPS

    def quickly(n: int) -> None:  # the route's first step, without all_reduce's route
        for _ in range(n):
            first(x, "sum", out)

    def checks(n: int) -> None:  # all_reduce's checks for the quick path alone, then direct
        quick_path, op, algorithm = native.direct_all_reduce, "sum", None
        for _ in range(n):
            if (type(x) is np.ndarray and algorithm is None and quick_path is not None
                    and id(dtype := x.dtype) in KNOWN_DTYPES and op in OPS and (
                        type(out) is np.ndarray and out.dtype is dtype
                        and out.shape == x.shape and out.flags.carray)):
                quick_path(x, op, -1, out)

    systems = {"tbcoll": tbcoll_, "tbcoll-quick": quick, "quickly": quickly,
               "checks+direct": checks, "direct": direct, "mesh": mesh}
    times: dict = {name: [] for name in systems}
    tbcoll_(20)
    for batch in range(args.batches):
        for name in systems if batch % 2 == 0 else reversed(systems):
            comm.barrier()
            start = time.perf_counter()
            systems[name](args.iters)
            times[name].append((time.perf_counter() - start) / args.iters * 1e6)
    assert out[0] == 3.0, out
    if comm.rank == 0:
        print("threads:", [t.name for t in threading.enumerate()],
              "route's first step:", comm._first_all_reduce is not None)
        for name, values in times.items():
            print(f"tbrun {name:12s} median {statistics.median(values):8.1f} us per call "
                  f"(batches: {', '.join(f'{v:.1f}' for v in values)})")
    comm.close()


def perftest(tool: str, port: int) -> list[str]:
    """A shell command running perftest's tool (UC, 8 B) as server and client in the lab."""
    argv = f"{tool} -d $RDMALAB_DEVICE -x 1 -c UC -s 8 -n 2000 -p {port}"
    return ["sh", "-c", f"{argv} >/dev/null 2>&1 & sleep 3; {argv} $RDMALAB_ADDRESS; wait"]


def in_turns(rounds: int, iters: int, batches: int) -> None:
    """Boot the lab once; per round run perftest, this probe and its tbrun mode in turns."""
    from tests.harness.rdmalab import Lab

    bin_dir = Path(sys.executable).parent
    me = [sys.executable, str(Path(__file__).resolve()), "--iters", str(iters),
          "--batches", str(batches)]
    systems = {"ib_write_lat": lambda r: perftest("ib_write_lat", 18600 + r),
               "ib_send_lat": lambda r: perftest("ib_send_lat", 18620 + r),
               "probe": lambda r: me,
               "tbcoll": lambda r: [str(bin_dir / "tbrun"), "-np", "2", "--backend", "rdma",
                                    *me, "--tbcoll"]}
    with Lab() as lab:
        print(f"# lab ready in {lab.boot_seconds:.1f} s", flush=True)
        for r in range(rounds):
            for name in systems if r % 2 == 0 else reversed(systems):
                p = lab.run(systems[name](r), timeout=300, cwd=str(Path(__file__).parent.parent))
                lines = [line for line in p.stdout.splitlines()
                         if "median" in line or line.lstrip().startswith("8 ")]
                print(f"## round {r + 1}: {name} (rc {p.returncode})", *lines, sep="\n",
                      flush=True)
                if p.returncode:
                    print(p.stderr[-2000:], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--spin", type=float, default=50e-6)
    parser.add_argument("--systems", default="exchange-ws,mesh-c,mesh-raw,comm")
    parser.add_argument("--lab", type=int, metavar="ROUNDS",
                        help="boot the RDMA lab and run every system in turns, ROUNDS times")
    parser.add_argument("--tbcoll", action="store_true",
                        help="be a rank of tbrun's job, timing comm.all_reduce")
    args = parser.parse_args()
    if args.tbcoll:
        return under_tbrun(args)
    if args.lab:
        return in_turns(args.lab, args.iters, args.batches)
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(2)]
    between = ctx.Pipe()
    procs = [ctx.Process(target=rank_main, args=(r, pipes[r][1], between[r], args))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        ends = [a for a, _ in pipes]
        infos = [e.recv_bytes() for e in ends]
        ends[0].send_bytes(infos[1])
        ends[1].send_bytes(infos[0])
        for e in ends:
            e.recv_bytes()
        for e in ends:
            e.send_bytes(b"go")
        results = []
        for e in ends:
            if not e.poll(600):
                raise SystemExit("a rank said nothing for 600 s")
            results.append(json.loads(e.recv_bytes()))
            if "error" in results[-1]:
                raise SystemExit(results[-1]["error"])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    extra = results[0]["extra"]
    for name, values in results[0]["times"].items():
        more = ""
        if name in extra:
            polls = statistics.median(e[0] for e in extra[name])
            waits = statistics.median(e[1] for e in extra[name])
            more = f"; {polls:.0f} empty polls, {waits:.1f} us waiting for sends per call"
        print(f"{name:12s} median {statistics.median(values):8.1f} us per call{more} "
              f"(batches: {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
