"""POSIX shared-memory segments: created 0600 by one rank, mapped by the others, and unlinked
as soon as everyone has mapped it, so that no name outlives the job even if it is killed.

Names are /tbc-<job>-<creator>-<context>: <job> comes from the job's token (see
tbcoll.env.segment_prefix), which is how tbrun finds a dead job's leftovers; the whole name
stays within macOS's 31 characters.
"""

from __future__ import annotations

# _posixshmem is CPython's module behind multiprocessing.shared_memory, used directly to keep
# that module's resource-tracker process (which unlinks segments at exit) out of every rank.
import _posixshmem
import mmap
import os
import tempfile

MAX_NAME = 31  # PSHMNAMLEN on macOS


class SegmentSpaceError(OSError):
    """The system has no room for a segment of the size asked."""


class Segment:
    def __init__(self, name: str, fd: int, size: int, lock_path: str) -> None:
        self.name, self.size, self.lock_path = name, size, lock_path
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = memoryview(self._map)
        self.lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        if len(name) > MAX_NAME:
            raise ValueError(f"shared-memory name {name!r} is longer than {MAX_NAME} characters")
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):  # Linux: claim the pages now, so that a full
                os.posix_fallocate(fd, 0, size)  # /dev/shm is an error here, not a SIGBUS later
        except OSError as e:
            os.close(fd)
            _posixshmem.shm_unlink(name)
            raise SegmentSpaceError(
                f"cannot make a {size / 2**20:.1f} MiB shared-memory segment ({e.strerror}): "
                "enlarge /dev/shm (e.g. docker --shm-size) or use --backend tcp") from e
        return cls(name, fd, size, _lock_path(name))

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        return cls(name, _posixshmem.shm_open(name, os.O_RDWR, mode=0o600), size, _lock_path(name))

    def unlink(self) -> None:
        """Remove the names; the mappings stay valid until close()."""
        for remove, name in ((_posixshmem.shm_unlink, self.name), (os.unlink, self.lock_path)):
            try:
                remove(name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.buffer.release()
        self._map.close()
        os.close(self.lock_fd)


def _lock_path(name: str) -> str:
    """A file beside the segment for the fcntl locks of LockedFlags (macOS cannot lock a
    shared-memory object itself)."""
    return os.path.join(tempfile.gettempdir(), name.lstrip("/") + ".lock")
