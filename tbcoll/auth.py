"""Mutual HMAC challenge-response, run on every new connection before any data is read.

Each side sends a random nonce and answers the other's with HMAC-SHA256(token, role + nonce),
so the token itself never travels and an answer cannot be replayed on another connection.
The accepting side reads nothing but the fixed-size answer until the peer has proved itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket

from tbcoll.errors import AuthenticationError
from tbcoll.wire import recv_exactly

_MAGIC = b"TBCOLL1\n"
_NONCE = 32
_DIGEST = 32


def new_token() -> str:
    """A fresh per-job secret for TBCOLL_TOKEN."""
    return secrets.token_hex(32)


def _proof(token: str, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), role + nonce, hashlib.sha256).digest()


def accept_handshake(sock: socket.socket, token: str) -> None:
    """Authenticate the peer that connected to us; raise AuthenticationError if it cannot."""
    nonce = secrets.token_bytes(_NONCE)
    sock.sendall(_MAGIC + nonce)
    try:
        answer = recv_exactly(sock, _DIGEST + _NONCE)
    except ConnectionError as e:
        raise AuthenticationError(f"peer hung up during the handshake ({e})") from None
    if not hmac.compare_digest(answer[:_DIGEST], _proof(token, b"client", nonce)):
        raise AuthenticationError("peer does not know this job's TBCOLL_TOKEN")
    sock.sendall(_proof(token, b"server", answer[_DIGEST:]))


def connect_handshake(sock: socket.socket, token: str) -> None:
    """Prove our token to the side we connected to, and check that it knows it too."""
    try:
        hello = recv_exactly(sock, len(_MAGIC) + _NONCE)
        if not hello.startswith(_MAGIC):
            raise AuthenticationError("the peer is not a tbcoll endpoint (bad greeting)")
        nonce = secrets.token_bytes(_NONCE)
        sock.sendall(_proof(token, b"client", hello[len(_MAGIC):]) + nonce)
        answer = recv_exactly(sock, _DIGEST)
    except ConnectionError:
        raise AuthenticationError(
            "the peer closed the connection during the handshake: it refused our TBCOLL_TOKEN"
        ) from None
    if not hmac.compare_digest(answer, _proof(token, b"server", nonce)):
        raise AuthenticationError("the peer does not know this job's TBCOLL_TOKEN")
