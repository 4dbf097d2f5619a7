"""C's watcher of dead paths (tbcoll/transports/tcp/watch.c) on real loopback connections:
what must not count as a dead path (a peer slow to read: its window closes; a peer that
reads again after a pause), what must (a connection reset), and that it never touches a
socket it no longer watches. A pulled cable itself needs the namespace cluster
(tests/launch/test_failover_pull.py). Also reconnect.answers, fail-back's probe."""

from __future__ import annotations

import errno
import socket
import struct
import time

import pytest

from tbcoll.core.extensions import c_extension
from tbcoll.job.topology import CABLE, Path
from tbcoll.transports.reconnect import answers

_sockets = c_extension("tbcoll.transports.tcp._sockets")
needs_c = pytest.mark.skipif(_sockets is None, reason="tcp's C extension is not built")
DEAD_AFTER = 1.0  # watch.c's
LOOKS = DEAD_AFTER + 0.4  # long enough for the watcher to have judged a stall


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        here = socket.create_connection(server.getsockname())
        there, _ = server.accept()
    for sock in (here, there):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    here.setblocking(False)
    return here, there


def fill(sock: socket.socket) -> int:
    """Write until the peer's window and this end's buffer are full."""
    sent = 0
    try:
        while True:
            sent += sock.send(bytes(1 << 16))
    except BlockingIOError:
        return sent


@needs_c
def test_a_peer_slow_to_read_then_reading_is_no_dead_path():
    here, there = connected_pair()
    with here, there:
        _sockets.watch(here.fileno())
        try:
            sent = fill(here)
            time.sleep(LOOKS)  # the peer computes: its window closes, nothing unacknowledged
            assert _sockets.watched(here.fileno()) is None
            there.settimeout(10)
            got = 0
            while got < sent:  # it reads again: every byte comes, the socket unharmed
                got += len(there.recv(1 << 20))
            assert got == sent
            assert _sockets.watched(here.fileno()) is None
        finally:
            _sockets.unwatch(here.fileno())


@needs_c
def test_a_reset_connection_is_found_and_shut_down():
    here, there = connected_pair()
    with here:
        _sockets.watch(here.fileno())
        try:
            there.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            there.close()  # a reset
            deadline = time.monotonic() + 5
            while _sockets.watched(here.fileno()) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            kind, error = _sockets.watched(here.fileno())
            assert kind == "ended" and error in (0, errno.ECONNRESET), (kind, error)
        finally:
            _sockets.unwatch(here.fileno())


@needs_c
def test_a_socket_closed_without_unwatch_is_forgotten_not_touched():
    """An fd reused by another socket is never shut down by the watcher."""
    here, there = connected_pair()
    fd = here.fileno()
    _sockets.watch(fd)
    here.close()
    there.close()
    again, peer = connected_pair()  # most likely the same fd number
    with again, peer:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.3)  # the watcher looks, finds another socket there, drops it
        assert _sockets.watched(fd) is None
        again.setblocking(True)
        again.sendall(b"alive")
        assert peer.recv(5) == b"alive"
    _sockets.unwatch(fd)


@needs_c
def test_a_bad_fd_is_named():
    with pytest.raises(ValueError, match="fd"):
        _sockets.watch(-1)


def test_answers_is_a_refused_or_taken_connection():
    with socket.create_server(("127.0.0.1", 0)):
        assert answers(Path(CABLE, 1, "127.0.0.1", "127.0.0.1"))  # port 1: refused
    assert not answers(Path(CABLE, 1, "127.0.0.1", None))  # no far end known
