"""Failover with replay (docs/failover.md): streams whose connections are
cut at seeded bytes (tbcoll.transports.stream.faults) carry on over a new one, each sender
replaying what its peer missed from its kept tail; every message arrives bit for bit, once.
Ranks here are threads of one process, each with its own TcpTransport over loopback TCP;
tests/transports/test_failover_job.py runs the same under tbrun."""

import socket
import sys
import threading

import numpy as np
import pytest

import tbcoll.transports.tcp.transport as tcp_transport
from tbcoll.core.errors import TbcollError
from tbcoll.job.env import failover
from tbcoll.transports.reconnect import exchange_counts
from tbcoll.transports.stream.faults import CutChannel, FaultPlan, SocketCuts
from tbcoll.transports.stream.replay import Tail
from tbcoll.transports.stream.words import TAIL_LARGE as LARGE
from tbcoll.transports.tcp.transport import TcpTransport, failing_over

SIZES = (8, 1, 300, 40_000, 8, 200_000, 17, 1 << 20, 8, 64)


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of one TCP connection over loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


class Links:
    """Every connection of an in-process job, set-up's and failover's: a pair's ends."""

    def __init__(self) -> None:
        self.lock, self.made = threading.Lock(), {}

    def end(self, rank: int, peer: int, generation: int) -> socket.socket:
        key = (min(rank, peer), max(rank, peer), generation)
        with self.lock:
            if key not in self.made:
                self.made[key] = loopback_pair()
            return self.made[key][rank > peer]

    def reconnect(self, rank: int):
        def again(peer, generation, received, used):
            return self.end(rank, peer, generation), exchange_counts(
                self.end(rank, peer, generation), received, 10.0)
        return again


def payload(sender: int, receiver: int, n: int, size: int) -> np.ndarray:
    """The n-th message from sender to receiver: bytes no other message has."""
    return np.random.default_rng((sender, receiver, n)).integers(0, 256, size, dtype=np.uint8)


def run_ranks(size: int, plan: FaultPlan | SocketCuts | None, body) -> list:
    """Run body(transport, rank) for each rank in a thread; their results (or errors)."""
    links = Links()
    wrap = plan.wrap if isinstance(plan, FaultPlan) else None
    transports = [TcpTransport(rank, size, {peer: links.end(rank, peer, 0)
                                            for peer in range(size) if peer != rank},
                               20.0, reconnect=links.reconnect(rank), wrap=wrap)
                  for rank in range(size)]
    for transport in transports if isinstance(plan, SocketCuts) else ():
        plan.watch(transport)
    results: list = [None] * size
    finished = threading.Barrier(size)

    def one(rank: int) -> None:
        transport = transports[rank]
        try:
            with transport.turns:  # the engine's methods run with its turns held
                results[rank] = body(transport, rank)
                linger(transport, finished)
        except Exception as e:  # noqa: BLE001 - the test names it
            results[rank] = e
            finished.abort()

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for transport in transports:
        transport.close()
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results


def linger(transport: TcpTransport, finished: threading.Barrier) -> None:
    """Keep the engine going until every rank is done: a peer may yet need bytes this rank
    sent that a cut lost, and only an engine that runs replays them (no thread does yet)."""
    finished_at = [False]
    waiter = threading.Thread(target=lambda: (finished.wait(30), finished_at.__setitem__(0, True)))
    waiter.start()
    while not finished_at[0]:
        transport.test([])
        transport._ready(0.001)
    waiter.join()


def ring_traffic(transport: TcpTransport, rank: int) -> list[bool]:
    """Each rank sends each message to every other rank while receiving theirs (the
    exchange of a collective's step), then checks every byte."""
    size, right = transport.size, []
    peers = [p for p in range(size) if p != rank]
    for n, nbytes in enumerate(SIZES):
        sends = [transport.isend(payload(rank, p, n, nbytes), p, 0, n) for p in peers]
        got = {p: np.empty(nbytes, np.uint8) for p in peers}
        receives = [transport.irecv(got[p], p, 0, n) for p in peers]
        transport.waitall(sends + receives)
        right += [np.array_equal(got[p], payload(p, rank, n, nbytes)) for p in peers]
    return right


def test_a_tail_keeps_what_is_not_acknowledged():
    """Bytes past the ring's size are kept while the channel says they are unacknowledged
    (the ring grows, up to its bound); since() gives exactly [offset, end)."""
    unacked = [0]
    tail = Tail(lambda: unacked[0], first=16, most=64)
    stream = bytes(range(200))
    tail.keep([memoryview(stream[:10])], 10)
    assert tail.since(3) == stream[3:10]
    unacked[0] = 40  # the next write overflows the ring: 40 bytes are still held
    tail.keep([memoryview(stream[10:30]), memoryview(stream[30:50])], 40)
    assert tail.size == 64 and tail.since(10) == stream[10:50] and not tail.short
    unacked[0] = 0  # all acknowledged: the ring wraps, keeping its last 64 bytes
    tail.keep([memoryview(stream[50:200])], 150)
    assert tail.start == 136 and tail.since(136) == stream[136:200]
    assert tail.since(135) is None
    tail.rewind(150)
    assert tail.since(140) == stream[140:150]


def test_a_large_message_is_held_not_copied_until_written():
    """A large message's bytes are read from its own buffers while it is written; once all
    written, only what the kernel still holds is copied into the ring."""
    unacked = [0]
    tail = Tail(lambda: unacked[0], first=1 << 10, most=1 << 20)
    small, header = bytes(range(100)), bytes(range(32))
    payload = bytes(i % 251 for i in range(LARGE + 5000))
    stream = small + header + payload
    tail.wrote("a", [memoryview(small)], 100)
    message = [memoryview(header), memoryview(payload)]
    tail.wrote("b", message, 40_000)  # header and part of the payload: held, not copied
    assert tail.held is not None and tail.since(50) == stream[50:100 + 40_000]
    unacked[0] = 1 << 30  # nothing acknowledged yet: the ring grows to keep it all
    tail.rewind(100 + 30_000)  # a failover: the peer has up to here; the rest goes again
    assert tail.held is None and tail.since(100) == stream[100:100 + 30_000]
    rest = [memoryview(stream[100 + 30_000:])]  # sent again, under LARGE: copied
    tail.wrote("c", rest, len(rest[0]))
    assert tail.held is None and tail.since(100) == stream[100:]
    unacked[0] = 700  # a large message whose last 700 bytes are unacknowledged as it ends
    tail.wrote("d", [memoryview(payload)], 50_000)
    tail.wrote("d", [memoryview(payload)[50_000:]], len(payload) - 50_000)
    end = len(stream) + len(payload)
    assert tail.held is None and tail.end == end and tail.since(end - 700) == payload[-700:]
    assert tail.since(end - 701) is None  # acknowledged: not copied


def test_a_cut_channel_cuts_where_told():
    """The peer reads exactly cut_at bytes, then the end; drop more are taken, then EPIPE."""
    near, far = loopback_pair()
    channel = CutChannel(near, cut_at=5, drop=3)
    assert channel.sendmsg([memoryview(b"abcdefgh"), memoryview(b"ij")]) == 8
    assert channel.unacked() >= 3
    with pytest.raises(BrokenPipeError):
        channel.sendmsg([memoryview(b"k")])
    far.settimeout(5)
    assert far.recv(100) == b"abcde" and far.recv(100) == b""
    near.close()
    far.close()


@pytest.mark.parametrize("size", [2, 3])
def test_messages_survive_cuts_at_seeded_bytes(size, caplog):
    """Many seeds, each cutting every stream's first three connections (the replay's own
    included) at a byte within the first 1.5 MiB: headers, payloads, replays. Every message
    arrives whole and once (a byte lost, doubled or misplaced fails its comparison or the
    stream's framing)."""
    seeds = 40 if size == 2 else 15
    for seed in range(seeds):
        plan = FaultPlan(seed, cuts=3, span=3 << 19)
        results = run_ranks(size, plan, ring_traffic)
        for rank, result in enumerate(results):
            assert not isinstance(result, Exception), f"seed {seed}, rank {rank}: {result}"
            assert all(result), f"seed {seed}, rank {rank}: wrong bytes {result}"
    failovers = [r for r in caplog.records if "; now over " in r.getMessage()]
    replays = [r for r in failovers if not r.getMessage().endswith(" 0 bytes sent again")]
    assert len(failovers) >= seeds * size and len(replays) >= seeds, (len(failovers), len(replays))
    # a cut is no peer's end: no failover's reason says it exited
    assert not [r for r in failovers if "exited or crashed" in r.getMessage()], failovers[:3]


def test_without_a_path_left_the_stream_is_lost_named():
    """A reconnect that finds no path: the wait fails as today, naming the peer and why."""
    links = Links()

    def body(transport, rank):
        transport._reconnector = lambda *_: None
        return ring_traffic(transport, rank)

    plan = FaultPlan(1, cuts=1, span=1000)
    transports_results = run_ranks_with(links, plan, body)
    assert any("no path left" in str(r) for r in transports_results), transports_results


def run_ranks_with(links: Links, plan: FaultPlan, body) -> list:
    return run_ranks(2, plan, body)


class CountingC:
    """tcp's C module, counting its moves (which path ran)."""

    def __init__(self, module) -> None:
        self.module, self.calls = module, {"send": 0, "recv": 0, "exchange": 0}

    def __getattr__(self, name: str):
        method = getattr(self.module, name)
        if name not in self.calls:
            return method

        def call(*args):
            self.calls[name] += 1
            return method(*args)
        return call


def c_traffic(transport: TcpTransport, rank: int) -> list[bool]:
    """Each rank's message to all the others at once (C's exchange), then one to each (C's
    send and receive), every byte checked."""
    size, right = transport.size, []
    peers = tuple(p for p in range(size) if p != rank)
    for n, nbytes in enumerate(SIZES):
        blocks = np.empty((len(peers), nbytes), np.uint8)
        transport.exchange(payload(rank, 99, n, nbytes), peers, blocks, 0, 100 + n)
        right += [np.array_equal(blocks[i], payload(p, 99, n, nbytes))
                  for i, p in enumerate(peers)]
        sends = [transport.isend(payload(rank, p, n, nbytes), p, 0, n) for p in peers]
        for p in peers:
            got = np.empty(nbytes, np.uint8)
            transport.recv(got, p, 0, n)
            right.append(np.array_equal(got, payload(p, rank, n, nbytes)))
        transport.waitall(sends)
    return right


@pytest.mark.skipif(tcp_transport._sockets is None, reason="tcp's C paths are not built")
@pytest.mark.skipif(sys.platform != "linux", reason="SocketCuts relies on Linux resetting "
                    "what comes to a socket shut for reading (BSD acknowledges and drops it)")
@pytest.mark.parametrize("size", [2, 3])
def test_c_paths_survive_real_socket_cuts(size, caplog, monkeypatch):
    """The real sockets shut down at seeded counts (SocketCuts), where tcp's C paths write and
    read them themselves (counted: they ran): C meets EPIPE, ECONNRESET or the end of the
    stream, returns the stream to the engine broken, and every message arrives whole, once."""
    counting = CountingC(tcp_transport._sockets)
    monkeypatch.setattr(tcp_transport, "_sockets", counting)
    seeds = 8
    for seed in range(seeds):
        plan = SocketCuts(seed, cuts=3, span=1 << 20, look=0.0002)
        results = run_ranks(size, plan, c_traffic)
        for rank, result in enumerate(results):
            assert not isinstance(result, Exception), f"seed {seed}, rank {rank}: {result}"
            assert all(result), f"seed {seed}, rank {rank}: wrong bytes {result}"
    failovers = [r for r in caplog.records if "; now over " in r.getMessage()]
    replays = [r for r in failovers if not r.getMessage().endswith(" 0 bytes sent again")]
    assert len(failovers) >= seeds * size and len(replays) >= seeds, (len(failovers),
                                                                      len(replays))
    assert min(counting.calls.values()) >= seeds * size * len(SIZES) // 2, counting.calls
    assert not [r for r in failovers if "exited or crashed" in r.getMessage()], failovers[:3]


def test_failover_is_on_where_a_pair_has_several_paths():
    """By default only the pairs with several paths fail over (a single-path pair stays as
    it was); TBCOLL_FAILOVER=1 or a fault plan: every pair; 0 (--no-failover): none."""
    paths = {1: ("cable", "management"), 2: ("management",), 3: None}
    route, peers = paths.get, (1, 2, 3)
    assert failing_over(None, False, route, peers) == {1}
    assert failing_over(True, False, route, peers) == {1, 2, 3}
    assert failing_over(None, True, route, peers) == {1, 2, 3}
    assert failing_over(False, False, route, peers) == set()
    assert [failover({"TBCOLL_FAILOVER": v}) for v in ("", "0", "1")] == [None, False, True]
    with pytest.raises(TbcollError, match="TBCOLL_FAILOVER='yes': give 1"):
        failover({"TBCOLL_FAILOVER": "yes"})


def test_a_full_ring_asks_the_kernel_once_per_ring_of_sends():
    """Small messages fill the ring; the kernel, asked, holds few of them: the acknowledged
    bytes' room is free again, so it is asked once per ring's worth, not once per message."""
    asked = []
    tail = Tail(lambda: asked.append(1) or 100, first=1024, most=1024)
    stream = bytes(range(256)) * 200
    for at in range(0, 40_000, 40):
        tail.keep([memoryview(stream[at:at + 40])], 40)
    assert 40 <= len(asked) <= 50, len(asked)  # 40 000 bytes, ~924 free a turn
    assert tail.since(40_000 - 100) == stream[40_000 - 100:40_000]
