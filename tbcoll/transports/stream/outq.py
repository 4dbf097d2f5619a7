"""How many bytes a socket's kernel still holds that its peer has not acknowledged: what a
stream's Tail (tbcoll.transports.stream.replay) must keep for a failover's replay."""

from __future__ import annotations

import fcntl
import socket
import struct
import sys
import termios

_COUNT = struct.Struct("i")
# Linux: SIOCOUTQ, which is TIOCOUTQ (bytes sent and not acknowledged, plus those not sent);
# macOS: getsockopt SO_NWRITE (0x1024), which counts the same
_SO_NWRITE = 0x1024
UNKNOWN = 1 << 62  # a socket that will not tell: keep all a Tail may


def unacked_bytes(sock: socket.socket) -> int:
    """sock's unacknowledged bytes (UNKNOWN where the system will not tell)."""
    try:
        if sys.platform == "darwin":
            return sock.getsockopt(socket.SOL_SOCKET, _SO_NWRITE)
        got = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, _COUNT.pack(0))
        return _COUNT.unpack(got)[0]
    except (OSError, AttributeError):
        return UNKNOWN
