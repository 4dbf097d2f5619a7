"""The stream engine's byte counts (its SENT and RECEIVED words) and its seam for a new
connection (StreamTransport.replace_channel): over a real tcp pair, every byte each side sends
is what the other side counts as received, by whichever path moved it (C's or the engine's),
and a stream moved to a new connection between the same two processes carries the next
messages whole, its counts going on."""

import os

import pytest

from ..conftest import tagged_lines, tbrun

JOB = r"""
import socket
import struct
import sys

import numpy as np

import tbcoll

comm = tbcoll.init()
group = comm._group  # the world's stream engine: the seam under test
engine = group._stream if comm.backend == "shm" else group._transport
me, peer = comm.rank, 1 - comm.rank
SIZES = [8, 64, 4096, 65536, 1 << 20]  # bytes


def traffic():
    '''Messages of each size both ways, by every path: all_reduce (the lane at 8 B, the
    engine's algorithms above), send/recv (C's whole message), isend/irecv (the engine).'''
    for n in SIZES:
        x = np.full(n // 4, me + 1, np.float32)
        assert (comm.all_reduce(x) == 3).all(), n
        got = np.zeros_like(x)
        if me == 0:
            comm.send(x, peer, tag=1)
            comm.recv(got, peer, tag=1)
        else:
            comm.recv(got, peer, tag=1)
            comm.send(x, peer, tag=1)
        assert (got == peer + 1).all(), n
        got[:] = 0
        requests = [comm.irecv(got, peer, tag=2), comm.isend(x, peer, tag=2)]
        tbcoll.wait_all(requests)
        assert (got == peer + 1).all(), n


def quiet():
    '''A ping and its answer: after them neither side has a byte in flight, so each side's
    counts are the other's, mirrored.'''
    one = np.zeros(1, np.int64)
    if me == 0:
        comm.send(one, peer, tag=3)
        comm.recv(one, peer, tag=3)
    else:
        comm.recv(one, peer, tag=3)
        comm.send(one, peer, tag=3)
    return engine.stream_counts(peer)


def exact():
    '''Messages under the pull size, one way and back: each counts its header and payload,
    once, on each side (where a path missed its bytes on both sides alike, the mirrored
    counts would not show it).'''
    start, sizes = engine.stream_counts(peer), (8, 64, 4096)
    for n in sizes:
        x = np.zeros(n, np.uint8)
        if me == 0:
            comm.send(x, peer, tag=4)
            comm.recv(x, peer, tag=4)
        else:
            comm.recv(x, peer, tag=4)
            comm.send(x, peer, tag=4)
    end, whole = engine.stream_counts(peer), sum(32 + n for n in sizes)
    assert (end[0] - start[0], end[1] - start[1]) == (whole, whole), (start, end)


def kernel_received():
    '''The bytes the kernel has received on the stream's socket (Linux's tcp_info
    tcpi_bytes_received, at byte 128), None where it does not say (macOS).'''
    sock = engine.peer(peer).channel
    if comm.backend != "tcp" or not hasattr(socket, "TCP_INFO"):
        return None
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, 128)[0] if len(info) >= 136 else None


def side_exchange(mine):
    '''Send mine on the side socket and read the other side's as long: a barrier beside the
    stream (neither side goes on until both have written).'''
    side.sendall(mine)
    theirs = b""
    while len(theirs) < len(mine):
        theirs += side.recv(len(mine) - len(theirs))
    return theirs


def mirrored(counts):
    '''This side's (sent, received) against the other side's, and what the kernel received
    on the stream's socket then, both sides standing still until each has looked.'''
    sent, received = struct.unpack("!QQ", side_exchange(struct.pack("!QQ", *counts)))
    assert counts == (received, sent), (counts, (sent, received))
    kernel = kernel_received()
    side_exchange(b"k")
    return kernel


# two more connections between the same two processes: a path for the stream, and a side
# socket on which the test compares the counts without moving the stream's bytes
if me == 0:
    listener = socket.create_server(("127.0.0.1", 0))
    comm.send(np.array([listener.getsockname()[1]], np.int64), peer)
    path, _ = listener.accept()
    side, _ = listener.accept()
else:
    port = comm.recv(np.zeros(1, np.int64), peer)
    path = socket.create_connection(("127.0.0.1", int(port[0])))
    side = socket.create_connection(("127.0.0.1", int(port[0])))

before = quiet()
exact()
before = quiet()
kernel_before = mirrored(before)  # (the engine's counts start after the handshake)
traffic()
first = quiet()
kernel_first = mirrored(first)
if kernel_before is not None:  # every byte that came is counted, whichever path read it
    assert kernel_first - kernel_before == first[1] - before[1], (kernel_first, before, first)
if comm.backend == "shm":  # (its streams are rings in the segment: no new connection)
    print("counts", first, flush=True)
    sys.exit(0)
engine.replace_channel(peer, path)
exact()
traffic()
second = quiet()
kernel_second = mirrored(second)
if kernel_second is not None:  # the new connection's bytes, from its first
    assert kernel_second == second[1] - first[1], (kernel_second, first, second)
# the counts went on from where they stood: the same traffic added the same bytes
step = (first[0] - before[0], first[1] - before[1])
whole = sum(32 + n for n in (8, 64, 4096))  # exact()'s each way, between first and second
assert (second[0] - first[0] - whole, second[1] - first[1] - whole) == step, (before, first,
                                                                           second)
assert step[0] > 2 * sum(SIZES), step
print("counts", first, second)
"""


@pytest.mark.parametrize("backend, no_c", [("tcp", False), ("tcp", True), ("shm", False)],
                         ids=["tcp-c", "tcp-python", "shm"])
def test_byte_counts_mirror_and_go_on_over_a_new_connection(script, backend, no_c):
    """tcp: over C's paths and the engine's (TBCOLL_NO_C=1); shm: its ring moves in C and the
    engine's, without a new connection."""
    env = {**os.environ, "TBCOLL_NO_C": "1"} if no_c else None
    p = tbrun("-np", 2, "--backend", backend, script(JOB), timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert all(any(line.startswith("counts") for line in lines.get(r, [])) for r in (0, 1))
