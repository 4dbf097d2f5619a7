"""The C extensions' buffers (tbcoll/include/buffers.h): a call takes all its buffers or none.
Each call below with one buffer refused (read-only where it writes, not a buffer at all)
raises the buffer protocol's error, and leaves none of its other buffers exported (a
bytearray still exported cannot be resized); so does a call that succeeds."""


import pytest

from tbcoll.transports.mpi import _gathered
from tbcoll.transports.shm import _atomics
from tbcoll.transports.stream import HEADER as _HEADER
from tbcoll.transports.tcp import _sockets

READ, WRITE = "read", "write"


def _calls(fd: int) -> dict:
    """name: (function, arguments with bytearrays for buffers, {index: READ or WRITE})"""
    header = _HEADER.pack(1, 3, 8, 4, 9)  # 8 payload bytes
    B = bytearray
    return {
        "put_call": (_gathered.put_call, [B(16), 7, B(8)], {0: WRITE, 2: READ}),
        "gathered_reduce": (_gathered.gathered_reduce, [B(32), 16, 2, 8, B(8), 4, 0],
                            {0: READ, 4: WRITE}),
        "ring_send": (_atomics.ring_send, [B(1024), 0, 64, B(header), B(8), 0.0],
                      {0: WRITE, 3: READ, 4: READ}),
        "ring_recv": (_atomics.ring_recv, [B(1024), 0, 64, B(header), B(8), 0.0],
                      {0: WRITE, 3: READ, 4: WRITE}),
        "send": (_sockets.send, [fd, B(header), B(8)], {1: READ, 2: READ}),
        "recv": (_sockets.recv, [fd, B(header), B(8), B(64), 0.0, 0.0],
                 {1: READ, 2: WRITE, 3: WRITE}),
        "reduce": (_sockets.reduce, [B(8), B(8), 0, B(8), 4, 0], {0: READ, 1: READ, 3: WRITE}),
    }


def _exported(args: list) -> list:
    """The bytearrays among args that a buffer still holds."""
    held = []
    for a in args:
        if isinstance(a, bytearray):
            try:
                a.append(0)
                a.pop()
            except BufferError:
                held.append(a)
    return held


@pytest.mark.parametrize("name", list(_calls(-1)))
def test_a_refused_buffer_leaves_none_held(socket_pair, name):
    function, args, buffers = _calls(socket_pair[0].fileno())[name]
    function(*args)
    assert not _exported(args), f"{name} kept a buffer after it succeeded"
    for index, way in buffers.items():
        for refused, error in [(5, TypeError)] + [(bytes(8), BufferError)] * (way == WRITE):
            given = list(args)
            given[index] = refused
            with pytest.raises(error):
                function(*given)
            assert not _exported(given), f"{name} kept a buffer when argument {index} failed"


def test_an_exchange_with_a_refused_buffer_leaves_none_held(socket_pair):
    fd = socket_pair[0].fileno()
    header, B = _HEADER.pack(1, 3, 8, 4, 9), bytearray
    args = [(fd, fd), B(header), B(8), B(16), (B(64), B(64)), 0.0, 0.0, (B(8), None, 0, 4, 0)]

    def every_bytearray(given):
        return [a for g in given for a in (g if isinstance(g, tuple) else (g,))]

    # read: the header and mine; written: the blocks, each stage, the reduction's out
    for where in [(1,), (2,), (3,), (4, 0), (4, 1), (7, 0)]:
        given = list(args)
        if len(where) == 1:
            given[where[0]] = bytes(8) if where[0] == 3 else 5
        else:
            inner = list(given[where[0]])
            inner[where[1]] = bytes(8)
            given[where[0]] = tuple(inner)
        with pytest.raises((TypeError, BufferError)):
            _sockets.exchange(*given)
        assert not _exported(every_bytearray(given)), where
