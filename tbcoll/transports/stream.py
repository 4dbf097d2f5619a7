"""The message engine shared by the byte-stream transports (tcp, and shm's point-to-point).

Each pair of ranks has one byte stream (a Channel: a TCP socket, or a ring buffer in shared
memory) that offers non-blocking sendmsg and recv_into, raising BlockingIOError when it
cannot move a byte now. On it:

Wire: a message is a 32-byte header (context u32, tag u32, nbytes u64, seq u64, call u64)
and its payload. Receives are matched per (peer, context, tag) in the order messages were
sent. A collective's messages carry its call (seq, its number on the communicator, and call,
its tbcoll.calls signature; a user's messages carry 0, 0): a message of another call than
the one a rank runs, met as it arrives or as a receive takes it, fails the wait with a
CommError naming both calls, where the ranks would otherwise compute with each other's
different calls. A message that
arrives before its receive is posted waits in an 'unexpected' buffer and is copied when the
receive is posted; otherwise its payload is read straight into the destination. Reads go
through a small staging buffer, so one read can bring several small messages, and large
payloads bypass it (recv_into the caller's array).

The engine has no threads of its own: progress happens in isend (an eager first write) and in
waitall, which keeps reading every stream while its sends are stalled. Two ranks sending each
other large messages at once therefore cannot deadlock. Several threads may use one engine (a
communicator each, split from one world, or a progress thread beside the caller): each door
into it (StreamEndpoint, a transport's natives) takes its Turns (tbcoll.transports.turns), and
every method of StreamTransport runs with them held.

Pulled messages (a transport that can copy from another rank's memory: shm on Linux): a large
payload does not go through the stream. Its sender announces it (the header with the context's
_ANNOUNCE bit, then a descriptor: the payload's address, size and a pull id); the receiver
matches the announcement as it would the message, copies the payload from the sender's memory
(_pull) into the receive (or an unexpected buffer: a rank pulls whatever it meets at once, so
that two ranks announcing to each other cannot deadlock) and answers _PULLED with that id. The
send is done only then, so the sender's buffer stays untouched while it is read. Where the copy
is refused (a policy forbids it), the answer asks for the payload, which follows through the
stream (_RESENT) into the receive already matched, and neither side announces to the other
again.

Revocation (tbcoll.CommRevokedError): a rank whose call on a communicator was interrupted (a
KeyboardInterrupt, a signal handler's exception) sends each peer a notice (context _REVOKED,
tag the communicator's first context, payload the line that names the rank and the call)
after whatever it had queued for that peer, so that the streams stay in step; a thread of its
own finishes what cannot go at once. A rank that reads a notice fails every wait on that
communicator's contexts from then on, its own included.
"""

from __future__ import annotations

import struct
import threading
import time
from array import array
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from tbcoll.calls import MISMATCH_ADVICE, NO_CALL, mismatch
from tbcoll.errors import CommError, CommRevokedError, PeerLostError, PeerTimeoutError, revoked
from tbcoll.transports.turns import SHARED_SLICE, Turns
from tbcoll.transports.words import (
    ENGINE_WORD,
    LOST,
    MISMATCH,
    NEXT_PULL_WORD,
    PEER_WORDS,
    POSTED,
    PULLS,
    READING,
    SENDING,
    STATE_WORD,
    UNEXPECTED,
    WORDS_PER_PEER,
    WRITING,
)

# The wire, as C describes it too (tbcoll/include/wire.h; tbcoll.wire_check compares the two
# as each C extension is imported): the header's and the descriptor's fields, big-endian
HEADER_FIELDS = (("context", "I"), ("tag", "I"), ("nbytes", "Q"), ("seq", "Q"), ("call", "Q"))
DESCRIPTOR_FIELDS = (("address", "Q"), ("nbytes", "Q"), ("pull", "Q"))  # a pulled message's
_HEADER = struct.Struct("!" + "".join(code for _, code in HEADER_FIELDS))
_DESCRIPTOR = struct.Struct("!" + "".join(code for _, code in DESCRIPTOR_FIELDS))
# Contexts with the top bit set carry the engine's own messages (communicators count from 0):
_ANNOUNCE = 1 << 31  # | the message's context; payload: its _DESCRIPTOR
_PULLED = _ANNOUNCE | 1 << 30  # tag: the pull id; seq: 0 pulled, 1 refused (send it)
_RESENT = _PULLED + 1  # tag: the pull id; payload: the message whose pull was refused
_REVOKED = _PULLED + 2  # tag: a communicator's first context; payload: the notice (UTF-8)
CONTEXTS = {"announce": _ANNOUNCE, "pulled": _PULLED, "resent": _RESENT, "revoked": _REVOKED}
_NOTICE_BYTES = 1024  # a notice longer than this is cut
PULL_IDS = 0xFFFFFFFF  # pull ids count modulo 2**32 (an answer's tag holds one)
_STAGE = 256 << 10  # staging buffer per stream
_DIRECT = 16 << 10  # a payload remainder this large is read straight into its destination


class Channel(Protocol):
    def sendmsg(self, buffers: list[memoryview]) -> int:
        """Write some leading bytes of buffers; BlockingIOError if none fit now."""

    def recv_into(self, view: memoryview) -> int:
        """Read what is there into view; BlockingIOError if nothing is, 0 at end of stream."""

    def close(self) -> None: ...


class _Send:
    __slots__ = ("peer", "views", "done", "error", "pulled", "context")

    def __init__(self, peer: Peer, views: list[memoryview],
                 pulled: np.ndarray | None = None) -> None:
        # pulled: an announced payload, which the receiver copies; done once it says so
        self.peer, self.views, self.done, self.error = peer, views, False, None
        self.pulled = pulled
        self.context = -1  # a message's (isend sets it): a revoked one fails its wait


class _Recv:
    __slots__ = ("peer", "view", "call", "done", "error", "dropped", "context")

    def __init__(self, peer: Peer, view: memoryview, call: tuple[int, int] = NO_CALL,
                 context: int = -1) -> None:
        # error: why it can never complete (a message of another size or call came for it);
        # dropped: that message, read and dropped; the error is raised once it is whole
        self.peer, self.view, self.call, self.done, self.error = peer, view, call, False, None
        self.dropped: _Unexpected | None = None
        self.context = context  # -1: not known (a revoked context fails the others' waits)


class _Unexpected:
    """A message that arrived before its receive was posted."""

    __slots__ = ("data", "call", "done", "waiter")

    def __init__(self, nbytes: int, call: tuple[int, int] = NO_CALL) -> None:
        self.data, self.call, self.done, self.waiter = bytearray(nbytes), call, False, None


class _Notice:
    """A revocation notice being read (see the module docstring)."""

    __slots__ = ("context", "data")

    def __init__(self, context: int, nbytes: int) -> None:
        self.context, self.data = context, bytearray(nbytes)


class _Announced:
    """An announced message's descriptor, as it arrives: then it is matched and pulled."""

    __slots__ = ("context", "tag", "call", "descriptor")

    def __init__(self, context: int, tag: int, call: tuple[int, int]) -> None:
        self.context, self.tag, self.call = context, tag, call
        self.descriptor = bytearray(_DESCRIPTOR.size)


class Peer:
    # No C code reads these: what a C path needs of them is in the engine's words (see
    # StreamTransport.publish_words), where this peer's next pull id is kept (_next_pull).
    def __init__(self, rank: int, channel: Channel) -> None:
        self.rank = rank
        self.channel = channel
        self.words_at = PEER_WORDS + rank * WORDS_PER_PEER  # its StreamTransport.words
        self.sendq: deque[_Send] = deque()
        # by (context, tag); a key is removed with its last entry (publish_words: POSTED)
        self.posted: defaultdict[tuple[int, int], deque[_Recv]] = defaultdict(deque)
        self.unexpected: defaultdict[tuple[int, int], deque[_Unexpected]] = defaultdict(deque)
        self.stage = bytearray(_STAGE)
        self.stage_view = memoryview(self.stage)
        self.start = self.end = 0  # unread bytes are stage[start:end]
        self.target: memoryview | None = None  # payload bytes still to arrive
        self.target_owner: _Recv | _Unexpected | None = None
        self.lost: str | None = None
        self.pulls = False  # large messages to and from this peer are pulled (see above)
        self.announced: dict[int, _Send] = {}  # this rank's announced sends not yet pulled
        self.refused: dict[int, tuple[_Recv | _Unexpected, memoryview]] = {}  # to be resent


def _first(held: dict[tuple[int, int], deque], key: tuple[int, int]) -> _Recv | _Unexpected:
    """Take the first of held[key] (a Peer's posted or unexpected), and the key with it if
    it was the last: a peer holds something exactly when the dict is not empty."""
    queue = held[key]
    first = queue.popleft()
    if not queue:
        del held[key]
    return first


def _failed(request: _Send | _Recv) -> bool:
    """request can never complete, and the message that failed it (if any) has been read
    whole: the stream is in step again for what comes next. (A failed receive raises only
    then: after it a rank may call what moves nothing through the stream, as shm's native
    collectives, and the sender of a message longer than the ring would wait forever.)"""
    if not request.error:
        return False
    dropped = getattr(request, "dropped", None)
    return dropped is None or dropped.done


def bytes_of(buf: np.ndarray) -> memoryview:
    """buf's bytes as a flat memoryview (works for dtypes with no buffer format, e.g. bfloat16)."""
    # flat first: a 2-D view counts rows, not bytes, and a 0-d array has no view of bytes
    return memoryview(buf.reshape(-1).view(np.uint8))


class StreamTransport:
    """Point-to-point messages over one byte stream (Channel) per pair of ranks.

    Subclasses say how to wait for streams to become ready (_ready), and whether that wait
    may run with the engine released (waits_released), and may follow which streams have
    sends pending (_write_interest) and which are gone (_forget). One that can copy from
    another rank's memory (_pull, _address) sets Peer.pulls where it may, and pull_bytes.
    Every method runs with `turns` held by the caller, but new_group, which takes them, and
    publish_words (see there).
    """

    pull_bytes = 0  # payloads at least this large go by pull to a peer that pulls
    # _ready may run with the engine released, by one thread at a time (Turns.wait_released):
    # it touches nothing another thread changes
    waits_released = False
    DESCRIPTOR_BYTES = _DESCRIPTOR.size
    PULL_CONTEXTS = (_ANNOUNCE, _PULLED)  # an announcement's context bit, an answer's context

    def __init__(self, rank: int, size: int, channels: dict[int, Channel],
                 timeout: float) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.turns = Turns()
        self.next_context = 2  # contexts 0 and 1 belong to the world group
        self._contexts = {0}  # the first context of each group made here
        self._peers = {peer: Peer(peer, channel) for peer, channel in channels.items()}
        self._writing: set[Peer] = set()
        # context -> the call this rank runs there, [seq, signature] (its endpoint's call
        # words): a message of the same seq with another signature, or of an earlier seq (one
        # this rank's calls never took), shows that the ranks' calls differ
        self._calls: dict[int, array] = {}
        self._mismatch: str | None = None  # calls found to differ: every wait fails with it
        # a revoked communicator's contexts -> the notice (see the module docstring); a wait
        # for a message of one of them fails
        self._revoked: dict[int, str] = {}
        # per peer: its state as a C path tests it, and the id of its next pull (see
        # WORDS_PER_PEER); the state words are set by publish_words only
        self.words = array("Q", bytes(8 * (PEER_WORDS + WORDS_PER_PEER * size)))

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        """Wait up to timeout seconds; return (peer, readable, writable) for ready streams."""
        raise NotImplementedError

    def _write_interest(self, peer: Peer, want: bool) -> None:
        """peer has sends pending (want) or none any more."""

    def _forget(self, peer: Peer) -> None:
        """peer's stream is gone."""

    def _pull(self, peer: Peer, address: int, view: memoryview) -> bool:
        """Copy len(view) bytes at address in peer's memory into view; False where a policy
        refuses it, or the transport cannot (the payload is then resent through the stream).
        A peer found gone is lost (_lose)."""
        return False

    def _address(self, buf: np.ndarray) -> int:
        """Where buf's bytes start in this process's memory, for its receiver's _pull."""
        raise NotImplementedError

    def _check_links(self, peers: Iterable[Peer]) -> None:
        """Called about once a second while a wait goes on: lose (_lose) any of peers whose
        stream is known to be dead although nothing has failed yet."""

    def peer(self, rank: int) -> Peer | None:
        """The stream to rank, if this rank has one."""
        return self._peers.get(rank)

    def new_group(self, context: int, member: bool) -> None:
        """A split has agreed on context (and context + 1) for a new group, of which this rank
        is a member or not. Two splits of communicators of this engine run at once by two
        threads could agree on one context: the second is refused here, on every rank where
        it happens, rather than share the first's messages."""
        with self.turns:
            self.next_context = max(self.next_context, context + 2)
            if not member:
                return
            if context in self._contexts:
                raise CommError(f"rank {self.rank}: two communicators split at once, by two "
                                "threads, were given the same context: split communicators "
                                "from one thread at a time (make a thread's communicator "
                                "before it starts)")
            self._contexts.add(context)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.channel.close()
        self._peers.clear()

    def revoke(self, context: int, members: Iterable[int], notice: str) -> None:
        """Revoke the communicator of contexts (context, context + 1) here and tell members
        (world ranks) with a notice each, queued after what this rank had queued for them:
        what cannot go at once goes from a thread of its own (see the module docstring).
        Called with the turns held."""
        self._revoke(context, notice)
        text = notice.encode()[:_NOTICE_BYTES]
        header = self._header(_REVOKED, context, len(text), 0, 0)
        notices = []
        for rank in members:
            peer = self._peers.get(rank)
            if rank != self.rank and peer is not None and not peer.lost:
                notices.append(self._queue(peer, [memoryview(header), memoryview(text)]))
        if any(not notice.done for notice in notices):
            threading.Thread(target=self._deliver, args=(notices,), daemon=True,
                             name=f"tbcoll-revoke-{self.rank}").start()

    def _deliver(self, notices: list[_Send]) -> None:
        """Move the engine until notices have gone (or TBCOLL_TIMEOUT has passed, or their
        peers are gone): the interrupted rank may make no call on this engine again, and a
        peer that waits for the rest of a message of ours, then the notice, would wait."""
        try:
            with self.turns:
                self.waitall(notices)
        except (CommError, OSError, ValueError):  # (gone, or closed meanwhile: nobody to tell)
            pass

    def notice(self, context: int) -> str | None:
        """The revocation notice of the communicator of context, reading what has come (as
        test does: where another thread polls, that thread moves it)."""
        if not self.turns.polling:
            try:
                self._move(self._ready(0.0))
            except (CommError, OSError, ValueError):  # a stream gone: its waits say so
                pass
        return self._revoked.get(context)

    def _revoke(self, context: int, notice: str) -> None:
        """Fail every wait on the communicator of contexts (context, context + 1)."""
        self._revoked[context] = self._revoked[context + 1] = notice

    def publish_words(self) -> None:
        """Set each peer's state word and the engine's (tbcoll.transports.words) from the
        engine's state, clearing STALE. A transport whose C path reads them sets STALE whenever
        control leaves the engine (each door's exit: tbcoll.transports.turns.Marking), and its
        C calls this, with no door open, before it tests a word where it finds STALE: the
        engine's state changes only inside it, and C changes none of it but next_pull (its
        own word), so the words are true whenever C tests them (and an engine entered many
        times between two C moves publishes once). They are conservative: POSTED and
        UNEXPECTED say that anything is held for the peer, of any context and tag, and C then
        leaves the message to the engine, whose own check is exact: a message C might have
        taken is only taken later, never out of order."""
        words, mismatch = self.words, MISMATCH if self._mismatch else 0
        for peer in self._peers.values():
            words[peer.words_at + STATE_WORD] = (
                mismatch | (SENDING if peer.sendq else 0) | (LOST if peer.lost else 0)
                | (READING if peer.target is not None or peer.start != peer.end else 0)
                | (POSTED if peer.posted else 0) | (UNEXPECTED if peer.unexpected else 0)
                | (PULLS if peer.pulls else 0))
        words[ENGINE_WORD] = WRITING if self._writing else 0

    def _next_pull(self, peer: Peer) -> int:
        """The id of the next message pulled from this rank by peer (its word, which a C path
        takes too)."""
        return self.words[peer.words_at + NEXT_PULL_WORD]

    def _take_pull(self, peer: Peer) -> int:
        """_next_pull, taken."""
        pull = self._next_pull(peer)
        self.words[peer.words_at + NEXT_PULL_WORD] = (pull + 1) & PULL_IDS
        return pull

    # --- posting -------------------------------------------------------------------------

    def isend(self, buf: np.ndarray, dest: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> _Send:
        peer = self._live_peer(dest)
        if peer.pulls and buf.nbytes >= self.pull_bytes:
            request = self._enqueue(peer, self._announce(peer, buf, context, tag, call))
            request.context = context
            return request
        payload = bytes_of(buf)
        views = [memoryview(self._header(context, tag, payload.nbytes, call[0], call[1]))]
        if payload.nbytes:
            views.append(payload)
        request = self._queue(peer, views)
        request.context = context
        return request

    # (context, tag, nbytes, seq, call) -> a header; callers pass a call's two words as
    # call[0], call[1]: *call costs ~0.07 us of a ~1.4 us shm message
    _header = staticmethod(_HEADER.pack)
    _header_of = staticmethod(_HEADER.unpack)

    def _announce(self, peer: Peer, buf: np.ndarray, context: int, tag: int,
                  call: tuple[int, int]) -> _Send:
        """A send of buf by pull, its announcement still to write (its views)."""
        pull = self._take_pull(peer)
        announcement = (self._announce_header(context, tag, call)
                        + _DESCRIPTOR.pack(self._address(buf), buf.nbytes, pull))
        request = _Send(peer, [memoryview(announcement)], buf)
        peer.announced[pull] = request
        return request

    @staticmethod
    def _announce_header(context: int, tag: int, call: tuple[int, int]) -> bytes:
        """The header of the announcement of a message (its descriptor follows)."""
        return _HEADER.pack(context | _ANNOUNCE, tag, _DESCRIPTOR.size, *call)

    @staticmethod
    def _pulled_header(pull: int, refused: bool = False) -> bytes:
        """The answer to announcement `pull`."""
        return _HEADER.pack(_PULLED, pull, 0, int(refused), 0)

    _descriptor_of = staticmethod(_DESCRIPTOR.unpack)  # -> (address, nbytes, pull)

    def _queue(self, peer: Peer, views: list[memoryview]) -> _Send:
        """Send these bytes after whatever is queued for peer."""
        return self._enqueue(peer, _Send(peer, views))

    def _enqueue(self, peer: Peer, request: _Send) -> _Send:
        peer.sendq.append(request)
        if len(peer.sendq) == 1:
            self._pump_out(peer)
        return request

    def irecv(self, buf: np.ndarray, source: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> _Recv:
        peer = self._peers.get(source)
        if peer is None:
            raise CommError(f"rank {self.rank} has no connection to rank {source}")
        request = _Recv(peer, bytes_of(buf), call, context)
        if (context, tag) in peer.unexpected:
            message = _first(peer.unexpected, (context, tag))
            if message.call != call or len(message.data) != request.view.nbytes:
                error = (self._call_error(peer.rank, message.call, call)
                         if message.call != call else
                         self._size_error(peer, context, tag, len(message.data),
                                          request.view.nbytes))
                if message.done:
                    raise CommError(error)
                request.error, request.dropped = error, message  # raised once it is whole
                return request
            if message.done:
                request.view[:] = message.data
                request.done = True
            else:
                message.waiter = request
            return request
        if peer.lost:
            raise PeerLostError(f"lost connection to rank {source} ({peer.lost})", (source,))
        peer.posted[context, tag].append(request)
        return request

    def _sends_idle(self, peer: Peer | None) -> bool:
        """A subclass may write a whole message to peer by a path of its own now: nothing
        is queued before it and the stream is alive."""
        return peer is not None and not peer.sendq and not peer.lost

    def _receives_idle(self, peer: Peer | None, context: int, tag: int) -> bool:
        """A subclass may take the next message from peer by a path of its own now: nothing
        of the peer's is staged or half-read, no receive for (context, tag) is posted nor a
        message for it held, and no difference of calls is pending."""
        return (peer is not None and self._stream_idle(peer)
                and not peer.unexpected.get((context, tag)) and not peer.posted.get((context, tag)))

    def _stream_idle(self, peer: Peer) -> bool:
        """Nothing of peer's is staged or half-read, and no difference of calls is pending:
        a subclass may read peer's next message by a path of its own."""
        return (not peer.lost and peer.target is None and peer.start == peer.end
                and not self._mismatch)

    def _finish_announced(self, peer: Peer, view: memoryview, context: int, tag: int,
                          call: tuple[int, int], descriptor: bytes, arrived: int) -> None:
        """Receive into view the message whose announcement (header, and the first `arrived`
        bytes of its descriptor) a subclass's own path took."""
        request = _Recv(peer, view, call, context)
        peer.posted[context, tag].append(request)
        owner = _Announced(context, tag, call)
        owner.descriptor[:arrived] = descriptor[:arrived]
        peer.target, peer.target_owner = memoryview(owner.descriptor)[arrived:], owner
        if arrived == _DESCRIPTOR.size:
            self._finish_message(peer)
        self.waitall([request])

    def _await_answer(self, peer: Peer, buf: np.ndarray, pull: int) -> None:
        """Wait for the answer to announcement `pull` of buf, which a subclass's own path
        wrote (a refusal resends buf through the stream, as for the engine's own)."""
        request = peer.announced[pull] = _Send(peer, [], buf)
        self.waitall([request])

    def _send_rest(self, peer: Peer, header: bytes, payload: memoryview, written: int) -> _Send:
        """Queue what a subclass's own path did not write of a message (written: how many of
        its bytes went, header first); a request already done if all of it went."""
        if written < len(header):
            rest = [memoryview(header)[written:], payload]
        else:
            rest = [payload[written - len(header):]]
        rest = [view for view in rest if view.nbytes]
        if not rest:
            request = _Send(peer, rest)
            request.done = True
            return request
        return self._queue(peer, rest)

    def _rest_of_message(self, peer: Peer, view: memoryview, arrived: int,
                         context: int = -1) -> _Recv:
        """The receive of the rest of a message from peer whose header and first `arrived`
        bytes of payload (into view) were taken by a subclass's own path."""
        request = _Recv(peer, view, context=context)
        peer.target, peer.target_owner = view[arrived:], request
        return request

    def send(self, buf: np.ndarray, dest: int, context: int, tag: int,
             call: tuple[int, int] = NO_CALL) -> None:
        """isend and wait (a transport may move a whole message in one call: shm)."""
        self.waitall([self.isend(buf, dest, context, tag, call)])

    def recv(self, buf: np.ndarray, source: int, context: int, tag: int,
             call: tuple[int, int] = NO_CALL) -> None:
        """irecv and wait (likewise)."""
        self.waitall([self.irecv(buf, source, context, tag, call)])

    # --- waiting -------------------------------------------------------------------------

    def waitall(self, requests: Sequence[_Send | _Recv]) -> None:
        deadline = None
        while True:
            for peer in list(self._writing):
                self._pump_out(peer)
            if self._mismatch:
                raise CommError(self._mismatch)
            pending = [r for r in requests if not r.done]
            if not pending:
                return
            if self._revoked:
                self._fail_revoked(pending)
            for request in pending:
                if _failed(request):
                    raise CommError(request.error)
                if request.peer.lost:
                    raise PeerLostError(f"lost connection to rank {request.peer.rank} "
                                        f"({request.peer.lost})", (request.peer.rank,))
            now = time.monotonic()
            if deadline is None:
                deadline, next_check = now + self.timeout, now + 1.0
            elif now >= next_check:  # a wait of a second or more: are the streams alive?
                self._check_links([p for p in self._peers.values() if not p.lost])
                next_check = now + 1.0
                continue  # a stream found dead fails the wait above
            elif now >= deadline:
                for request in pending:  # its dropped message never came whole: say why
                    if request.error:
                        raise CommError(request.error)
                peers = sorted({r.peer.rank for r in pending})
                raise PeerTimeoutError(f"timed out after {self.timeout:g} s (TBCOLL_TIMEOUT) "
                                       f"waiting for rank(s) {', '.join(map(str, peers))}",
                                       tuple(peers))
            self._wait_and_move(min(deadline - now, 1.0))

    def _fail_revoked(self, pending: list[_Send | _Recv]) -> None:
        """Raise where one of pending is of a revoked communicator."""
        for request in pending:
            if (notice := self._revoked.get(request.context)) is not None:
                raise CommRevokedError(revoked(notice))

    def _wait_and_move(self, timeout: float) -> None:
        """Wait up to timeout for streams to be ready, then move what they have. Other threads
        meanwhile: see tbcoll.transports.turns."""
        turns = self.turns
        if self.waits_released:
            ready = turns.wait_released(self._ready, timeout) or ()
        else:
            ready = self._ready(min(timeout, SHARED_SLICE) if turns.shared else timeout)
        self._move(ready)
        if not self.waits_released:
            turns.pass_turn()

    def _move(self, ready: Iterable[tuple[Peer, bool, bool]]) -> None:
        for peer, readable, writable in ready:
            if writable:
                self._pump_out(peer)
            if readable:
                self._pump_in(peer)

    def test(self, requests: Sequence[_Send | _Recv]) -> bool:
        for peer in list(self._writing):
            self._pump_out(peer)
        if not self.turns.polling:  # else the thread that polls moves what comes
            self._move(self._ready(0.0))
        if self._mismatch:
            raise CommError(self._mismatch)
        for request in requests:
            if request.done:
                continue
            if _failed(request):
                raise CommError(request.error)
            if request.peer.lost:
                raise PeerLostError(f"lost connection to rank {request.peer.rank} "
                                    f"({request.peer.lost})", (request.peer.rank,))
            return False
        return True

    # --- moving bytes --------------------------------------------------------------------

    def _pump_out(self, peer: Peer) -> None:
        while peer.sendq:
            request = peer.sendq[0]
            try:
                sent = peer.channel.sendmsg(request.views)
            except BlockingIOError:
                break
            except OSError as e:
                self._lose(peer, self._send_failure(e))
                raise PeerLostError(f"lost connection to rank {peer.rank} ({peer.lost})",
                                    (peer.rank,)) from e
            views = request.views
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0] = views[0][sent:]
                    sent = 0
            if views:
                break
            request.done = request.pulled is None  # else when the receiver has pulled it
            peer.sendq.popleft()
        self._want_write(peer, bool(peer.sendq))

    def _want_write(self, peer: Peer, want: bool) -> None:
        if want == (peer in self._writing) or peer.lost:
            return
        if want:
            self._writing.add(peer)
        else:
            self._writing.discard(peer)
        self._write_interest(peer, want)

    def _pump_in(self, peer: Peer) -> None:
        while not peer.lost:
            if peer.target is not None and peer.start == peer.end and len(peer.target) >= _DIRECT:
                got = self._recv_into(peer, peer.target)
                if not got:
                    return
                peer.target = peer.target[got:]
                if not peer.target:
                    self._finish_message(peer)
                continue
            if peer.start == peer.end:
                peer.start = peer.end = 0
            elif peer.end > _STAGE - _HEADER.size:  # only a partial header is left: move it up
                rest = peer.end - peer.start
                peer.stage[:rest] = peer.stage[peer.start:peer.end]
                peer.start, peer.end = 0, rest
            wanted = _STAGE - peer.end
            got = self._recv_into(peer, peer.stage_view[peer.end:])
            if not got:
                return
            peer.end += got
            self._parse(peer)
            if got < wanted and peer.target is None:
                # It took all there was and ended on a message's end: the next ready() says
                # when more comes, sparing a read that would find nothing (a syscall and a
                # BlockingIOError per small message). Within a message, read on.
                return

    def _recv_into(self, peer: Peer, view: memoryview) -> int:
        """Read what the socket has into view; 0 if nothing is ready or the peer is gone."""
        try:
            got = peer.channel.recv_into(view)
        except BlockingIOError:
            return 0
        except OSError as e:
            self._lose(peer, f"receive failed: {e.strerror or e}")
            return 0
        if got == 0:
            self._lose(peer, "it closed the connection: exited or crashed")
        return got

    def _parse(self, peer: Peer) -> None:
        while peer.start < peer.end:
            if peer.target is not None:
                n = min(peer.end - peer.start, len(peer.target))
                peer.target[:n] = peer.stage_view[peer.start:peer.start + n]
                peer.start += n
                peer.target = peer.target[n:]
                if not peer.target:
                    self._finish_message(peer)
                continue
            if peer.end - peer.start < _HEADER.size:
                return
            context, tag, nbytes, seq, call = _HEADER.unpack_from(peer.stage, peer.start)
            peer.start += _HEADER.size
            self._begin_message(peer, context, tag, nbytes, (seq, call))

    def _begin_message(self, peer: Peer, context: int, tag: int, nbytes: int,
                       call: tuple[int, int]) -> None:
        if context == _PULLED:
            self._answered(peer, tag, refused=call[0] != 0)
            return
        if context == _REVOKED:
            if nbytes > _NOTICE_BYTES:
                self._lose(peer, f"it sent a revocation notice of {nbytes} bytes")
                return
            owner = _Notice(tag, nbytes)
            view = memoryview(owner.data)
        elif context == _RESENT:
            if tag not in peer.refused:
                self._lose(peer, f"it resent message {tag}, which this rank never refused")
                return
            owner, view = peer.refused.pop(tag)
        else:
            announced, context = context & _ANNOUNCE, context & ~_ANNOUNCE
            if call[1] and not self._mismatch and (running := self._calls.get(context)) and (
                    call[0] < running[0] or call[0] == running[0] and call[1] != running[1]):
                self._mismatch = self._call_error(peer.rank, call, (running[0], running[1]))
            if announced:
                owner = _Announced(context, tag, call)
                view = memoryview(owner.descriptor)
            else:
                owner, view = self._match(peer, context, tag, nbytes, call)
        peer.target, peer.target_owner = view, owner
        if nbytes == 0:
            self._finish_message(peer)

    def _match(self, peer: Peer, context: int, tag: int, nbytes: int,
               call: tuple[int, int]) -> tuple[_Recv | _Unexpected, memoryview]:
        """Where the payload of a message that has come goes: its posted receive, or an
        unexpected buffer."""
        waiting = peer.posted.get((context, tag))
        if waiting and (waiting[0].view.nbytes != nbytes or waiting[0].call != call):
            # The receive fails (its waitall says why); the message is read and dropped, so
            # the stream stays in step for whatever comes next.
            failed = _first(peer.posted, (context, tag))
            failed.error = (self._call_error(peer.rank, call, failed.call)
                            if failed.call != call else
                            self._size_error(peer, context, tag, nbytes, failed.view.nbytes))
            owner = failed.dropped = _Unexpected(nbytes, call)
            view = memoryview(owner.data)
        elif waiting:
            owner: _Recv | _Unexpected = _first(peer.posted, (context, tag))
            view = owner.view
        else:
            owner = _Unexpected(nbytes, call)
            peer.unexpected[context, tag].append(owner)
            view = memoryview(owner.data)
        return owner, view

    def _finish_message(self, peer: Peer) -> None:
        owner = peer.target_owner
        peer.target = peer.target_owner = None
        if isinstance(owner, _Announced):
            self._take_announced(peer, owner)
        elif isinstance(owner, _Notice):
            self._revoke(owner.context, owner.data.decode(errors="replace"))
        else:
            self._complete(owner)

    def _take_announced(self, peer: Peer, announced: _Announced) -> None:
        """Match an announced message and pull its payload, or ask for it where the pull is
        refused; answer the sender either way. (One that no receive awaits yet is pulled into
        an unexpected buffer at once: its sender does not wait for the receive.)"""
        address, nbytes, pull = self._descriptor_of(announced.descriptor)
        owner, view = self._match(peer, announced.context, announced.tag, nbytes, announced.call)
        pulled = self._pull(peer, address, view)
        if peer.lost:
            return
        if pulled:
            self._complete(owner)
        else:
            peer.pulls = False
            peer.refused[pull] = owner, view
        self._queue(peer, [memoryview(self._pulled_header(pull, refused=not pulled))])

    def _answered(self, peer: Peer, pull: int, refused: bool) -> None:
        """The receiver of announcement `pull` has pulled it (the send is done), or was
        refused: the payload follows through the stream, and nothing more is announced."""
        request = peer.announced.pop(pull, None)
        if request is None:
            self._lose(peer, f"it answered announcement {pull}, which this rank never made")
            return
        payload, request.pulled = request.pulled, None
        if not refused:
            request.done = True
            return
        peer.pulls = False
        request.views = [memoryview(self._header(_RESENT, pull, payload.nbytes, 0, 0)),
                         bytes_of(payload)]
        self._enqueue(peer, request)

    @staticmethod
    def _complete(owner: _Recv | _Unexpected) -> None:
        """A message has arrived whole: its receive is done (or waits as unexpected)."""
        owner.done = True
        if isinstance(owner, _Unexpected) and owner.waiter is not None:
            owner.waiter.view[:] = owner.data
            owner.waiter.done = True

    def _call_error(self, sender: int, sent: tuple[int, int], running: tuple[int, int]) -> str:
        """Rank sender's message of call `sent` met this rank running call `running`."""
        if sent[1] == 0 or running[1] == 0:  # a user's message against a collective's
            which = "a send/recv message" if sent[1] == 0 else f"collective call #{sent[0]}"
            return (f"rank {sender} sent {which} where rank {self.rank} expected "
                    f"{'a send/recv message' if running[1] == 0 else 'a collective'}: "
                    f"{MISMATCH_ADVICE}")
        return mismatch({sender: sent, self.rank: running})

    def _size_error(self, peer: Peer, context: int, tag: int, sent: int, expected: int) -> str:
        return (f"rank {peer.rank} sent {sent} bytes where rank {self.rank} expected {expected} "
                f"(context {context}, tag {tag}): the ranks are not running the same "
                "operation (send and recv sizes must match; TBCOLL_CHECK=1 compares "
                "collective calls)")

    def _live_peer(self, rank: int) -> Peer:
        peer = self._peers.get(rank)
        if peer is None:
            raise CommError(f"rank {self.rank} has no connection to rank {rank}")
        if peer.lost:
            raise PeerLostError(f"lost connection to rank {rank} ({peer.lost})", (rank,))
        return peer

    @staticmethod
    def _send_failure(error: OSError) -> str:
        """Why a channel's send failed, for the PeerLostError (a subclass names its causes)."""
        return f"send failed: {error.strerror or error}"

    def _lose(self, peer: Peer, reason: str) -> None:
        if peer.lost is None:
            peer.lost = reason
            self._writing.discard(peer)
            self._forget(peer)



class StreamEndpoint:
    """P2P over the transport within one communicator: one context, ranks mapped to world."""

    # pure senders of a rooted collective wait for an acknowledgement (see tbcoll.algorithms):
    # a message's call is compared only where it arrives
    acknowledge = True

    def __init__(self, transport: StreamTransport, context: int, members: list[int]) -> None:
        self._transport, self.context, self._members = transport, context, members
        self._turns = transport.turns  # each method here is a door into the engine
        self.rank, self.size = members.index(transport.rank), len(members)
        # The collective call whose messages follow, [seq, signature] (NO_CALL's words for the
        # user's messages): numbered here by begin_call, or by the one-call paths, in Python
        # (begin_next_call) or in C (tcp's Lane, which is handed these words); the engine
        # compares arriving messages with it
        self.call_words = array("Q", NO_CALL)
        transport._calls[context] = self.call_words

    def begin_call(self, seq: int, signature: int) -> None:
        """The collective call whose messages follow: its number and signature."""
        words = self.call_words
        words[0], words[1] = seq, signature

    @property
    def call(self) -> tuple[int, int]:
        """The call begun last (seq, signature)."""
        words = self.call_words
        return words[0], words[1]

    def begin_next_call(self, signature: int) -> tuple[int, int]:
        """begin_call for the call after the last one begun: a one-call path's (comm.py
        numbers those calls without telling the group); returns it (as .call would). Inline:
        it is on the small all_reduce's path."""
        words = self.call_words
        words[0] += 1
        words[1] = signature
        return words[0], signature

    # (each door reads the call's words itself: the property costs a call more per message)
    def send(self, buf: np.ndarray, peer: int, tag: int) -> None:
        with self._turns:
            call = self.call_words
            self._transport.send(buf, self._members[peer], self.context, tag, (call[0], call[1]))

    def recv(self, buf: np.ndarray, peer: int, tag: int) -> None:
        with self._turns:
            call = self.call_words
            self._transport.recv(buf, self._members[peer], self.context, tag, (call[0], call[1]))

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> _Send:
        with self._turns:
            call = self.call_words
            return self._transport.isend(buf, self._members[peer], self.context, tag,
                                         (call[0], call[1]))

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> _Recv:
        with self._turns:
            call = self.call_words
            return self._transport.irecv(buf, self._members[peer], self.context, tag,
                                         (call[0], call[1]))

    def waitall(self, requests: Sequence[_Send | _Recv]) -> None:
        with self._turns:
            self._transport.waitall(requests)

    def test(self, requests: Sequence[_Send | _Recv]) -> bool:
        with self._turns:
            return self._transport.test(requests)
