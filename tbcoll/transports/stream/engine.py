"""The message engine shared by the byte-stream transports (tcp, rdma, and shm's point-to-point):
matching, progress and waits (the package's docstring says what it does as a whole).

Each pair of ranks has one byte stream (a Channel: a TCP socket, or a ring buffer in shared
memory) that offers non-blocking sendmsg and recv_into, raising BlockingIOError when it cannot
move a byte now. A collective's messages carry its call (seq, its number on the communicator,
and call, its tbcoll.core.calls signature; a user's messages carry 0, 0): a message of another call
than the one a rank runs, met as it arrives or as a receive takes it, fails the wait with a
CommError naming both calls, where the ranks would otherwise compute with each other's
different calls. A message's payload is read straight into the destination when its receive
is posted; reads go through a small staging buffer, so one read can bring several small
messages, and large payloads bypass it (recv_into the caller's array).

The engine has no threads of its own: progress happens in isend (an eager first write) and in
waitall, which keeps reading every stream while its sends are stalled. Two ranks sending each
other large messages at once therefore cannot deadlock. Several threads may use one engine (a
communicator each, split from one world, or a progress thread beside the caller): each door
into it (StreamEndpoint, a transport's natives) takes its Turns
(tbcoll.transports.stream.turns), and every method of StreamTransport runs with them held.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from tbcoll.core.calls import MISMATCH_ADVICE, NO_CALL, mismatch
from tbcoll.core.errors import CONNECTION_ENDED, EXITED, CommError, PeerLostError, PeerTimeoutError
from tbcoll.core.framing import (
    ANNOUNCE,
    DESCRIPTOR,
    HEADER,
    NOTICE_BYTES,
    PULLED,
    RESENT,
    REVOKED,
    bytes_of,
)
from tbcoll.transports.stream.failover import Failover
from tbcoll.transports.stream.peers import (
    STAGE,
    Announced,
    Channel,
    Notice,
    Peer,
    Recv,
    Send,
    Unexpected,
    has_failed,
    take_first,
)
from tbcoll.transports.stream.pulls import Pulls
from tbcoll.transports.stream.revocation import Revocation
from tbcoll.transports.stream.turns import SHARED_SLICE, Turns
from tbcoll.transports.stream.words import (
    ENGINE_WORD,
    LOST,
    MISMATCH,
    PEER_WORDS,
    POSTED,
    PULLS,
    READING,
    RECEIVED_WORD,
    SENDING,
    SENT_WORD,
    STATE_WORD,
    UNEXPECTED,
    WORDS_PER_PEER,
    WRITING,
)

DIRECT = 16 << 10  # a payload remainder this large is read straight into its destination


class StreamTransport(Pulls, Revocation, Failover):
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
    DESCRIPTOR_BYTES = DESCRIPTOR.size

    def __init__(self, rank: int, size: int, channels: dict[int, Channel],
                 timeout: float) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        # each rank's name in messages: its world rank (a transport whose ranks are a
        # group's own, shm's, names them as the job does)
        self.names: Sequence[int] = range(size)
        self.turns = Turns()
        self.next_context = 2  # contexts 0 and 1 belong to the world group
        self._contexts = {0}  # the first context of each group made here
        self._peers = {peer: Peer(peer, channel) for peer, channel in channels.items()}
        self._writing: set[Peer] = set()
        self._broken: set[Peer] = set()  # channels failed, to fail over (docs/failover.md)
        # context -> the call this rank runs there, [seq, signature] (its endpoint's call
        # words): a message of the same seq with another signature, or of an earlier seq (one
        # this rank's calls never took), shows that the ranks' calls differ
        self._calls: dict[int, array] = {}
        self._mismatch: str | None = None  # calls found to differ: every wait fails with it
        # a revoked communicator's contexts -> the notice (see the module docstring); a wait
        # for a message of one of them fails
        self._revoked: dict[int, str] = {}
        self._revocation_words: dict[int, array] = {}  # a communicator's first context -> its
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

    def stream_counts(self, rank: int) -> tuple[int, int]:
        """The bytes this rank's stream to rank has carried so far, (sent, received), over
        every Channel it had and by every path (the engine's and C's): what a stream resumed
        on a new Channel goes on from."""
        at = self._peers[rank].words_at
        return self.words[at + SENT_WORD], self.words[at + RECEIVED_WORD]

    def replace_channel(self, rank: int, channel: Channel) -> None:
        """Carry the stream to rank over channel from now on, its byte counts kept, and close
        the old one: between calls, where nothing of the peer's is queued or half-read (the
        stream's bytes so far are whole messages on both ends; a transport that replaces a
        channel in mid-message must first replay from the peer's RECEIVED count). Both ends
        replace it at the same point of their streams."""
        with self.turns:
            peer = self._peers.get(rank)
            if peer is None or peer.lost:
                raise CommError(f"rank {self.rank} has no live stream to rank {rank} to move "
                                "to a new channel")
            if peer.sendq or peer.target is not None or peer.start != peer.end:
                raise CommError(f"rank {self.rank}: the stream to rank {rank} is in mid-message "
                                "(a send queued or a message half-read): replace its channel "
                                "between calls")
            self._swap_channel(peer, channel)

    def _swap_channel(self, peer: Peer, channel: Channel) -> None:
        """Make channel peer's, closing the old one (a subclass that watches its streams, or
        whose C holds them, follows the new one)."""
        old, peer.channel = peer.channel, channel
        old.close()

    def close(self) -> None:
        for peer in self._peers.values():
            peer.channel.close()
        self._peers.clear()

    def publish_words(self) -> None:
        """Set each peer's state word and the engine's (tbcoll.transports.stream.words) from
        the engine's state, clearing STALE. A transport whose C path reads them sets STALE
        whenever control leaves the engine (each door's exit: turns.Marking), and its C calls
        this, with no door open, before it tests a word where it finds STALE: the
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

    # --- posting -------------------------------------------------------------------------

    def isend(self, buf: np.ndarray, dest: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> Send:
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
    _header = staticmethod(HEADER.pack)
    _header_of = staticmethod(HEADER.unpack)

    def _queue(self, peer: Peer, views: list[memoryview]) -> Send:
        """Send these bytes after whatever is queued for peer."""
        return self._enqueue(peer, Send(peer, views))

    def _enqueue(self, peer: Peer, request: Send) -> Send:
        peer.sendq.append(request)
        if len(peer.sendq) == 1:
            self._pump_out(peer)
        return request

    def irecv(self, buf: np.ndarray, source: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> Recv:
        peer = self._peers.get(source)
        if peer is None:
            raise CommError(f"rank {self.rank} has no connection to rank {source}")
        request = Recv(peer, bytes_of(buf), call, context)
        if (context, tag) in peer.unexpected:
            message = take_first(peer.unexpected, (context, tag))
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
            raise self.lost(source)
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

    def _send_rest(self, peer: Peer, header: bytes, payload: memoryview, written: int) -> Send:
        """Queue what a subclass's own path did not write of a message (written: how many of
        its bytes went, header first); a request already done if all of it went."""
        if written < len(header):
            rest = [memoryview(header)[written:], payload]
        else:
            rest = [payload[written - len(header):]]
        rest = [view for view in rest if view.nbytes]
        if not rest:
            request = Send(peer, rest)
            request.done = True
            return request
        return self._queue(peer, rest)

    def _rest_of_message(self, peer: Peer, view: memoryview, arrived: int,
                         context: int = -1) -> Recv:
        """The receive of the rest of a message from peer whose header and first `arrived`
        bytes of payload (into view) were taken by a subclass's own path."""
        request = Recv(peer, view, context=context)
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

    def waitall(self, requests: Sequence[Send | Recv]) -> None:
        deadline = None
        while True:
            self._repair()
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
                if has_failed(request):
                    raise CommError(request.error)
                if request.peer.lost:
                    raise self.lost(request.peer.rank)
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
            self._wait_and_move(min(deadline - now, self.repair_look if self._broken else 1.0))

    def _wait_and_move(self, timeout: float) -> None:
        """Wait up to timeout for streams to be ready, then move what they have. Other threads
        meanwhile: see tbcoll.transports.stream.turns."""
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

    def test(self, requests: Sequence[Send | Recv]) -> bool:
        self._repair()
        for peer in list(self._writing):
            self._pump_out(peer)
        if not self.turns.polling:  # else the thread that polls moves what comes
            self._move(self._ready(0.0))
        if self._mismatch:
            raise CommError(self._mismatch)
        for request in requests:
            if request.done:
                continue
            if has_failed(request):
                raise CommError(request.error)
            if request.peer.lost:
                raise self.lost(request.peer.rank)
            return False
        return True

    # --- moving bytes --------------------------------------------------------------------

    def _pump_out(self, peer: Peer) -> None:
        if peer.broken:
            return  # its sends wait for the new channel (_repair)
        while peer.sendq:
            request = peer.sendq[0]
            try:
                sent = peer.channel.sendmsg(request.views)
            except BlockingIOError:
                break
            except OSError as e:
                if self._link_failed(peer, self._send_failure(e), e):
                    return
                raise self.lost(peer.rank) from e
            self.words[peer.words_at + SENT_WORD] += sent  # the holder of the engine's
            if peer.tail is not None:
                peer.tail.wrote(request, request.views, sent)
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
            if peer.target is not None and peer.start == peer.end and len(peer.target) >= DIRECT:
                got = self._recv_into(peer, peer.target)
                if not got:
                    return
                peer.target = peer.target[got:]
                if not peer.target:
                    self._finish_message(peer)
                continue
            if peer.start == peer.end:
                peer.start = peer.end = 0
            elif peer.end > STAGE - HEADER.size:  # only a partial header is left: move it up
                rest = peer.end - peer.start
                peer.stage[:rest] = peer.stage[peer.start:peer.end]
                peer.start, peer.end = 0, rest
            wanted = STAGE - peer.end
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
            self._link_failed(peer, f"receive failed: {e.strerror or e}")
            return 0
        if got == 0:
            self._link_failed(peer, f"it closed the connection: {EXITED}", CONNECTION_ENDED)
        self.words[peer.words_at + RECEIVED_WORD] += got  # (as _pump_out's)
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
            if peer.end - peer.start < HEADER.size:
                return
            context, tag, nbytes, seq, call = HEADER.unpack_from(peer.stage, peer.start)
            peer.start += HEADER.size
            self._begin_message(peer, context, tag, nbytes, (seq, call))

    def _begin_message(self, peer: Peer, context: int, tag: int, nbytes: int,
                       call: tuple[int, int]) -> None:
        if context == PULLED:
            self._answered(peer, tag, refused=call[0] != 0)
            return
        if context == REVOKED:
            if nbytes > NOTICE_BYTES:
                self._lose(peer, f"it sent a revocation notice of {nbytes} bytes")
                return
            owner = Notice(tag, nbytes)
            view = memoryview(owner.data)
        elif context == RESENT:
            if tag not in peer.refused:
                self._lose(peer, f"it resent message {tag}, which this rank never refused")
                return
            owner, view = peer.refused.pop(tag)
        else:
            announced, context = context & ANNOUNCE, context & ~ANNOUNCE
            if call[1] and not self._mismatch and (running := self._calls.get(context)) and (
                    call[0] < running[0] or call[0] == running[0] and call[1] != running[1]):
                self._mismatch = self._call_error(peer.rank, call, (running[0], running[1]))
            if announced:
                owner = Announced(context, tag, call)
                view = memoryview(owner.descriptor)
            else:
                owner, view = self._match(peer, context, tag, nbytes, call)
        peer.target, peer.target_owner = view, owner
        if nbytes == 0:
            self._finish_message(peer)

    def _match(self, peer: Peer, context: int, tag: int, nbytes: int,
               call: tuple[int, int]) -> tuple[Recv | Unexpected, memoryview]:
        """Where the payload of a message that has come goes: its posted receive, or an
        unexpected buffer."""
        waiting = peer.posted.get((context, tag))
        if waiting and (waiting[0].view.nbytes != nbytes or waiting[0].call != call):
            # The receive fails (its waitall says why); the message is read and dropped, so
            # the stream stays in step for whatever comes next.
            failed = take_first(peer.posted, (context, tag))
            failed.error = (self._call_error(peer.rank, call, failed.call)
                            if failed.call != call else
                            self._size_error(peer, context, tag, nbytes, failed.view.nbytes))
            owner = failed.dropped = Unexpected(nbytes, call)
            view = memoryview(owner.data)
        elif waiting:
            owner: Recv | Unexpected = take_first(peer.posted, (context, tag))
            view = owner.view
        else:
            owner = Unexpected(nbytes, call)
            peer.unexpected[context, tag].append(owner)
            view = memoryview(owner.data)
        return owner, view

    def _finish_message(self, peer: Peer) -> None:
        owner = peer.target_owner
        peer.target = peer.target_owner = None
        if isinstance(owner, Announced):
            self._take_announced(peer, owner)
        elif isinstance(owner, Notice):
            self._revoke(owner.context, owner.data.decode(errors="replace"))
        else:
            self._complete(owner)

    @staticmethod
    def _complete(owner: Recv | Unexpected) -> None:
        """A message has arrived whole: its receive is done (or waits as unexpected)."""
        owner.done = True
        if isinstance(owner, Unexpected) and owner.waiter is not None:
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
            raise self.lost(rank)
        return peer

    def lost(self, rank: int) -> PeerLostError:
        """The error for a wait on the lost stream to rank (named as the job knows it)."""
        return PeerLostError(f"lost connection to rank {self.names[rank]} "
                             f"({self._peers[rank].lost})", (rank,))

    @staticmethod
    def _send_failure(error: OSError) -> str:
        """Why a channel's send failed, for the PeerLostError (a subclass names its causes)."""
        return f"send failed: {error.strerror or error}"

    def _lose(self, peer: Peer, reason: str) -> None:
        if peer.lost is None:
            peer.lost = reason
            self._writing.discard(peer)
            self._forget(peer)

