"""The ranks' program of tests/launch/test_two_level.py: a job with several ranks on each of
several hosts (the namespace cluster, tests/harness/netns.py).

`full`: every collective and send/recv, at a small and a large size, bit for bit against numpy
(inputs are whole numbers or quarters, whose sums are exact in any order), on the world and on
a sub-communicator that spans hosts unevenly; then what the structural checks need: this
rank's established TCP connections, and on each host's first rank the bytes each of its
interfaces carried during one large all_reduce, on the world and on a communicator of one rank
per host. `cables`: only the world's bytes. One JSON line per rank; `wrong` lists what differed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys

import numpy as np

import tbcoll

SMALL, LARGE = 8, 4 << 20  # bytes of a rank's input
ROUNDS = ((SMALL, "small"), (LARGE, "large"))
wrong: list[str] = []


def data(rank: int, count: int, dtype, salt: int = 0) -> np.ndarray:
    """Rank's input: whole numbers in -1000..1000, quarters of them for floats."""
    k = (np.arange(count, dtype=np.int64) * (2 * rank + 3) + 7 * salt + rank) % 2001 - 1000
    return (k / 4).astype(dtype) if np.dtype(dtype).kind == "f" else k.astype(dtype)


def count(nbytes: int, dtype, multiple: int = 1) -> int:
    """Elements of dtype in about nbytes, a multiple of multiple (at least one of it)."""
    n = nbytes // np.dtype(dtype).itemsize // multiple * multiple
    return max(multiple, n)


def check(what: str, got, expected) -> None:
    """got must be expected, dtype, shape and bytes (or both None)."""
    if expected is None or got is None:
        if got is not expected:
            wrong.append(f"{what}: got {shown(got)}, expected {shown(expected)}")
        return
    if not (isinstance(got, np.ndarray) and got.dtype == expected.dtype
            and got.shape == expected.shape and got.tobytes() == expected.tobytes()):
        wrong.append(f"{what}: got {shown(got)}, expected {shown(expected)}"
                     f"{first_difference(got, expected)}")


def shown(x) -> str:
    if not isinstance(x, np.ndarray):
        return repr(x)[:80]
    return f"{x.dtype}{list(x.shape)} {x.ravel()[:4].tolist()}..."


def first_difference(got, expected: np.ndarray) -> str:
    """Where got first differs from expected, and what it holds there."""
    if not isinstance(got, np.ndarray) or got.shape != expected.shape:
        return ""
    bad = np.flatnonzero(got.ravel() != expected.ravel())
    if not bad.size:
        return ""
    i = bad[0]
    return (f"; {bad.size} elements differ, the first at {i}: {got.ravel()[i].item()!r} "
            f"for {expected.ravel()[i].item()!r}")


def reference(op: str, parts: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(parts)
    return stacked.sum(axis=0, dtype=stacked.dtype) if op == "sum" else stacked.max(axis=0)


def collectives(comm, name: str, root: int) -> None:
    """Every collective of comm at both sizes, against numpy; root on another host."""
    size, rank = comm.size, comm.rank
    for nbytes, label in ROUNDS:
        for op, dtype in (("sum", np.float32), ("sum", np.float64), ("sum", np.int32),
                          ("max", np.float32), ("max", np.float64), ("max", np.int32)):
            n = count(nbytes, dtype)
            salt = n % 97
            got = comm.all_reduce(data(rank, n, dtype, salt), op=op)
            check(f"{name} all_reduce {op} {np.dtype(dtype)} {label}", got,
                  reference(op, [data(r, n, dtype, salt) for r in range(size)]))
        n = count(nbytes // size, np.float32)
        check(f"{name} all_gather {label}", comm.all_gather(data(rank, n, np.float32, 1)),
              np.concatenate([data(r, n, np.float32, 1) for r in range(size)]))
        n = count(nbytes, np.float32, size)
        block = slice(rank * (n // size), (rank + 1) * (n // size))
        for op, dtype in (("sum", np.float32), ("max", np.int32)):
            check(f"{name} reduce_scatter {op} {np.dtype(dtype)} {label}",
                  comm.reduce_scatter(data(rank, n, dtype, 2), op=op),
                  reference(op, [data(r, n, dtype, 2) for r in range(size)])[block])
        n = count(nbytes, np.float64)
        mine = data(rank, n, np.float64, 3) if rank == root else np.zeros(n)
        check(f"{name} broadcast from {root} {label}", comm.broadcast(mine, root=root),
              data(root, n, np.float64, 3))
        n = count(nbytes // size, np.int32)
        check(f"{name} gather to {root} {label}", comm.gather(data(rank, n, np.int32, 4), root),
              np.concatenate([data(r, n, np.int32, 4) for r in range(size)])
              if rank == root else None)
        whole = data(root, n * size, np.int32, 5)
        check(f"{name} scatter from {root} {label}",
              comm.scatter(whole if rank == root else None, root), whole[rank * n:(rank + 1) * n])
        n = count(nbytes, np.float32)
        check(f"{name} reduce sum to {root} {label}",
              comm.reduce(data(rank, n, np.float32, 6), "sum", root),
              reference("sum", [data(r, n, np.float32, 6) for r in range(size)])
              if rank == root else None)
        n = count(nbytes // size, np.float64)
        check(f"{name} all_to_all {label}", comm.all_to_all(data(rank, n * size, np.float64, 7)),
              np.concatenate([data(r, n * size, np.float64, 7)[rank * n:(rank + 1) * n]
                              for r in range(size)]))
    counts = [r % 3 + 1 for r in range(size)]
    check(f"{name} all_gather counts={counts}",
          comm.all_gather(data(rank, counts[rank], np.float64, 8), counts=counts),
          np.concatenate([data(r, counts[r], np.float64, 8) for r in range(size)]))


def barriers(comm, name: str, folder: str) -> None:
    """After a barrier every rank's mark made before it is there (the folder is on the one
    file system all the hosts share)."""
    for round_ in range(2):
        open(os.path.join(folder, f"{name}-{round_}-{comm.rank}"), "w").close()
        comm.barrier()
        missing = [r for r in range(comm.size)
                   if not os.path.exists(os.path.join(folder, f"{name}-{round_}-{r}"))]
        if missing:
            wrong.append(f"{name} barrier {round_}: ranks {missing} had not arrived")


def point_to_point(comm, name: str, nodes: list[int]) -> dict[str, int]:
    """Small messages between every pair (non-blocking), large ones round the ring (blocking)
    and to the next rank of the same host: how many pairs of each kind were checked."""
    size, rank = comm.size, comm.rank
    pairs = {"same host": 0, "across hosts": 0}
    peers = [r for r in range(size) if r != rank]
    n = count(SMALL, np.float64)
    sends = [comm.isend(data(rank * size + p, n, np.float64, 9), p, tag=1) for p in peers]
    recvs = {p: comm.irecv(np.empty(n), p, tag=1) for p in peers}
    tbcoll.wait_all(sends)
    for p, request in recvs.items():
        check(f"{name} isend/irecv {p} -> {rank}", request.wait(),
              data(p * size + rank, n, np.float64, 9))
        pairs["same host" if nodes[p] == nodes[rank] else "across hosts"] += 1
    n = count(LARGE, np.float32)
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    if size > 1:
        got = np.empty(n, np.float32)
        if rank % 2 == 0:
            comm.send(data(rank, n, np.float32, 10), nxt, tag=2)
            got = comm.recv(got, prev, tag=2)
        else:
            got = comm.recv(got, prev, tag=2)
            comm.send(data(rank, n, np.float32, 10), nxt, tag=2)
        check(f"{name} send/recv large {prev} -> {rank}", got, data(prev, n, np.float32, 10))
    mates = [r for r in range(size) if nodes[r] == nodes[rank]]
    if len(mates) > 1:
        at = mates.index(rank)
        to, frm = mates[(at + 1) % len(mates)], mates[(at - 1) % len(mates)]
        send = comm.isend(data(rank, n, np.float32, 11), to, tag=3)
        got = comm.irecv(np.empty(n, np.float32), frm, tag=3).wait()
        send.wait()
        check(f"{name} same-host send/recv large {frm} -> {rank}", got,
              data(frm, n, np.float32, 11))
    return pairs


def tcp_connections() -> list[list[str]]:
    """[local, remote] of each established TCP connection this process holds (its host's
    /proc/net/tcp and tcp6, matched to the socket inodes of /proc/self/fd)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and fields[9] in mine:  # 01: ESTABLISHED
                    found.append([endpoint(fields[1]), endpoint(fields[2])])
    return found


def endpoint(text: str) -> str:
    """/proc/net/tcp's "0100007F:9C40" as "127.0.0.1:40000" (IPv4-mapped IPv6 as IPv4)."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # host-order words
    ip = ipaddress.ip_address(words)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return f"{ip}:{int(port, 16)}"


def interface_bytes() -> dict[str, int]:
    """Bytes sent plus received so far on each interface of this host but lo."""
    counted = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, numbers = line.partition(":")
            fields = numbers.split()
            if name.strip() != "lo":
                counted[name.strip()] = int(fields[0]) + int(fields[8])
    return counted


def bytes_moved(comm, group, x: np.ndarray) -> dict[str, int] | None:
    """Each interface's bytes during group.all_reduce(x) (after one call to warm it up), on
    each host's first rank; every rank of comm takes part in the barriers around it."""
    if group is not None:
        group.all_reduce(x)
    comm.barrier()
    before = interface_bytes() if comm.local_rank == 0 else None
    comm.barrier()
    if group is not None:
        group.all_reduce(x)
    comm.barrier()
    if before is None:
        return None
    after = interface_bytes()
    return {name: after[name] - before[name] for name in before}


def main(mode: str, folder: str) -> None:
    layout = json.loads(os.environ["TBCOLL_HOSTFILE"])["hosts"]
    with tbcoll.init() as comm:
        nodes = [0] * comm.size
        for i, host in enumerate(layout):
            for r in host["ranks"]:
                nodes[r] = i
        large = data(comm.rank, count(LARGE, np.float32), np.float32, 12)
        report = {"rank": comm.rank, "node": nodes[comm.rank], "local": comm.local_rank,
                  "backend": comm.backend, "hostname": socket.gethostname()}
        if mode == "full":
            # root: the last rank of the last host, not a host's first rank where it has two
            root = max(layout[-1]["ranks"])
            collectives(comm, "world", root)
            barriers(comm, "world", folder)
            report["pairs"] = point_to_point(comm, "world", nodes)
            # a sub-communicator over all of host 0 and the first rank of host 1 (3+1, 2+1,
            # 1+1 ...), ranked backwards; the rest in the other
            first = min(layout[1]["ranks"])
            color = 0 if nodes[comm.rank] == 0 or comm.rank == first else 1
            members = [r for r in range(comm.size)
                       if (0 if nodes[r] == 0 or r == first else 1) == color][::-1]
            sub = comm.split(color, key=comm.size - comm.rank)
            if (sub.size, sub.rank) != (len(members), members.index(comm.rank)):
                wrong.append(f"split: rank {sub.rank} of {sub.size}, expected "
                             f"{members.index(comm.rank)} of {len(members)}")
            else:
                collectives(sub, f"split {color}", sub.size - 1)
                barriers(sub, f"split{color}", folder)
                point_to_point(sub, f"split {color}", [nodes[r] for r in members])
            report["wrong"] = wrong
            leaders = comm.split(0 if comm.local_rank == 0 else None)
            report["bytes"] = bytes_moved(comm, comm, large)
            report["leaders_bytes"] = bytes_moved(comm, leaders, large)
            comm.barrier()  # every connection made, none closed yet
            report["tcp"] = tcp_connections()
            report["store"] = os.environ["TBCOLL_STORE"]
            report["pid"] = os.getpid()
            comm.barrier()
        else:
            report["bytes"] = bytes_moved(comm, comm, large)
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
