"""What cleans up after a tbrun that was killed (kill -9, OOM killer): a child of tbrun, forked
(not a new interpreter: tbrun's modules are loaded already, and a fresh Python would cost
~50 ms of CPU at every launch) into a session of its own before any rank and before tbrun has
any thread.

tbrun tells it, one line each through a pipe, what a dead tbrun would leave: "group PGID" (a
rank's process group: the rank and whatever it started), "job ID" (the job's TBCOLL_JOB, which
every process of the job inherits), "folder PATH" (the job's private folder), "shm PREFIX
[FOLDER]" (the job's shared-memory names, and the folder where its ranks write them down:
TBCOLL_SHM_NAMES), "mpich" (MPICH's shared memory that ranks create during the
job), and "done" when tbrun has cleaned up itself. End of file without "done" means tbrun
died: the janitor kills every group with SIGKILL, then every process of this user that still
carries the job's cookie (on Linux: a child that left its rank's group for a session of its
own, a daemon; tbcoll.launch.reaper), removes the folders and the job's shared memory (and
Hydra's topology files: tbcoll.launch.hydratopo), and exits.
PR_SET_PDEATHSIG kills only the rank itself, and exists on Linux only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tbcoll.launch.hydratopo import held_topologies, remove_topologies
from tbcoll.launch.reaper import carrying, descendants, processes, sweep
from tbcoll.launch.shmclean import mpich_segments, remove_job_segments, remove_unmapped

from tbcoll.job.env import job_marks

_PATIENCE = 5.0  # seconds the sweep may go on killing a job that keeps forking
_WRAPPER_PATIENCE = 2.0  # seconds a local wrapper gets to kill its rank and exit


class Janitor:
    """tbrun's side: start the janitor and tell it what to clean up should tbrun die."""

    def __init__(self) -> None:
        read, write = os.pipe()  # close-on-exec: no rank inherits the write end
        self._pid = os.fork()
        if self._pid == 0:  # the janitor
            status = 1
            try:
                os.setsid()  # tbrun's Ctrl-C and its group's signals are not the janitor's
                os.close(write)
                with open(read, "rb") as orders:
                    main(orders)
                status = 0
            finally:
                os._exit(status)  # never tbrun's exit handlers or buffers
        os.close(read)
        self._orders = open(write, "wb")  # closed by dismiss

    def watch_group(self, pgid: int, wrapped: bool = False) -> None:
        """wrapped: the group of a local tbcoll.launch.remote, whose rank runs in a session
        of its own, which the wrapper kills when tbrun's pipe to it ends."""
        self._say(f"{'wrapped' if wrapped else 'group'} {pgid}")

    def watch_job(self, job: str) -> None:
        self._say(f"job {job}")

    def watch_folder(self, path: str) -> None:
        self._say(f"folder {path}")

    def watch_segments(self, prefix: str, names: str | None) -> None:
        """prefix: segment_prefix, with no space; names: TBCOLL_SHM_NAMES's folder."""
        self._say(f"shm {prefix} {names or ''}".rstrip())

    def watch_mpich(self) -> None:
        self._say("mpich")

    def dismiss(self) -> None:
        """tbrun cleaned up itself: the janitor leaves without touching anything."""
        self._say("done")
        self._orders.close()
        os.waitpid(self._pid, 0)

    def _say(self, line: str) -> None:
        try:
            self._orders.write(f"{line}\n".encode())
            self._orders.flush()
        except OSError:
            pass  # it died: nothing more can be done here


@contextmanager
def janitor_for(segments: str | None = None, names: str | None = None, mpich: bool = False,
                job: str | None = None) -> Iterator[Janitor]:
    """A janitor that knows the job's shared-memory prefix and the folder of names its ranks
    write down (or that MPICH's shared memory is to be watched) and the job's TBCOLL_JOB, and
    is dismissed when the block ends: put tbrun's own clean-up inside the block."""
    janitor = Janitor()
    try:
        if job is not None:
            janitor.watch_job(job)
        if segments is not None:
            janitor.watch_segments(segments, names)
        if mpich:
            janitor.watch_mpich()
        yield janitor
    finally:
        janitor.dismiss()


def main(orders: Iterable[bytes]) -> None:
    """Read tbrun's orders until "done" (leave) or their end (tbrun died: clean up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is tbrun's to handle
    groups, wrapped, folders, prefixes, jobs = [], [], [], [], []
    mpich_before = None
    for raw in orders:
        kind, _, value = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if kind == "done":
            return
        if kind == "group" and value.isdigit():
            groups.append(int(value))
        elif kind == "wrapped" and value.isdigit():
            wrapped.append(int(value))
        elif kind == "job" and value:
            jobs.append(job_marks(value))
        elif kind == "folder":
            folders.append(value)
        elif kind == "shm":
            prefix, _, names = value.partition(" ")
            prefixes.append((prefix, names or None))
        elif kind == "mpich":
            mpich_before = mpich_segments()
    topologies = []
    if mpich_before is not None:  # Hydra's proxies (sessions of their own) outlive mpiexec
        table = processes()
        topologies = held_topologies(p.pid for pgid in groups for p in descendants(pgid, table))
    _let_wrappers_end(wrapped)
    for pgid in groups + wrapped:  # tbrun is gone: end everything it started
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for marks in jobs:  # what left the groups: this user's processes with the job's cookie
        sweep(lambda table, marks=marks: carrying(marks, table), (), _PATIENCE)
    if folders:
        import shutil  # here: tbrun's start-up does without it (~2 ms)

        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    for prefix, names in prefixes:  # after the ranks' end: none writes a name down any more
        remove_job_segments(prefix, names, log=lambda message: None)
    if mpich_before is not None:
        remove_unmapped(mpich_segments() - mpich_before, log=lambda message: None)
        remove_topologies(topologies)


def _let_wrappers_end(pgids: list[int]) -> None:
    """Wait (up to _WRAPPER_PATIENCE) for the local wrappers' groups to end: each kills its
    rank, whose session only it knows (macOS has no /proc to find it by), once tbrun's pipe
    to it ends. A SIGKILL first would leave the rank running."""
    deadline = time.monotonic() + _WRAPPER_PATIENCE
    while pgids and time.monotonic() < deadline:
        pgids = [pgid for pgid in pgids if _group_exists(pgid)]
        time.sleep(0.02)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
