"""Mutual HMAC challenge-response, run on every new connection before any data is read.

Each side sends a random nonce and answers the other's with HMAC-SHA256(token, role + nonce),
so the token itself never travels and an answer cannot be replayed on another connection.
The accepting side reads nothing but the fixed-size answer until the peer has proved itself.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from tbcoll.core.errors import AuthenticationError
from tbcoll.core.wire import recv_exactly

_MAGIC = b"TBCOLL1\n"
_NONCE = 32
_DIGEST = 32


def new_token() -> str:
    """A fresh per-job secret for TBCOLL_TOKEN (os.urandom, as secrets.token_hex)."""
    return os.urandom(32).hex()


def _proof(token: str, role: bytes, nonce: bytes) -> bytes:
    return _hmac().new(token.encode(), role + nonce, "sha256").digest()


def _same(answer: bytes, expected: bytes) -> bool:
    return _hmac().compare_digest(answer, expected)


def _hmac():
    """hmac, imported at the first handshake: tbrun starts its ranks before any connects to its
    store (hmac brings in hashlib and OpenSSL: ~3 ms of tbrun's start-up)."""
    import hmac

    return hmac


def accept_handshake(sock: socket.socket, token: str) -> None:
    """Authenticate the peer that connected to us; raise AuthenticationError if it cannot,
    ConnectionError if it hung up first (a rank killed as it connected: no news)."""
    nonce = os.urandom(_NONCE)
    sock.sendall(_MAGIC + nonce)
    answer = recv_exactly(sock, _DIGEST + _NONCE)
    if not _same(answer[:_DIGEST], _proof(token, b"client", nonce)):
        raise AuthenticationError("peer does not know this job's TBCOLL_TOKEN")
    sock.sendall(_proof(token, b"server", answer[_DIGEST:]))


def connect_handshake(sock: socket.socket, token: str) -> None:
    """Prove our token to the side we connected to, and check that it knows it too.

    A connection closed before the greeting raises ConnectionError: the other side was too
    busy to talk (see Doorman), and the caller may try again; a refusal after it is an
    AuthenticationError."""
    hello = recv_exactly(sock, len(_MAGIC) + _NONCE)
    try:
        if not hello.startswith(_MAGIC):
            raise AuthenticationError("the peer is not a tbcoll endpoint (bad greeting)")
        nonce = os.urandom(_NONCE)
        sock.sendall(_proof(token, b"client", hello[len(_MAGIC):]) + nonce)
        answer = recv_exactly(sock, _DIGEST)
    except ConnectionError:
        raise AuthenticationError(
            "the peer closed the connection during the handshake: it refused our TBCOLL_TOKEN"
        ) from None
    if not _same(answer, _proof(token, b"server", nonce)):
        raise AuthenticationError("the peer does not know this job's TBCOLL_TOKEN")


HANDSHAKE_TIMEOUT = 10.0


class Busy(ConnectionError):
    """The other side kept turning us away before its greeting until the deadline."""


def connect_proven(address: tuple[str, int], token: str, deadline: float,
                   retry_refused: bool = False,
                   answer_within: float | None = None) -> socket.socket:
    """Connect to address and prove the token (connect_handshake), trying again while the
    other side turns us away as busy (see Doorman) and, with retry_refused, while nothing
    listens there yet, until deadline (time.monotonic()). Raises the OSError of the connect,
    Busy, or AuthenticationError (a refusal, or a handshake that failed otherwise).
    answer_within: at most this long for each connect to be answered (one path of several:
    one that does not answer is given up for the next, tbcoll.transports.socket_mesh)."""
    while True:
        left = deadline - time.monotonic()
        wait = left if answer_within is None else min(left, answer_within)
        try:
            sock = socket.create_connection(address, timeout=max(wait, 0.1))
        except (ConnectionRefusedError, TimeoutError):
            if not retry_refused or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            sock.settimeout(max(0.1, min(HANDSHAKE_TIMEOUT, left)))
            connect_handshake(sock, token)
            return sock
        except ConnectionError as e:  # closed before the greeting: busy
            sock.close()
            if time.monotonic() >= deadline:
                raise Busy(f"turned away until the deadline ({e})") from e
            time.sleep(0.05)
        except AuthenticationError:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            raise AuthenticationError(f"the handshake failed: {e.strerror or e}") from e


class Doorman:
    """Admission for connections that have not yet proven the token, so that idle ones from
    anyone cannot lock a job's own out: at most `limit` at once; past that, or when out of
    descriptors, the oldest gives way if it has had `stale` seconds (a rank proves itself
    in milliseconds), else the newcomer is closed before the greeting, which
    connect_handshake reports as ConnectionError: busy, try again."""

    def __init__(self, limit: int = 64, stale: float = 2.0) -> None:
        self.limit, self.stale = limit, stale
        self._lock = threading.Lock()
        self._waiting: dict[socket.socket, float] = {}  # oldest first

    def admit(self, sock: socket.socket) -> bool:
        """Whether sock may run its handshake now (if not, it has been closed)."""
        with self._lock:
            crowded = len(self._waiting) >= self.limit
        if crowded and not self.drop_stale():
            sock.close()
            return False
        with self._lock:
            self._waiting[sock] = time.monotonic()
        return True

    def drop_stale(self) -> bool:
        """Hang up on the oldest connection in its handshake if it has had `stale` seconds;
        its handshake then fails. Whether one was dropped."""
        with self._lock:
            if not self._waiting:
                return False
            sock, since = next(iter(self._waiting.items()))
            if time.monotonic() - since < self.stale:
                return False
            del self._waiting[sock]
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def done(self, sock: socket.socket) -> bool:
        """sock's handshake ended; False if it had been dropped meanwhile."""
        with self._lock:
            return self._waiting.pop(sock, None) is not None
