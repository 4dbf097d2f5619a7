"""POSIX shared-memory segments: created 0600 by one rank, mapped by the others, and unlinked
as soon as everyone has mapped it, so that no name outlives the job even if it is killed.

Names are /tbc-<job>-<random>: <job> comes from the job's TBCOLL_JOB (see
tbcoll.job.env.segment_prefix), which is how tbrun finds a dead job's leftovers; the random part,
which the creator tells the others, keeps another local user from planting the name first
(a name that exists is never used: O_EXCL, and another is drawn); a rank that maps a segment
by name first checks that it is this user's, 0600, and as large as expected. The whole name
stays within macOS's 31 characters. Nothing is made in a folder other users share.

Under tbrun, a rank writes each name down in the job's folder (TBCOLL_SHM_NAMES) before it
makes the segment, and crosses it out after unlinking it: a rank killed in between leaves the
name there for tbrun (or its janitor) to unlink. On Linux tbrun could also list /dev/shm;
macOS has no way to list shared memory, and without the record the segment would stay until
reboot.
"""

from __future__ import annotations

# _posixshmem is CPython's module behind multiprocessing.shared_memory, used directly to keep
# that module's resource-tracker process (which unlinks segments at exit) out of every rank.
import _posixshmem
import mmap
import os
import secrets
import stat

from tbcoll.job.env import segment_names, segment_record

MAX_NAME = 31  # PSHMNAMLEN on macOS
_RANDOM = 5  # bytes of the random part: 10 hex digits
_TRIES = 8
_NEW_RECORD = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# What to do where a segment cannot be had. Linux keeps POSIX shared memory in /dev/shm, a
# tmpfs of its own size (64 MB in a Docker container by default); macOS has no such file
# system: ftruncate of a segment allocates its memory (XNU's pshm_truncate, mach_vm_allocate)
# with no limit of its own, so memory is the limit (the kern.sysv.shm* sysctls are System V's).
NO_ROOM_ADVICE = ("on Linux enlarge /dev/shm (e.g. docker --shm-size); on macOS, which has no "
                  "/dev/shm, free memory or run fewer ranks; or use --backend tcp")


class SegmentSpaceError(OSError):
    """The system has no room for a segment of the size asked."""


class Segment:
    def __init__(self, name: str, fd: int, size: int, record: str | None = None) -> None:
        self.name, self.size = name, size
        self._record = record  # where this rank wrote the name down (the creator only)
        try:
            self._map = mmap.mmap(fd, size)  # (it keeps a descriptor of its own)
        finally:
            os.close(fd)
        self.buffer = memoryview(self._map)

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
        record = _write_down(name)
        try:
            fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except BaseException:
            _cross_out(record)  # not this rank's segment: tbrun must not unlink it
            raise
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):  # Linux: claim the pages now, so that a full
                os.posix_fallocate(fd, 0, size)  # /dev/shm is an error here, not a SIGBUS later
        except OSError as e:
            os.close(fd)
            _posixshmem.shm_unlink(name)
            _cross_out(record)
            raise SegmentSpaceError(
                f"cannot make a {size / 2**20:.1f} MiB shared-memory segment ({e.strerror}): "
                f"{NO_ROOM_ADVICE}") from e
        return cls(name, fd, size, record)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        """Map the segment another rank created, if it is this user's alone and whole."""
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise PermissionError(f"shared memory {name} is not this user's alone "
                                      f"(owner {info.st_uid}, mode {info.st_mode & 0o777:o})")
            if info.st_size < size:
                raise PermissionError(f"shared memory {name} holds {info.st_size} bytes, not "
                                      f"the {size} its creator made")
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, size)

    def unlink(self) -> None:
        """Remove the name (and its record); the mappings stay valid until close()."""
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass
        _cross_out(self._record)
        self._record = None

    def close(self) -> None:
        self.buffer.release()
        try:
            self._map.close()
        except BufferError:
            # arrays still view the mapping (a traceback's frames hold them at exit after a
            # failed call): it stays mapped until they go, or the process ends
            pass


def _write_down(name: str) -> str | None:
    """Write name down in the job's folder (TBCOLL_SHM_NAMES) before the segment is made, so
    that tbrun can unlink it should this rank be killed: the record's path, None with no
    folder. A record that exists already is a name taken (FileExistsError: draw another)."""
    folder = segment_names()
    if not folder:
        return None
    path = segment_record(folder, name)
    try:
        os.close(os.open(path, _NEW_RECORD, 0o600))
    except FileExistsError:
        raise
    except OSError as e:
        raise OSError(e.errno, f"cannot write down the shared-memory name {name} in "
                      f"TBCOLL_SHM_NAMES={folder} ({e.strerror}): tbrun sets it for the "
                      "job's ranks on its host; unset it where it was set by hand") from None
    return path


def _cross_out(record: str | None) -> None:
    if record is not None:
        try:
            os.unlink(record)
        except FileNotFoundError:
            pass
