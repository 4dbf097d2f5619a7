"""POSIX shared-memory segments: created 0600 by one rank, mapped by the others, and unlinked
as soon as everyone has mapped it, so that no name outlives the job even if it is killed.

Names are /tbc-<job>-<random>: <job> comes from the job's token (see
tbcoll.env.segment_prefix), which is how tbrun finds a dead job's leftovers; the random part,
which the creator tells the others, keeps another local user from planting the name first
(a name that exists is never used: O_EXCL, and another is drawn). The whole name stays within
macOS's 31 characters. The lock file beside it, in the temporary folder everyone shares, is
created O_EXCL|O_NOFOLLOW and opened only if it is ours and not a link.
"""

from __future__ import annotations

# _posixshmem is CPython's module behind multiprocessing.shared_memory, used directly to keep
# that module's resource-tracker process (which unlinks segments at exit) out of every rank.
import _posixshmem
import mmap
import os
import secrets
import tempfile

MAX_NAME = 31  # PSHMNAMLEN on macOS
_RANDOM = 5  # bytes of the random part: 10 hex digits
_TRIES = 8


class SegmentSpaceError(OSError):
    """The system has no room for a segment of the size asked."""


class Segment:
    def __init__(self, name: str, fd: int, size: int, lock_fd: int) -> None:
        self.name, self.size, self.lock_path = name, size, _lock_path(name)
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = memoryview(self._map)
        self.lock_fd = lock_fd

    @classmethod
    def create_unique(cls, prefix: str, size: int) -> Segment:
        """Create a segment named prefix + a random part; a name that exists (planted, or
        left by a crash) is passed over for another."""
        for _ in range(_TRIES):
            try:
                return cls.create(prefix + secrets.token_hex(_RANDOM), size)
            except FileExistsError:
                continue
        raise FileExistsError(f"{_TRIES} random shared-memory names starting {prefix} existed "
                              "already: is another user planting names?")

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        if len(name) > MAX_NAME:
            raise ValueError(f"shared-memory name {name!r} is longer than {MAX_NAME} characters")
        lock_fd = os.open(_lock_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except OSError:
            os.close(lock_fd)
            os.unlink(_lock_path(name))
            raise
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):  # Linux: claim the pages now, so that a full
                os.posix_fallocate(fd, 0, size)  # /dev/shm is an error here, not a SIGBUS later
        except OSError as e:
            os.close(fd)
            os.close(lock_fd)
            _posixshmem.shm_unlink(name)
            os.unlink(_lock_path(name))
            raise SegmentSpaceError(
                f"cannot make a {size / 2**20:.1f} MiB shared-memory segment ({e.strerror}): "
                "enlarge /dev/shm (e.g. docker --shm-size) or use --backend tcp") from e
        return cls(name, fd, size, lock_fd)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        lock_fd = os.open(_lock_path(name), os.O_RDWR | _NOFOLLOW)
        try:
            if os.fstat(lock_fd).st_uid != os.getuid():
                raise PermissionError(f"{_lock_path(name)} belongs to another user")
            return cls(name, _posixshmem.shm_open(name, os.O_RDWR, mode=0o600), size, lock_fd)
        except BaseException:
            os.close(lock_fd)
            raise

    def unlink(self) -> None:
        """Remove the names; the mappings stay valid until close()."""
        for remove, name in ((_posixshmem.shm_unlink, self.name), (os.unlink, self.lock_path)):
            try:
                remove(name)
            except FileNotFoundError:
                pass

    def drop_lock(self) -> None:
        """Close the lock file now: only the portable flags (LockedFlags) take locks, and a
        descriptor per communicator adds up (macOS allows a process 256 by default)."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def close(self) -> None:
        self.buffer.release()
        self._map.close()
        self.drop_lock()


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _lock_path(name: str) -> str:
    """A file beside the segment for the fcntl locks of LockedFlags (macOS cannot lock a
    shared-memory object itself)."""
    return os.path.join(tempfile.gettempdir(), name.lstrip("/") + ".lock")
