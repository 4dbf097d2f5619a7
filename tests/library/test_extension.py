"""tbcoll extended from outside, through its public hooks only (docs/extending.md's examples):

- MAXLOC, MPI's all-reduce of (value, index) pairs, as a collective descriptor, registered
  with tbcoll.register_collective: comm.maxloc(values) on every transport;
- "pipes", a pure-Python transport over Unix-domain sockets (a Group with P2P only, no
  native), which tbrun passes to every rank (--transport-module) and which registers itself
  with tbcoll.register_transport.

The ranks load this file as a pytest plugin (-p), which registers both before the spmd suite
is collected; tests/spmd/test_descriptors.py then runs MAXLOC's cases on shm, tcp and pipes,
and every built-in's cases on pipes. Plain pytest runs the tests at the bottom, which launch
those jobs with tbrun.
"""

from __future__ import annotations

import os
import re
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tbcoll
from tbcoll.algorithms import function
from tbcoll.collectives.base import Call, Collective, Context, flat
from tbcoll.collectives.cases import Case
from tbcoll.core.calls import mismatch
from tbcoll.core.errors import CommError, CommRevokedError, PeerLostError, PeerTimeoutError

# --- (a) a collective: MAXLOC ------------------------------------------------------------

PAIR = np.dtype([("value", np.float64), ("index", np.int64)])  # MPI_DOUBLE_INT


def _maxloc(acc: np.ndarray, incoming: np.ndarray, out: np.ndarray) -> None:
    """The larger value of each pair; of equal values the smaller index (MPI's rule)."""
    take = (incoming["value"] > acc["value"]) | (
        (incoming["value"] == acc["value"]) & (incoming["index"] < acc["index"]))
    out[take] = incoming[take]


class MaxLoc(Collective):
    """comm.maxloc(values, indices=None) -> (the largest values, where they are): elementwise
    over the ranks, ties to the smaller index; indices default to this rank's number."""

    name = "maxloc"
    algorithms = ("rd", "ring")  # tbcoll's all_reduce algorithms, with MAXLOC's reduction
    rules = [(64 << 10, None, "rd"), (None, None, "ring")]

    def call(self, ctx: Context, values: Any, indices: Any = None,
             algorithm: str | None = None) -> Call:
        values = np.asarray(values, np.float64)
        if indices is None:
            indices = np.full(values.shape, ctx.rank, np.int64)
        indices = np.asarray(indices)
        if indices.shape != values.shape or indices.dtype.kind not in "iu":
            raise ValueError(f"maxloc needs integer indices of the values' shape {values.shape}")
        pairs = np.empty(values.shape, PAIR)
        pairs["value"], pairs["index"] = values, indices
        return Call(self, values, pairs, None, None, -1,
                    ctx.choose(self.name, pairs.nbytes, algorithm), lambda result: result)

    def described(self, call: Call) -> np.ndarray:
        return call.array["value"]  # what TBCOLL_CHECK compares: a dtype it knows

    def implementation(self, algorithm: str) -> Any:
        return function("all_reduce", algorithm)

    def prepare(self, ctx: Context, call: Call) -> None:
        call.state = call.array.copy()

    def algorithm(self, ctx: Context, call: Call, run: Any) -> None:
        if call.state.size:
            run(ctx.coll, flat(call.state), _maxloc)

    def finish(self, ctx: Context, call: Call) -> tuple[np.ndarray, np.ndarray]:
        return call.state["value"].copy(), call.state["index"].copy()

    def cases(self, rank: int, size: int):
        for n in (0, 1, 7, 3000):
            position = np.arange(n)
            values = ((position * 7 + rank * 5) % 11).astype(np.float64)  # ties happen
            every = [((position * 7 + r * 5) % 11).astype(np.float64) for r in range(size)]
            best = np.max(every, axis=0) if size else values
            first = np.argmax(np.array(every) == best, axis=0).astype(np.int64)
            yield Case(f"{n} values", (values,), (best, first))
        yield Case("given indices", (np.array([rank % 2, 1.0]), np.array([10 + rank, 20 + rank])),
                   (np.array([float(size > 1), 1.0]), np.array([10 + (size > 1), 20])))
        yield Case("bad indices", (np.ones(2), np.ones(3, np.int64)), raises="indices")


MAXLOC = tbcoll.register_collective(MaxLoc())

# --- (b) a transport: pipes --------------------------------------------------------------

_HEADER = struct.Struct("<iiqQ")  # endpoint, tag, bytes, the sender's call signature


class _Request:
    """A send or a receive: with whom, its (peer, endpoint, tag), its bytes, whether done."""

    __slots__ = ("peer", "key", "view", "done")

    def __init__(self, peer: int, key: tuple, view: memoryview) -> None:
        self.peer, self.key, self.view, self.done = peer, key, view, False


class _Engine:
    """Every message of this rank: a socket per peer, sends queued in order per peer, arrivals
    matched by (endpoint, tag) in order, the unmatched kept until their receive is posted."""

    def __init__(self, rank: int, sockets: dict[int, socket.socket], timeout: float) -> None:
        self.rank, self.sockets, self.timeout = rank, sockets, timeout
        self.outgoing: dict[int, list] = {peer: [] for peer in sockets}
        self.posted: dict[tuple, list[_Request]] = {}
        self.arrived: dict[tuple, list[tuple[bytes, int]]] = {}
        self.reading: dict[int, list] = {peer: [bytearray(), None] for peer in sockets}
        self.signature = 0  # the call in progress (Group.begin_call)
        self.revoked = ""

    def isend(self, endpoint: int, buf: np.ndarray, peer: int, tag: int) -> _Request:
        data = memoryview(np.ascontiguousarray(buf).reshape(-1).view(np.uint8))
        header = _HEADER.pack(endpoint, tag, data.nbytes, self.signature if endpoint else 0)
        request = _Request(peer, (peer, endpoint, tag), data)
        self.outgoing[peer].append([request, memoryview(header), data])
        return request

    def irecv(self, endpoint: int, buf: np.ndarray, peer: int, tag: int) -> _Request:
        request = _Request(peer, (peer, endpoint, tag), memoryview(buf.reshape(-1).view(np.uint8)))
        if queue := self.arrived.get(request.key):
            data, signature = queue.pop(0)
            self._deliver(request, data, signature)
        else:
            self.posted.setdefault(request.key, []).append(request)
        return request

    def _deliver(self, request: _Request, data: bytes, signature: int) -> None:
        """Compare the calls (as the stream transports do), then the message's size."""
        mine = self.signature if request.key[1] else 0
        if signature and mine and signature != mine:
            raise CommError(mismatch({self.rank: mine, request.peer: signature}))
        if len(data) != request.view.nbytes:
            raise CommError(f"rank {request.peer} sent {len(data)} bytes where "
                            f"{request.view.nbytes} were expected")
        request.view[:] = data
        request.done = True

    def waitall(self, requests: list[_Request]) -> None:
        deadline = time.monotonic() + self.timeout
        while not all(r.done for r in requests):
            if self.revoked:
                raise CommRevokedError(self.revoked)
            if time.monotonic() > deadline:
                peers = tuple(sorted({r.peer for r in requests if not r.done}))
                raise PeerTimeoutError(f"no message from ranks {peers} within "
                                       f"{self.timeout:g} s", peers)
            self.progress(0.05)

    def progress(self, wait: float) -> None:
        readers = list(self.sockets.values())
        writers = [self.sockets[p] for p, queue in self.outgoing.items() if queue]
        readable, writable, _ = select.select(readers, writers, [], wait)
        for peer, sock in self.sockets.items():
            if sock in writable:
                self._write(peer, sock)
            if sock in readable:
                self._read(peer, sock)

    def _write(self, peer: int, sock: socket.socket) -> None:
        queue = self.outgoing[peer]
        while queue:
            request, *parts = queue[0]
            while parts[0].nbytes or parts[1].nbytes:
                part = 0 if parts[0].nbytes else 1
                try:
                    sent = sock.send(parts[part])
                except BlockingIOError:
                    return
                except OSError as e:
                    raise PeerLostError(f"rank {peer}: {e.strerror}", (peer,)) from e
                parts[part] = parts[part][sent:]
                queue[0][1 + part] = parts[part]
            request.done = True
            queue.pop(0)

    def _read(self, peer: int, sock: socket.socket) -> None:
        """What the socket holds now: a header, then its payload into a posted buffer or a
        new one kept for the receive to come."""
        state = self.reading[peer]
        while True:
            header, body = state
            want = _HEADER.size - len(header) if body is None else body[1]
            try:
                chunk = sock.recv(min(want, 1 << 20)) if want else b""
            except BlockingIOError:
                return
            if want and not chunk:
                raise PeerLostError(f"rank {peer} closed its connection", (peer,))
            if body is None:
                header += chunk
                if len(header) < _HEADER.size:
                    continue
                endpoint, tag, nbytes, signature = _HEADER.unpack(header)
                state[1] = body = [bytearray(), nbytes, (peer, endpoint, tag), signature]
            else:
                body[0] += chunk
                body[1] -= len(chunk)
            if body[1] == 0:
                state[:] = [bytearray(), None]
                data, key, signature = bytes(body[0]), body[2], body[3]
                if posted := self.posted.get(key):
                    self._deliver(posted.pop(0), data, signature)
                else:
                    self.arrived.setdefault(key, []).append((data, signature))


class _Endpoint:
    """One matching space of the group (p2p or coll), as tbcoll.core.protocols.P2P."""

    acknowledge = False

    def __init__(self, engine: _Engine, endpoint: int, rank: int, size: int) -> None:
        self.engine, self.endpoint, self.rank, self.size = engine, endpoint, rank, size

    def isend(self, buf, peer, tag):
        return self.engine.isend(self.endpoint, buf, peer, tag)

    def irecv(self, buf, peer, tag):
        return self.engine.irecv(self.endpoint, buf, peer, tag)

    def send(self, buf, peer, tag):
        self.waitall([self.isend(buf, peer, tag)])

    def recv(self, buf, peer, tag):
        self.waitall([self.irecv(buf, peer, tag)])

    def waitall(self, requests):
        self.engine.waitall(list(requests))

    def test(self, requests):
        self.engine.progress(0)
        return all(r.done for r in requests)


class PipesGroup:
    """The world over pipes: P2P only (native None: every collective runs tbcoll's
    algorithms), no tuning table of its own (the descriptors' defaults)."""

    tuning = "pipes"
    native = None
    allocate = None
    revocation = None  # a revocation is this rank's only

    def __init__(self, engine: _Engine, rank: int, size: int) -> None:
        self.engine, self.rank, self.size, self.local_rank = engine, rank, size, rank
        self.p2p, self.coll = _Endpoint(engine, 0, rank, size), _Endpoint(engine, 1, rank, size)

    def begin_call(self, seq: int, signature: int) -> None:
        self.engine.signature = signature

    def end_call(self) -> None:
        self.engine.signature = 0

    def revoke(self, notice: str) -> None:
        self.engine.revoked = notice

    def context_hint(self) -> int:
        return 0

    def split(self, color, key, members, context):
        raise CommError("the pipes transport has no split")

    def describe_links(self) -> list[str]:
        return ["  every pair: a Unix-domain socket (tests/library/test_extension.py)"]

    def close(self) -> None:
        for sock in self.engine.sockets.values():
            sock.close()


def open_world(info: Any, prefix: str) -> tuple[PipesGroup, int, int]:
    """Rank i listens at DIR/i and connects to every lower rank (one host: DIR is private to
    the job and this world); the connector says who it is first."""
    rank, size = (info.rank, info.size) if info else (0, 1)
    timeout = info.timeout if info else 60.0
    folder = Path(tempfile.gettempdir()) / (
        f"tbp-{zlib.crc32(f'{info.job if info else os.getpid()}{prefix}'.encode()):08x}")
    folder.mkdir(mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / str(rank)))
    listener.listen(size)
    sockets: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    for peer in range(rank):
        sockets[peer] = _connect(folder / str(peer), deadline)
        sockets[peer].sendall(struct.pack("<q", rank))
    listener.settimeout(timeout)
    for _ in range(rank + 1, size):
        sock, _ = listener.accept()
        sock.settimeout(timeout)
        sockets[struct.unpack("<q", _exactly(sock, 8))[0]] = sock
    listener.close()
    os.unlink(folder / str(rank))
    for sock in sockets.values():
        sock.setblocking(False)
    return PipesGroup(_Engine(rank, sockets, timeout), rank, size), rank, 0


def _connect(path: Path, deadline: float) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise PeerTimeoutError(f"nobody listens at {path}") from None
            time.sleep(0.01)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        if not (chunk := sock.recv(n - len(data))):
            raise PeerLostError("a peer closed its connection while connecting")
        data += chunk
    return data


tbcoll.register_transport("pipes", sys.modules[__name__])

# --- the tests (plain pytest): jobs launched by tbrun --------------------------------------

REPO = Path(__file__).resolve().parents[2]
TBRUN = str(Path(sys.executable).with_name("tbrun"))
SUITE = str(REPO / "tests" / "spmd" / "test_descriptors.py")
PLUGIN = "tests.library.test_extension"


def _job(np_: int, backend: str, *pytest_args: str) -> str:
    extra = ["--transport-module", PLUGIN] if backend == "pipes" else []
    p = subprocess.run([TBRUN, "-np", str(np_), "--backend", backend, *extra, "--timeout",
                        "250", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", PLUGIN, *pytest_args], capture_output=True, text=True,
                       timeout=280, cwd=REPO, env={**os.environ, "TBCOLL_TIMEOUT": "60"})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    return p.stdout


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_registered_collective_passes_the_generated_suite(backend):
    out = _job(3, backend, SUITE, "-k", "maxloc")
    assert re.search(r"\b3 passed", out), out[-2000:]  # default, rd, ring


@pytest.mark.parametrize("np_", [2, 3])
def test_a_registered_transport_passes_the_generated_suite(np_):
    """Every built-in collective's cases and MAXLOC's, over pipes."""
    out = _job(np_, "pipes", SUITE)
    passed = int(re.search(r"(\d+) passed", out).group(1))
    assert passed >= 30 and "failed" not in out, out[-2000:]



_SCRIPT = """
import sys
import numpy as np
import tbcoll

rank = int(sys.argv[2])
if sys.argv[1] == "order" and rank == 1:  # registers another collective before maxloc
    from tbcoll.collectives.barrier import Barrier
    tbcoll.register_collective(type("Other", (Barrier,), {"name": "other"})())
from tests.library.test_extension import MAXLOC  # noqa: E402 (registers maxloc)

comm = tbcoll.init()
values, where = comm.maxloc(np.array([comm.rank, 5.0]))
print("maxloc", values.tolist(), where.tolist(), flush=True)
values, where = comm.icollective("maxloc", np.array([5.0, comm.rank])).wait()
print("imaxloc", values.tolist(), where.tolist(), flush=True)
print("sum", comm.collective("all_reduce", np.ones(2)).tolist(), flush=True)
if sys.argv[1] == "mismatch":
    if comm.rank == 0:
        comm.maxloc(np.ones(4))
    else:
        comm.all_reduce(np.ones(4, np.float64), algorithm="rd")
"""


def _script(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "extended.py"
    script.write_text(_SCRIPT)
    return subprocess.run([TBRUN, "-np", "2", "--backend", "tcp", "--timeout", "60",
                           "--dump-dir", str(tmp_path / "dumps"), "sh", "-c",
                           f'exec {sys.executable} {script} {mode} "$TBCOLL_RANK"'],
                          capture_output=True, text=True, timeout=90, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TBCOLL_TIMEOUT": "20"})


def test_a_registered_collective_is_named_where_the_ranks_calls_differ(tmp_path):
    """The call-mismatch error and tbrun's diagnosis name maxloc, as they name a built-in."""
    p = _script(tmp_path, "mismatch")
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "maxloc [1.0, 5.0] [1, 0]" in out, out[-3000:]
    assert "imaxloc [5.0, 1.0] [0, 1]" in out and "sum [2.0, 2.0]" in out, out[-3000:]
    assert re.search(r"the ranks' calls do not match \(rank 0: maxloc\(", out), out[-3000:]
    assert re.search(r"rank 0: maxloc #\d+ at .*extended.py", out), out[-3000:]  # the recorder


def test_ranks_whose_registries_differ_are_told_at_the_first_call(tmp_path):
    p = _script(tmp_path, "order")
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "registered different collectives" in out, out[-3000:]
    assert "maxloc [" not in out, out[-3000:]
