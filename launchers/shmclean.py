"""Removing the shared memory a job's ranks leave behind when they die before unlinking it:
tbcoll's own (named from the job's TBCOLL_JOB) and MPICH's. tbcoll's ranks write each name
down in the job's folder of names (TBCOLL_SHM_NAMES) before they make the segment, on every
OS; Linux also lists both kinds under /dev/shm. macOS cannot list shared memory at all: there
tbcoll's names come from the folder alone, and MPICH's cannot be found."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

_SHM = "/dev/shm"
_UNMAP_WAIT = 2.0  # seconds killed ranks get to let go of their shared memory


def remove_job_segments(prefix: str, names: str | None, log: Callable[[str], None]) -> None:
    """Unlink the job's tbcoll segments (prefix: segment_prefix): those whose names its ranks
    wrote down in the folder names (TBCOLL_SHM_NAMES) and did not cross out, with the folder;
    and, where /dev/shm lists them, any other of the job's names."""
    if names is not None:
        remove_written_down(prefix, names, log)
    for path in _files(prefix.lstrip("/")):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log(f"could not remove the job's shared-memory file {path}: {e}")


def remove_written_down(prefix: str, folder: str, log: Callable[[str], None]) -> None:
    """Unlink each segment written down in folder under the job's prefix (what a killed rank
    made and did not unlink), then remove the records and the folder."""
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.startswith(prefix.lstrip("/")):
            _unlink_segment("/" + entry, log)
        try:
            os.unlink(os.path.join(folder, entry))
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError as e:
        log(f"could not remove the job's folder of shared-memory names {folder}: {e}")


def _unlink_segment(name: str, log: Callable[[str], None]) -> None:
    import _posixshmem  # here: only a job that left a segment needs it

    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass  # unlinked, and killed before it crossed the name out
    except OSError as e:
        log(f"could not remove the job's shared memory {name}: {e}")


def mpich_segments() -> set[str]:
    """MPICH's shared-memory files on this host."""
    return set(_files("mpich_shm_"))


def _files(prefix: str) -> list[str]:
    """The paths of the shared-memory files whose names start with prefix ([] on macOS)."""
    try:
        names = os.listdir(_SHM)
    except OSError:
        return []
    return [os.path.join(_SHM, name) for name in names if name.startswith(prefix)]


def remove_unmapped(created: set[str], log: Callable[[str], None]) -> None:
    """Remove the segments a failed job's ranks left: MPICH unlinks them at MPI_Finalize,
    which an aborted or killed rank never reaches. Only files created during the job that no
    process maps any more go; another job's live segment is mapped by its ranks. Ranks killed
    at teardown may take a moment to die: a segment still mapped is looked at again for up
    to _UNMAP_WAIT seconds."""
    deadline = time.monotonic() + _UNMAP_WAIT
    while created:
        still = mapped(created)
        for path in created - still:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # tbrun's janitor, which also watches the job, was first
            except OSError as e:
                log(f"could not remove MPICH's shared-memory file {path}: {e}")
        created = still
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def mapped(paths: set[str]) -> set[str]:
    """Those of paths that some process on this host maps."""
    mapped = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return mapped  # no /proc (macOS, where there is no /dev/shm to list either)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                text = maps.read()
        except OSError:
            continue  # the process ended, or is not ours to read
        mapped.update(path for path in paths if path in text)
    return mapped
