"""Blocking socket helpers shared by the store and the transports: exact reads, framed fields.

Every length read from a peer is checked against a bound before anything is allocated.
"""

from __future__ import annotations

import socket
import struct

_LEN = struct.Struct("!I")


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes; raise ConnectionError if the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def pack_fields(*fields: bytes) -> bytes:
    """Length-prefix each field: u32 big-endian length, then the bytes."""
    return b"".join(_LEN.pack(len(f)) + f for f in fields)


def recv_fields(sock: socket.socket, count: int, max_len: int) -> list[bytes]:
    """Read `count` length-prefixed fields, refusing any longer than max_len."""
    fields = []
    for _ in range(count):
        (n,) = _LEN.unpack(recv_exactly(sock, _LEN.size))
        if n > max_len:
            raise ConnectionError(f"field of {n} bytes exceeds the limit of {max_len}")
        fields.append(recv_exactly(sock, n))
    return fields
