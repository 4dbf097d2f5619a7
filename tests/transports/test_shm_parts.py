"""The shm transport's parts on their own: segments, both kinds of flags, the rings."""

import _posixshmem
import mmap
import os
import threading
import time

import numpy as np
import pytest
from tbcoll.launch import reaper

from tbcoll.job.env import segment_prefix
from tbcoll.transports.shm import native
from tbcoll.transports.shm.flags import AtomicFlags
from tbcoll.transports.shm.pipe import OverwrittenRing, Ring
from tbcoll.transports.shm.segment import Segment, SegmentSpaceError
from tbcoll.transports.stream import HEADER as _HEADER

from ..conftest import tagged_lines, tbrun


@pytest.fixture
def segment():
    seg = Segment.create(f"/tbc-test-{time.monotonic_ns() % 10**9}", mmap.PAGESIZE)
    yield seg
    seg.unlink()
    seg.close()


def test_segments_are_private_and_shared(segment, tmp_path):
    other = Segment.attach(segment.name, segment.size)
    try:
        segment.buffer[100:105] = b"hello"
        assert bytes(other.buffer[100:105]) == b"hello"
    finally:
        other.close()
    segment.unlink()
    with pytest.raises(FileNotFoundError):
        Segment.attach(segment.name, segment.size)


def test_names_longer_than_macos_allows_are_refused():
    with pytest.raises(ValueError, match="longer than 31"):
        Segment.create("/tbc-" + "x" * 40, mmap.PAGESIZE)


def test_a_jobs_names_take_letters_and_digits_of_its_id():
    assert segment_prefix(reaper.new_job_id()).count("/") == 1  # tbrun's ids: hex
    assert segment_prefix("0123456789abcdef") == "/tbc-01234567-"
    assert segment_prefix("../a/b c") == "/tbc-abc-"  # set by hand: no '/' gets in


def test_flags_order_and_wait(segment):
    flags = AtomicFlags(segment.buffer)
    flags.store(64, 41)
    assert flags.load(64) == 41
    assert not flags.wait_all(64, 128, 1, 42, 0.01)
    threading.Timer(0.05, flags.store, (64, 42)).start()
    assert flags.wait_all(64, 128, 1, 42, 5.0)


def test_a_segment_not_this_users_alone_is_refused(segment):
    """A segment under a job's name that another could write (mode) is not mapped: it could
    be planted."""
    os.chmod(f"/dev/shm{segment.name}", 0o666) if os.path.isdir("/dev/shm") else None
    if not os.path.isdir("/dev/shm"):
        pytest.skip("fchmod of shared memory is Linux's here")
    with pytest.raises(PermissionError, match="not this user's alone"):
        Segment.attach(segment.name, segment.size)
    os.chmod(f"/dev/shm{segment.name}", 0o600)
    with pytest.raises(PermissionError, match="holds 4096 bytes"):
        Segment.attach(segment.name, segment.size + 1)


def test_waiting_on_several_flags(segment):
    flags = AtomicFlags(segment.buffer)
    for i in range(4):
        flags.store(i * 128, 7)
    assert flags.wait_all(0, 128, 4, 7, 0.01)
    flags.store(3 * 128, 6)
    started = time.monotonic()
    assert not flags.wait_all(0, 128, 4, 7, 0.05)
    assert 0.04 < time.monotonic() - started < 2
    with pytest.raises(ValueError, match="outside the buffer"):
        flags.wait_all(0, 128, 1000, 1, 0.01)


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="Linux only: posix_fallocate")
def test_no_room_is_an_error_at_creation_not_a_crash_later():
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    with pytest.raises(SegmentSpaceError, match="on Linux enlarge /dev/shm .*; on macOS, which "
                       "has no /dev/shm, free memory .* or use --backend tcp"):
        Segment.create(f"/tbc-test-big-{os.getpid()}", free + (1 << 30))
    assert not os.path.exists(f"/dev/shm/tbc-test-big-{os.getpid()}")


def test_planted_names_are_passed_over(monkeypatch, tmp_path):
    """Another local user who plants the next name makes tbcoll draw another, never fail; a
    name passed over is not left written down (tbrun would unlink the planter's segment)."""
    import secrets

    from tbcoll.transports.shm import segment as seg

    monkeypatch.setenv("TBCOLL_SHM_NAMES", str(tmp_path))
    prefix = f"/tbc-t{os.getpid()}-"
    planted = prefix + "aaaaaaaaaa"
    fd = _posixshmem.shm_open(planted, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.close(fd)
    draws = iter(["aaaaaaaaaa", "cccccccccc"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    try:
        segment = seg.Segment.create_unique(prefix, 4096)
        assert segment.name == prefix + "cccccccccc"
        assert [p.name for p in tmp_path.iterdir()] == [segment.name[1:]]
        segment.unlink()
        segment.close()
    finally:
        _posixshmem.shm_unlink(planted)


def test_a_name_is_written_down_until_its_segment_is_unlinked(monkeypatch, tmp_path):
    """Under tbrun (TBCOLL_SHM_NAMES) the creator writes the name down before it makes the
    segment, in a new private file, and crosses it out once the name is unlinked: what a
    killed rank leaves there, tbrun unlinks (macOS cannot list shared memory)."""
    monkeypatch.setenv("TBCOLL_SHM_NAMES", str(tmp_path))
    segment = Segment.create_unique(f"/tbc-t{os.getpid()}-", 4096)
    try:
        (record,) = tmp_path.iterdir()
        assert "/" + record.name == segment.name
        assert record.stat().st_mode & 0o777 == 0o600
        Segment.attach(segment.name, 4096).close()
        assert list(tmp_path.iterdir()) == [record]  # the ranks that map it write nothing
    finally:
        segment.unlink()
        segment.close()
    assert not any(tmp_path.iterdir())


def test_a_planted_record_is_a_name_taken(monkeypatch, tmp_path):
    """A link planted in the folder of names under the next name is not followed: another
    name is drawn, and the link stays as it was."""
    import secrets

    monkeypatch.setenv("TBCOLL_SHM_NAMES", str(tmp_path))
    prefix = f"/tbc-t{os.getpid()}-"
    target = tmp_path / "target"
    (tmp_path / (prefix[1:] + "aaaaaaaaaa")).symlink_to(target)
    draws = iter(["aaaaaaaaaa", "cccccccccc"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    segment = Segment.create_unique(prefix, 4096)
    segment.unlink()
    segment.close()
    assert segment.name == prefix + "cccccccccc"
    assert not target.exists()


def test_a_folder_of_names_that_cannot_be_written_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TBCOLL_SHM_NAMES", str(tmp_path / "gone"))
    with pytest.raises(OSError, match="cannot write down the shared-memory name .* "
                                      "TBCOLL_SHM_NAMES=.*gone"):
        Segment.create_unique(f"/tbc-t{os.getpid()}-", 4096)


class TestRingInC:
    """Ring.send and Ring.receive (the C paths of blocking send/recv) against Ring.write and
    Ring.read_into, which the stream engine uses: the same bytes, the same counters."""

    CAPACITY = 256

    def rings(self, segment):
        return Ring(segment.buffer, 0, self.CAPACITY), Ring(segment.buffer, 0, self.CAPACITY)

    def test_messages_round_the_ring_many_times(self, segment):
        producer, consumer = self.rings(segment)
        for n in range(1, 90, 7):  # odd sizes: headers and payloads wrap at every offset
            payload = np.arange(n, dtype=np.uint8)
            assert producer.send(_HEADER.pack(3, n, n, 0, 0), payload, 0.1) == 32 + n
            got = np.empty(n, np.uint8)
            assert consumer.receive(_HEADER.pack(3, n, n, 0, 0), got, 0.1) == n
            assert np.array_equal(got, payload)
        assert not consumer.readable()

    def test_another_message_first_is_left_for_the_engine(self, segment):
        producer, consumer = self.rings(segment)
        producer.send(_HEADER.pack(1, 5, 4, 2, 9), np.arange(4, dtype=np.uint8), 0.1)
        got = np.empty(4, np.uint8)
        assert consumer.receive(_HEADER.pack(1, 6, 4, 2, 9), got, 0.1) == -2  # another tag
        assert consumer.receive(_HEADER.pack(1, 5, 3, 2, 9), got[:3], 0.1) == -2  # size
        assert consumer.receive(_HEADER.pack(1, 5, 4, 2, 8), got, 0.1) == -2  # another call
        assert consumer.receive(_HEADER.pack(1, 5, 4, 3, 9), got, 0.1) == -2  # another seq
        view = memoryview(bytearray(36))  # the engine reads it whole, from the start
        assert consumer.read_into(view) == 36 and bytes(view[32:]) == bytes(range(4))

    def test_writes_of_several_buffers_stop_where_the_ring_is_full(self, segment):
        producer, consumer = self.rings(segment)
        assert not consumer.readable() and producer.writable()
        for start in (0, 100, 250):  # the data wraps at every one of these
            consumer.read_into(memoryview(bytearray(start)))  # moves both counters on
            pieces = [memoryview(bytes([i]) * 100) for i in range(1, 4)]
            assert producer.write(pieces) == self.CAPACITY  # 100, 100 and 56 of the third
            assert consumer.readable() and not producer.writable()
            got = memoryview(bytearray(self.CAPACITY + 8))
            assert consumer.read_into(got) == self.CAPACITY
            assert bytes(got[:self.CAPACITY]) == b"\1" * 100 + b"\2" * 100 + b"\3" * 56
            assert not consumer.readable() and producer.writable()
            assert producer.write([memoryview(bytes(start))]) == start  # for the next turn

    def test_an_empty_ring_times_out(self, segment):
        _, consumer = self.rings(segment)
        started = time.monotonic()
        assert consumer.receive(_HEADER.pack(0, 0, 1, 0, 0), np.empty(1, np.uint8), 0.05) == -1
        assert 0.04 < time.monotonic() - started < 2

    def test_a_message_larger_than_the_ring_goes_in_as_room_allows(self, segment):
        producer, consumer = self.rings(segment)
        payload = np.arange(1000, dtype=np.uint16).view(np.uint8)
        header = _HEADER.pack(0, 0, payload.nbytes, 0, 0)
        written = producer.send(header, payload, 0.01)
        assert written == self.CAPACITY  # full: the rest is the caller's (the engine's)
        got = np.empty(payload.nbytes, np.uint8)
        copied = consumer.receive(header, got, 0.01)  # takes what came, then runs out of time
        assert copied == self.CAPACITY - 32
        rest = memoryview(payload)[copied:]
        while rest.nbytes:  # the engine's writes and reads finish the message
            took = producer.write([rest])
            consumer.read_into(memoryview(got)[payload.nbytes - rest.nbytes:][:took])
            rest = rest[took:]
        assert np.array_equal(got, payload)

    def test_a_ring_of_fewer_than_four_bytes_still_moves_every_byte(self, segment):
        """A wait for a quarter of the ring waited for nothing below 4 bytes: a busy loop."""
        producer, consumer = Ring(segment.buffer, 0, 3), Ring(segment.buffer, 0, 3)
        payload = np.arange(10, dtype=np.uint8)
        sent, started = 0, time.monotonic()
        got = bytearray()
        while len(got) < 10:  # send fills as room allows; read_into drains
            sent += producer.send(b"", payload[sent:], 0.01)
            view = memoryview(bytearray(3))
            got += view[:consumer.read_into(view)]
            assert time.monotonic() - started < 5
        assert bytes(got) == payload.tobytes()

    def test_an_overwritten_counter_is_an_error_not_a_copy(self, segment):
        """The consumer used to trust the producer's head and copy that many bytes."""
        producer, consumer = self.rings(segment)
        header = _HEADER.pack(1, 2, 8, 0, 0)
        producer.send(header, np.zeros(8, np.uint8), 0.1)
        AtomicFlags(segment.buffer).store(0, 10 * self.CAPACITY)  # the head, overwritten
        with pytest.raises(OverwrittenRing):
            consumer.receive(header, np.empty(8, np.uint8), 0.1)
        with pytest.raises(OverwrittenRing):
            consumer.read_into(memoryview(bytearray(8)))


@pytest.mark.parametrize("stride", [-8, 1 << 62])
def test_a_round_refuses_strides_outside_its_buffers(segment, stride):
    """A negative stride, or one whose product with the ranks overflows, passed the bounds
    check of an all-gather round (kind 1) and wrote outside the result."""
    from tbcoll.transports.shm.flags import atomics
    src, dst = np.zeros(8, np.uint8), np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        lane = atomics.Lane(segment=segment.buffer, flags=0, size=4, rank=0, sets=[1024, 1024],
                            slot_bytes=256, budget=0.01, resume=None, pids=0)
        lane.round(atomics.ALL_GATHER, src, 0, dst, stride, 8, 0, 0, 1)


def test_a_pid_not_yet_published_is_not_known_gone_and_never_signalled(monkeypatch):
    """A rank's pid word reads 0 until that rank stores its pid. The liveness check must take
    0 as "not yet" and never call os.kill(0, 0), which signals this process's own group (and
    answers "alive" of nobody), nor os.kill with a negative number (another group)."""
    signalled = []
    real_kill = os.kill
    monkeypatch.setattr(os, "kill", lambda pid, sig: (signalled.append(pid), real_kill(pid, sig)))
    assert not native.gone(0)
    assert not native.gone(-os.getpgid(0))
    assert signalled == []
    assert not native.gone(os.getpid())
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert native.gone(child)


def test_each_rank_publishes_its_pid_with_a_release_store(script):
    """Every rank finds every other rank's pid in the segment (loaded with acquire)."""
    job = script("""
        import os
        import numpy as np
        import tbcoll
        comm = tbcoll.init()
        native = comm._group.native
        pids = comm.all_gather(np.array([os.getpid()]))
        print(all(native.pid_of(r) == int(pids[r]) for r in range(comm.size)))
        comm.close()
    """)
    p = tbrun("-np", "3", "--backend", "shm", job, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert {r: lines[-1] for r, lines in tagged_lines(p.stdout).items()} == \
        {0: "True", 1: "True", 2: "True"}
