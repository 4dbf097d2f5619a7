"""tcp's small-message path in C (tbcoll/transports/tcp/_sockets.c): the C calls on real sockets,
and jobs whose messages take it, fall back from it mid-way (another message first, a large
one, a slow sender) or never take it (the extension missing), with every result checked."""

import threading
import time

import numpy as np
import pytest

from tbcoll.transports.stream import HEADER as _HEADER
from tbcoll.transports.tcp import _sockets

from ..conftest import tagged_lines, tbrun


def _message(tag: int, payload: bytes) -> bytes:
    return _HEADER.pack(1, tag, len(payload), 4, 9) + payload


def test_the_expected_message_lands_in_its_buffer(socket_pair):
    a, b = socket_pair
    x = np.arange(4, dtype=np.float32)
    header = _HEADER.pack(1, 3, x.nbytes, 4, 9)
    assert _sockets.send(a.fileno(), header, x) == 32 + 16
    y, stage = np.zeros_like(x), bytearray(64)
    assert _sockets.recv(b.fileno(), header, y, stage, 0.0, 1.0) == (16, 0, 0)
    assert (y == x).all()


def test_another_message_first_is_left_in_the_stage(socket_pair):
    a, b = socket_pair
    other = _message(2, b"abcdefgh")
    a.sendall(other + _message(3, b"12345678"))
    stage = bytearray(64)
    copied, staged, error = _sockets.recv(b.fileno(), _HEADER.pack(1, 3, 8, 4, 9),
                                          np.zeros(8, np.uint8), stage, 0.0, 1.0)
    # the read stops at the expected message's length: the rest stays in the socket
    assert (copied, staged, error) == (-2, 40, 0) and bytes(stage[:40]) == other
    assert b.recv(100) == _message(3, b"12345678")


def test_a_header_in_pieces_and_a_late_payload(socket_pair):
    a, b = socket_pair
    whole = _message(3, bytes(range(100)))
    header, y = whole[:32], np.zeros(100, np.uint8)

    def trickle() -> None:
        for piece in (whole[:10], whole[10:40], whole[40:]):
            time.sleep(0.02)
            a.sendall(piece)

    writer = threading.Thread(target=trickle)
    writer.start()
    assert _sockets.recv(b.fileno(), header, y, bytearray(64), 1e-4, 5.0) == (100, 0, 0)
    writer.join()
    assert bytes(y) == bytes(range(100))


def test_nothing_in_time_and_a_closed_peer(socket_pair):
    a, b = socket_pair
    header, y, stage = _HEADER.pack(1, 3, 8, 4, 9), np.zeros(8, np.uint8), bytearray(64)
    a.sendall(header[:5])
    assert _sockets.recv(b.fileno(), header, y, stage, 0.0, 0.01) == (-1, 5, 0)
    a.close()
    assert _sockets.recv(b.fileno(), header, y, stage, 0.0, 1.0) == (-1, 0, -1)


def test_an_exchange_and_its_reduction(socket_pair):
    a, b = socket_pair
    header = _HEADER.pack(1, 8, 8, 4, 9)
    mine, theirs = np.array([1.0, np.nan], np.float32), np.array([2.0, 5.0], np.float32)
    a.sendall(header + theirs.tobytes())
    blocks = np.zeros((1, 2), np.float32)
    assert _sockets.exchange((b.fileno(),), header, mine, blocks, (bytearray(64),), 0.0,
                             1.0) is None  # all done
    assert a.recv(100) == header + mine.tobytes() and (blocks[0] == theirs).all()
    out = np.empty_like(mine)
    _sockets.reduce(blocks, mine, 1, out, 2, 2)  # float32 (code 2), max (code 2), rank 1
    assert out[0] == 2.0 and np.isnan(out[1])
    _sockets.reduce(blocks, mine, 0, mine, 2, 0)  # in place, sum
    assert mine[0] == 3.0
    # both in one call (tcp's small all_reduce), in place, sum, as rank 1: theirs + mine
    a.sendall(header + theirs.tobytes())
    assert _sockets.exchange((b.fileno(),), header, mine, blocks, (bytearray(64),), 0.0,
                             1.0, (mine, None, 1, 2, 0)) is None
    assert a.recv(100) == header + np.array([3.0, np.nan], np.float32).tobytes()
    assert mine[0] == 5.0 and np.isnan(mine[1])


def test_an_exchange_that_meets_another_message_says_where_it_stopped(socket_pair):
    a, b = socket_pair
    header, other = _HEADER.pack(1, 8, 8, 4, 9), _message(2, b"abcdefgh")
    a.sendall(other)
    stage = bytearray(64)
    stopped = _sockets.exchange((b.fileno(),), header, np.zeros(8, np.uint8),
                                np.zeros((1, 8), np.uint8), (stage,), 0.0, 1.0)
    # (sent, send's errno, copied, staged, error): its message went; another one came
    assert stopped == ((40, 0, -2, 40, 0),) and bytes(stage[:40]) == other
    out = np.full(8, 7, np.uint8)  # where it stops, nothing is reduced
    a.sendall(other)
    assert _sockets.exchange((b.fileno(),), header, np.zeros(8, np.uint8),
                             np.zeros((1, 8), np.uint8), (stage,), 0.0, 1.0, (out, None, 0, 8, 0))
    assert (out == 7).all()


JOB = """
import sys, time
import numpy as np
import tbcoll
from tbcoll.transports.tcp import native as tcp_native
from tbcoll.transports.tcp import transport as tcp

if "python" in sys.argv:  # as where the extension was not built
    tcp._sockets = tcp_native._sockets = None
comm = tbcoll.init()
r, p = comm.rank, comm.size
for dtype in (np.float32, np.float64, np.int64, np.float16):
    for op, reduce in (("sum", np.add), ("max", np.maximum)):
        for n in (0, 1, 5, 3000, 70000):  # 70000 of 8 B: past the native's 256 KiB at np=3
            x = (np.arange(n) % 5 + r).astype(dtype)
            expected = x - r
            for k in range(1, p):
                expected = reduce(expected, (np.arange(n) % 5 + k).astype(dtype))
            assert (comm.all_reduce(x, op=op) == expected).all(), (dtype, op, n)
            comm.all_reduce(x, op=op, out=x)  # in place
            assert (x == expected).all(), (dtype, op, n)
# tcp's native asked for 12 MB: more than a socket takes at once, so C's sends stop part-way
big = np.arange(3 << 20, dtype=np.float32)
assert (comm.all_reduce(big + r, algorithm="native") == p * big + sum(range(p))).all()
# large messages: at np=2 in halves (tcp_native._halves), in place and out of it; an odd
# count (one exchange); the widths of float16 and float64
for n, dtype, op in (((1 << 19) + 2, np.float32, "sum"), ((1 << 19) + 1, np.float32, "max"),
                     (1 << 18, np.float64, "min"), (1 << 20, np.float16, "sum")):
    x = (np.arange(n) % 7 + r).astype(dtype)
    expected = np.arange(n) % 7
    for k in range(1, p):
        expected = getattr(np, {"sum": "add", "max": "maximum", "min": "minimum"}[op])(
            expected.astype(dtype), (np.arange(n) % 7 + k).astype(dtype))
    assert (comm.all_reduce(x, op=op) == expected).all(), (n, dtype, op)
    comm.all_reduce(x, op=op, out=x)
    assert (x == expected).all(), (n, dtype, op)
# point to point beside it: another tag first, then a large message, then a slow sender
if r == 0:
    comm.send(np.full(3, 1.0), 1, tag=1)
    comm.send(np.full(3, 2.0), 1, tag=2)
    comm.send(np.arange(1 << 20, dtype=np.float64), 1, tag=3)
    time.sleep(0.2)
    comm.send(np.full(2, 5.0), 1, tag=4)
elif r == 1:
    assert comm.recv(np.empty(3), 0, tag=2).tolist() == [2.0] * 3
    assert comm.recv(np.empty(3), 0, tag=1).tolist() == [1.0] * 3
    assert (comm.recv(np.empty(1 << 20), 0, tag=3) == np.arange(1 << 20)).all()
    assert comm.recv(np.empty(2), 0, tag=4).tolist() == [5.0, 5.0]
# a rank late to the call: its peers' C waits run out, part-way through sending 32 MB to it,
# and the engine goes on
if r == p - 1:
    time.sleep(0.2)
late = comm.all_reduce(np.full(4 << 20, r + 0.5), algorithm="native")
assert (late == late[0]).all()
if "c" in sys.argv:
    lane_moves(comm)
    lane_paths(comm)
print(late[:1].tolist())
"""

# The Lane (tbcoll/transports/tcp/tcp_lane.c) takes a small plain all_reduce whole, in C; where
# the engine holds something for a peer it leaves the call to the Python path; where a peer is
# late its exchange stops and the engine finishes it. Which Python functions ran, seen by
# sys.setprofile, tells which path each call took.
LANE = """
def ran(call, methods=("all_reduce",)):
    # call's result, and the Python functions that ran in it: less the call itself, the
    # Communicator's methods (the route) and the engine's words, published after the engine
    # was used, none where C did it all
    names = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name)
                   if event == "call" else None)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, set(names) - {"<lambda>", "publish_words", *methods}

def lane_paths(comm):
    from tbcoll.core._gate import LaneCall
    r, p = comm.rank, comm.size
    assert isinstance(comm._routes.lane, LaneCall)  # around tcp's lane
    assert comm._all_reduce.__self__.first == comm._routes.lane.all_reduce  # (its route's)

    def in_c(call, check):
        # a call seen to run in C alone on every rank, every result checked (a peer later
        # than C waits, 50 ms, has the engine finish the call, and a message of the call read
        # early by the engine, as the Python path reads whatever has come, has the Python path
        # take it: on a busy machine, then every rank tries again)
        for _ in range(20):
            result, names = ran(call)
            assert check(result), result
            if comm.all_reduce(np.array(len(names)), "max") == 0:
                return
        raise AssertionError(f"the Lane never took the whole call: {names} ran")

    total = sum(range(p))
    for x in (np.array(r, np.float32), np.full((2, 3), r, np.int32), np.full(5, r, np.float64)):
        in_c(lambda: comm.all_reduce(x), lambda y: (y == total).all() and y.shape == x.shape)
    x, out = np.full(4, r, np.int64), np.empty(4, np.int64)
    in_c(lambda: comm.all_reduce(x, "max", out=out), lambda y: y is out and (y == p - 1).all())
    # a peer late to a small call: C's wait runs out, and the engine finishes the call
    if r == p - 1:
        time.sleep(0.3)
    result, names = ran(lambda: comm.all_reduce(x, "min"))
    assert (result == 0).all(), result
    assert (r == p - 1) == ("_finish" not in names), names
    in_c(lambda: comm.all_reduce(x), lambda y: (y == total).all())
    # a receive posted from a peer: the engine holds something, so Python's path runs (and
    # after this non-blocking call, every call takes the progress thread's queue: routes.queued)
    peer = (r + 1) % p
    request = comm.irecv(np.empty(3), (r - 1) % p, tag=5)
    comm.barrier()
    result, names = ran(lambda: comm.all_reduce(x))
    assert (result == total).all() and "direct_all_reduce" in names, names
    comm.send(np.full(3, r, np.float64), peer, tag=5)
    assert (request.wait() == (r - 1) % p).all()


def lane_moves(comm):
    # send and recv through the Lane too (its move, LaneCall's send and recv): a ping-pong
    # whole in C; a sender later than C's wait has the engine finish the receive C began
    r, p = comm.rank, comm.size
    lane = comm._routes.lane
    assert comm._send.__self__.first == lane.send and comm._recv.__self__.first == lane.recv
    moves = ("send", "recv")

    for value in range(20):  # whole in C on both ranks, once at least (a busy machine: again)
        x, into = np.full((2, 3), value, np.float32), np.empty((2, 3), np.float32)
        if r == 0:
            _, sent = ran(lambda: comm.send(x, 1, tag=6), moves)
            got, received = ran(lambda: comm.recv(into, 1, tag=7), moves)
            assert (got == value + 1).all() and got.shape == (2, 3), got
        elif r == 1:
            got, received = ran(lambda: comm.recv(into, 0, tag=6), moves)
            assert (got == value).all(), got
            _, sent = ran(lambda: comm.send(got + 1, 0, tag=7), moves)
        else:
            sent = received = set()
        if comm.all_reduce(np.array(len(sent | received)), "max") == 0:
            break
    else:
        raise AssertionError(f"send and recv never whole in C: {sent | received} ran")
    if r == 0:
        time.sleep(0.3)
        comm.send(np.arange(4.0), 1)
    elif r == 1:
        into = np.empty(4)
        got, names = ran(lambda: comm.recv(into, 0), moves)
        assert got.tolist() == [0.0, 1.0, 2.0, 3.0] and "finish_recv" in names, names
"""
JOB = JOB.replace("comm = tbcoll.init()", LANE + "comm = tbcoll.init()")


@pytest.mark.parametrize("ranks, path", [(2, "c"), (3, "c"), (2, "python")])
def test_small_messages_through_c_and_back(script, ranks, path):
    p = tbrun("-np", ranks, "--backend", "tcp", script(JOB), path, timeout=120)
    assert p.returncode == 0, p.stderr
    total = sum(k + 0.5 for k in range(ranks))
    assert [lines[-1] for lines in tagged_lines(p.stdout).values()] == [f"[{total}]"] * ranks
