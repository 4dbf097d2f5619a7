"""The rendezvous store: a small key-value service that tbrun serves and ranks use to meet.

Ranks exchange addresses and small facts through it (set/get/wait/add/delete on bytes keys,
and first: set unless set, so that the first of several proposals is the one every rank reads).
The wire format is binary and length-prefixed; nothing read from it is ever unpickled. A
connection first runs the HMAC handshake of tbcoll.job.auth; one that fails is logged and closed.

Request:  op u8, timeout_ms u32, nfields u16, then nfields x (u32 length, bytes)
Response: status u8, then one field (u32 length, bytes)
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable

from tbcoll.core.errors import AuthenticationError, RendezvousError, TbcollError
from tbcoll.core.wire import pack_fields, recv_exactly, recv_fields
from tbcoll.job.auth import HANDSHAKE_TIMEOUT, Busy, Doorman, accept_handshake, connect_proven
from tbcoll.job.env import DEFAULT_TIMEOUT, LaunchInfo, format_hostport, launch_info

_REQUEST = struct.Struct("!BIH")
_STATUS = struct.Struct("!B")
_SET, _GET, _WAIT, _ADD, _DELETE, _FIRST = range(1, 7)
_FIELDS = {_SET: (2, 2), _GET: (1, 1), _WAIT: (1, 4096), _ADD: (2, 2), _DELETE: (1, 1),
           _FIRST: (2, 2)}
_OK, _TIMEOUT, _BAD = range(3)
_MAX_FIELD = 64 << 20
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

Key = str | bytes


def _b(value: Key) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


_PEER_FAILURE = "tbrun/peer-failure/{}"  # a rank failing because of peers tells tbrun
_REPORT_TIMEOUT = 2.0


def tell_tbrun(key: str, value: Key, timeout: float = _REPORT_TIMEOUT,
               store: Store | None = None) -> None:
    """Set key (formatted with this rank) to value in tbrun's store, through store or a
    connection of its own. Nothing happens outside a tbrun job, and a store that cannot be
    reached is no reason for another error: the caller is failing already, or reporting."""
    try:
        info = launch_info()
        if info is None:
            return
        if store is not None:
            store.set(key.format(info.rank), value)
            return
        with Store(*info.store, info.token, timeout=timeout, connect_timeout=timeout) as own:
            own.set(key.format(info.rank), value)
    except (OSError, TbcollError):
        pass


def report_peer_failure(what: str, peers: tuple[int, ...]) -> None:
    """Tell tbrun that this rank is failing because of peers (world ranks; what: the error),
    so that tbrun names them, not this rank."""
    tell_tbrun(_PEER_FAILURE, ",".join(map(str, peers)) + "\n" + what)


class StoreServer:
    """Serve the store on host:port (0: any free port) from background threads.

    hosts may name several local addresses (one per network the ranks reach tbrun by, e.g.
    loopback and the link to each remote host); all of them listen on the same port.
    """

    def __init__(self, token: str, hosts: str | Iterable[str] = "127.0.0.1", port: int = 0,
                 log: Callable[[str], None] = lambda msg: None, clients: int = 0) -> None:
        """clients: how many ranks may connect at once (the doorman lets twice as many in
        their handshake at a time, and at least 64)."""
        self._token = token
        self._log = log
        self._data: dict[bytes, bytes] = {}
        # key prefix -> what takes the values set under it instead of the table (divert)
        self._diverted: dict[bytes, Callable[[bytes, bytes], None]] = {}
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._doorman = Doorman(limit=max(64, 2 * clients))
        self._last_flood_log = 0.0
        hosts = [hosts] if isinstance(hosts, str) else list(dict.fromkeys(hosts))
        self._listeners = _listen_on_one_port(hosts, port)
        self.address: tuple[str, int] = self._listeners[0].getsockname()[:2]
        self.port = self.address[1]

    def peer_failure(self, rank: int) -> tuple[str, tuple[int, ...]] | None:
        """What rank reported before failing because of peers (report_peer_failure): the
        error, and those peers; None if it reported nothing."""
        with self._changed:
            value = self._data.get(_PEER_FAILURE.format(rank).encode())
        if value is None:
            return None
        peers, _, what = value.decode(errors="replace").partition("\n")
        return what, tuple(int(p) for p in peers.split(",") if p.isascii() and p.isdigit())

    def divert(self, prefix: Key, sink: Callable[[bytes, bytes], None]) -> None:
        """Hand the values that clients set under keys starting with prefix to sink(key,
        value), from the thread that serves the client, instead of keeping them: what
        streams (tbrun --trace's chunks) then holds no memory here. The client's set returns
        once sink has."""
        self._diverted[_b(prefix)] = sink

    def set(self, key: Key, value: Key) -> None:
        """Set key here, in tbrun's own process, as a client's set would."""
        with self._changed:
            self._data[_b(key)] = _b(value)
            self._changed.notify_all()

    def _sink_of(self, key: bytes) -> Callable[[bytes, bytes], None] | None:
        return next((sink for prefix, sink in self._diverted.items() if key.startswith(prefix)),
                    None)

    def get(self, key: Key) -> bytes | None:
        """The value of key now (None: unset), read here in tbrun's own process."""
        with self._changed:
            return self._data.get(_b(key))

    def wait(self, keys: Iterable[Key], timeout: float) -> bool:
        """Wait here until every key is set (True) or timeout seconds have passed (False)."""
        wanted = [_b(k) for k in keys]
        with self._changed:
            return self._changed.wait_for(lambda: all(k in self._data for k in wanted),
                                          timeout=timeout)

    def start(self) -> StoreServer:
        for listener in self._listeners:
            threading.Thread(target=self._accept_loop, args=(listener,), name="tbcoll-store",
                             daemon=True).start()
        return self

    def close(self) -> None:
        """Stop accepting and hang up on every client, so that their waits end now."""
        self._closed.set()
        for listener in self._listeners:
            listener.close()
        with self._changed:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self, listener: socket.socket) -> None:
        """Accept until closed. Out of descriptors (EMFILE: macOS allows 256 by default) or
        past the doorman's limit, stale connections that never proved the token give way
        (tbcoll.job.auth.Doorman): idle connections from anyone cannot lock the ranks out."""
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES or self._closed.is_set():
                    return  # listener closed
                if self._doorman.drop_stale():
                    self._note_flood(f"out of file descriptors ({e.strerror}): dropped the "
                                     "oldest connection that never proved the token")
                else:
                    time.sleep(0.05)  # the kernel keeps the newcomers queued meanwhile
                continue
            if not self._doorman.admit(conn):
                self._note_flood(f"{self._doorman.limit} connections have not proven the "
                                 f"token: turned away {format_hostport(*peer[:2])}")
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _note_flood(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_flood_log > 1.0:  # a line a second, however hard the flood
            self._last_flood_log = now
            self._log(f"store: {message}")

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        with self._changed:
            self._conns.add(conn)
        try:
            self._converse(conn, peer)
        finally:
            with self._changed:
                self._conns.discard(conn)
            self._doorman.done(conn)
            conn.close()

    def _converse(self, conn: socket.socket, peer: tuple) -> None:
        where = format_hostport(*peer[:2])
        conn.settimeout(HANDSHAKE_TIMEOUT)
        try:
            accept_handshake(conn, self._token)
        except AuthenticationError as e:  # a wrong token, or bytes that are no handshake
            self._log(f"refused a store connection from {where}: {e}")
            return
        except OSError:  # it hung up or stayed silent (a rank torn down, a flood): no news
            return
        if not self._doorman.done(conn):
            return  # dropped as stale while it was proving itself
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                op, timeout_ms, nfields = _REQUEST.unpack(recv_exactly(conn, _REQUEST.size))
                lo, hi = _FIELDS.get(op, (1, 0))
                if not lo <= nfields <= hi:
                    conn.sendall(_STATUS.pack(_BAD) + pack_fields(b"malformed request"))
                    return
                fields = recv_fields(conn, nfields, _MAX_FIELD)
                status, payload = self._apply(op, fields, timeout_ms / 1000)
                conn.sendall(_STATUS.pack(status) + pack_fields(payload))
        except (ConnectionError, OSError):
            return  # the rank went away; nothing to clean up

    def _apply(self, op: int, fields: list[bytes], timeout: float) -> tuple[int, bytes]:
        if op == _SET and (sink := self._sink_of(fields[0])) is not None:
            sink(fields[0], fields[1])
            return _OK, b""
        with self._changed:
            if op == _SET:
                self._data[fields[0]] = fields[1]
                self._changed.notify_all()
                return _OK, b""
            if op == _ADD:
                try:
                    value = int(self._data.get(fields[0], b"0")) + int(fields[1])
                except ValueError:
                    return _BAD, b"add on a key that does not hold an integer"
                self._data[fields[0]] = str(value).encode()
                self._changed.notify_all()
                return _OK, self._data[fields[0]]
            if op == _DELETE:
                return _OK, b"1" if self._data.pop(fields[0], None) is not None else b"0"
            if op == _FIRST:
                if fields[0] not in self._data:
                    self._data[fields[0]] = fields[1]
                    self._changed.notify_all()
                return _OK, self._data[fields[0]]
            present = self._changed.wait_for(
                lambda: all(k in self._data for k in fields), timeout=timeout)
            if not present:
                return _TIMEOUT, b""
            return _OK, self._data[fields[0]] if op == _GET else b""


def _listen_on_one_port(hosts: list[str], port: int, attempts: int = 20) -> list[socket.socket]:
    """A listening socket on each host, all with the same port (the first free one if 0)."""
    for _ in range(attempts):
        listeners: list[socket.socket] = []
        try:
            for host in hosts:
                listener = socket.create_server((host, port or _port_of(listeners)), backlog=512)
                listener.settimeout(0.25)
                listeners.append(listener)
            return listeners
        except OSError as e:
            for listener in listeners:
                listener.close()
            # Only a port chosen for the first address and taken on a later one is a race.
            if port or not listeners or e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no port free on all of {', '.join(hosts)}")


def _port_of(listeners: list[socket.socket]) -> int:
    return listeners[0].getsockname()[1] if listeners else 0


class _Unset(RendezvousError):
    """A wait for keys timed out: they are not set."""


class Store:
    """Client of the rendezvous store; safe to share between threads."""

    def __init__(self, host: str, port: int, token: str, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 30.0) -> None:
        self.address = format_hostport(host, port)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock = self._connect(host, port, token, connect_timeout)

    @classmethod
    def from_launch(cls, info: LaunchInfo) -> Store:
        """Connect to the store that tbrun serves for this job."""
        return cls(*info.store, info.token, timeout=info.timeout)

    def set(self, key: Key, value: Key) -> None:
        self._request(_SET, [_b(key), _b(value)], 0)

    def get(self, key: Key, timeout: float | None = None) -> bytes:
        """Return the value of key, waiting for some rank to set it."""
        return self._request(_GET, [_b(key)], timeout)

    def peek(self, key: Key) -> bytes | None:
        """The value of key now; None while no rank has set it."""
        try:
            return self._request(_GET, [_b(key)], 0.0)
        except _Unset:
            return None

    def wait(self, keys: Iterable[Key], timeout: float | None = None) -> None:
        """Block until every key is set."""
        self._request(_WAIT, [_b(k) for k in keys], timeout)

    def add(self, key: Key, delta: int = 1) -> int:
        """Atomically add delta to the integer at key (0 if unset); return the new value."""
        return int(self._request(_ADD, [_b(key), str(int(delta)).encode()], 0))

    def delete(self, key: Key) -> bool:
        return self._request(_DELETE, [_b(key)], 0) == b"1"

    def first(self, key: Key, value: Key) -> bytes:
        """Set key to value unless some rank has set it already; return the value it holds:
        of several ranks' proposals, the first, the same for all of them."""
        return self._request(_FIRST, [_b(key), _b(value)], 0)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, host: str, port: int, token: str, connect_timeout: float) -> socket.socket:
        try:
            sock = connect_proven((host, port), token, time.monotonic() + connect_timeout,
                                  retry_refused=True)
        except (ConnectionRefusedError, TimeoutError) as e:
            raise RendezvousError(f"cannot reach the rendezvous store at {self.address} ({e}); "
                                  "is tbrun still running?") from e
        except Busy as e:
            raise RendezvousError(f"the rendezvous store at {self.address} kept turning us "
                                  f"away ({e}): is something flooding it?") from e
        except (AuthenticationError, OSError) as e:
            raise RendezvousError(
                f"the rendezvous store at {self.address} refused us: {e}") from e
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _request(self, op: int, fields: list[bytes], timeout: float | None) -> bytes:
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            try:
                # The server answers TIMEOUT itself; the socket deadline only catches a dead server.
                self._sock.settimeout(wait + 30.0)
                self._sock.sendall(_REQUEST.pack(op, int(wait * 1000), len(fields))
                                   + pack_fields(*fields))
                (status,) = _STATUS.unpack(recv_exactly(self._sock, _STATUS.size))
                (payload,) = recv_fields(self._sock, 1, _MAX_FIELD)
            except (ConnectionError, OSError) as e:
                raise RendezvousError(
                    f"lost the rendezvous store at {self.address} ({e}); did tbrun exit?") from e
        if status == _TIMEOUT:
            names = ", ".join(repr(f.decode(errors="replace")) for f in fields)
            raise _Unset(
                f"timed out after {wait:g} s waiting for store key(s) {names} at {self.address}")
        if status != _OK:
            raise RendezvousError(f"the store rejected the request: {payload.decode()}")
        return payload
