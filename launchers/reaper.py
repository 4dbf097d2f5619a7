"""Find and end what a job's processes left behind outside their process groups (Linux).

A rank's child that starts a session of its own (`Popen(start_new_session=True)`, setsid,
`process_group=0`) leaves the rank's process group, and a daemon that double-forks leaves its
parent too: killpg and PR_SET_PDEATHSIG miss both. Two nets catch them:

- the process that supervises a host's ranks (tbrun, or tbcoll.launch.remote) makes itself a child
  subreaper (PR_SET_CHILD_SUBREAPER): an orphan of the job is reparented to it instead of to
  init, so it stays a descendant, found by walking /proc, and its zombie is reaped here;
- every process of the job inherits the job's cookie, TBCOLL_JOB=<job id>, in its environment
  (as Jenkins' BUILD_ID): when the supervisor is dead (kill -9 of tbrun), tbcoll.launch.janitor
  finds them by reading /proc/<pid>/environ of this user's processes.

What escapes both: a process that drops the cookie from its environment (env -i) while its
subreaper is gone. macOS has no subreaper and no /proc: there these functions find nothing,
and only the ranks' process groups are reached.

A process is known by its pid and its start time, and is signalled through a pidfd opened
after its start time was checked again: a pid reused meanwhile is never signalled.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from tbcoll.core.records import record

LINUX = sys.platform.startswith("linux")
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_ROUND_PAUSE = 0.02  # between sweeps: killed processes vanish, a forking one shows its child


@record
class Proc:
    pid: int
    ppid: int
    started: int  # clock ticks after boot: with the pid, names the process
    zombie: bool


def new_job_id() -> str:
    """A job's TBCOLL_JOB: random, so that no other job carries it; not a secret (every
    process of the user can read it), unlike the job's token."""
    return os.urandom(8).hex()


def set_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (or stop being one); returns what it was before,
    None where there is no such thing (not Linux), so that the caller can put it back."""
    if not LINUX:
        return None
    try:
        from tbcoll.launch._subreaper import swap
    except ImportError:  # not built at install (launchers/_subreaper.c)
        swap = _swap_by_ctypes
    return swap(on)


def _swap_by_ctypes(on: bool) -> bool | None:
    """_subreaper.swap's prctl calls, through ctypes."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    before = ctypes.c_int()
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return None
    return bool(before.value)


def processes() -> dict[int, Proc]:
    """Every process /proc shows (none without /proc), read once: a snapshot."""
    found = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit() and (proc := _stat(int(name))) is not None:
            found[proc.pid] = proc
    return found


def descendants(root: int, table: Mapping[int, Proc], spare: Collection[int] = ()
                ) -> list[Proc]:
    """The live processes below root (not the zombies), leaving out the subtrees of spare."""
    below: dict[int, list[Proc]] = {}
    for proc in table.values():
        below.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [root]
    while todo:
        for proc in below.get(todo.pop(), ()):
            if proc.pid in spare:
                continue
            todo.append(proc.pid)
            if not proc.zombie:
                found.append(proc)
    return found


def carrying(marks: Collection[bytes], table: Mapping[int, Proc]) -> list[Proc]:
    """This user's live processes, not this one, whose environment holds every entry of
    marks (whole NAME=VALUE entries). Only those started since this one are read: every
    caller (tbrun, its janitor, tbcoll.launch.remote) starts before the processes that carry
    its job's marks, and the others' environments cost ~5 us each to read."""
    if not marks:
        return []
    me = table.get(os.getpid()) or _stat(os.getpid())
    since = me.started if me is not None else 0
    return [proc for proc in table.values()
            if proc.pid != os.getpid() and not proc.zombie and proc.started >= since
            and _has_marks(proc.pid, marks)]


def kill(procs: Iterable[Proc], sig: int = signal.SIGKILL) -> int:
    """Signal each process that is still the one seen (same start time); how many were."""
    sent = 0
    for proc in procs:
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError as e:
            if e.errno == errno.ENOSYS and _unchanged(proc):  # Linux before 5.3: a small race
                sent += _send(os.kill, proc.pid, sig)
            continue  # else it is gone
        try:
            if _unchanged(proc):
                sent += _send(signal.pidfd_send_signal, fd, sig)
        finally:
            os.close(fd)
    return sent


def children(pid: int) -> set[int]:
    """pid's children: from /proc/PID/task/TID/children (one file a thread) where the kernel
    lists them, else from a scan of every process (~6 us each)."""
    try:
        found = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.update(int(child) for child in f.read().split())
        return found
    except (OSError, ValueError):  # no /proc (macOS), or a kernel without the lists
        return {proc.pid for proc in processes().values() if proc.ppid == pid}


def reap_adopted(own: Collection[int], table: Mapping[int, Proc] | None = None) -> None:
    """Reap the zombies among this process's children that it did not start itself (own:
    the pids whose exit status someone here still waits for): orphans it adopted as a
    subreaper, which would otherwise pile up. table: a snapshot of processes() to read them
    from, else this process's children as the kernel lists them now."""
    me = os.getpid()
    adopted = (children(me) if table is None
               else {proc.pid for proc in table.values() if proc.ppid == me and proc.zombie})
    for pid in adopted - set(own):
        try:
            os.waitpid(pid, os.WNOHANG)  # a child still running is left alone
        except ChildProcessError:
            pass  # reaped meanwhile


def sweep(find: Callable[[Mapping[int, Proc]], Iterable[Proc]], own: Collection[int],
          patience: float) -> int:
    """SIGKILL what find(snapshot) returns, again and again until it returns nothing (a
    process may fork while it is being killed) or patience seconds passed; reap what this
    process adopted. Returns how many processes were killed."""
    deadline = time.monotonic() + patience
    killed = 0
    while True:
        table = processes()
        reap_adopted(own, table)
        found = list(find(table))
        if not found or time.monotonic() > deadline:
            return killed
        killed += kill(found)
        time.sleep(_ROUND_PAUSE)


def _unchanged(proc: Proc) -> bool:
    """The process with proc's pid is still proc (a pid is reused once its process ends)."""
    again = _stat(proc.pid)
    return again is not None and again.started == proc.started


def _send(send: Callable[[int, int], None], target: int, sig: int) -> int:
    """send(target, sig); 1 if it was sent."""
    try:
        send(target, sig)
        return 1
    except OSError:
        return 0  # it ended meanwhile, or is not this user's


def _stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None  # gone
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = text.rpartition(b")")[2].split()
    try:
        return Proc(pid, int(fields[1]), int(fields[19]), fields[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def _has_marks(pid: int, marks: Collection[bytes]) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False  # another user's: not ours to kill, and unreadable anyway
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = set(f.read().split(b"\0"))
    except OSError:
        return False  # gone, or not readable (a process that changed its credentials)
    return all(mark in entries for mark in marks)
