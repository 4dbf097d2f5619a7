"""Run one rank on a remote host: what tbrun starts there through ssh.

tbrun sends one JSON line on stdin, {"argv", "cwd", "env", "defaults", "files", "stdin"}, so
that the job's token never shows on a command line, then keeps stdin open. "files" maps a
variable to the content of a file it should name (MLX's hostfiles); they live in a private
temporary folder removed when the rank ends. Then come frames (tbcoll.launch.stdin): a signal to
pass on to the rank's process group ("TERM", "INT"; "USR2", tbcoll.observability.dumps' request for
stacks, to the rank's process alone), or the rank's input where "stdin" is
true (else the rank reads /dev/null). End of file means tbrun or the ssh connection is gone,
and the rank is killed: the remote twin of PR_SET_PDEATHSIG. The rank's output goes straight
to ssh's channels; the exit status is the rank's (128+N for signal N).

A rank on another host writes the shared-memory names it makes down in a folder of this
wrapper's (TBCOLL_SHM_NAMES, in the private temporary folder; a local wrapper's rank uses
tbrun's): when the rank has ended, the names it left there (it was killed between making a
segment and unlinking it) are unlinked, which is the only way on macOS, where shared memory
cannot be listed. Only this rank's: the job's other ranks here may still use theirs.

When the rank has ended (by itself or killed), what it started is killed too: its process
group and, on Linux, what left that group (tbcoll.launch.reaper): this wrapper is a child
subreaper, so the rank's orphans (a child in a session of its own, a double-forked daemon)
become its children, reaped as they end; and on this host every process of this user that
carries this rank's marks (TBCOLL_JOB and TBCOLL_RANK: the job's other ranks here have
wrappers of their own).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from tbcoll.launch.openfiles import raise_open_files
from tbcoll.launch.reaper import carrying, descendants, set_subreaper, sweep
from tbcoll.launch.shmclean import remove_written_down
from tbcoll.launch.stdin import read_frames

from tbcoll.job.env import job_id, rank_marks, segment_names, segment_prefix
from tbcoll.observability.dump_keys import STACKS_SIGNAL

_PATIENCE = 5.0  # seconds the sweep may go on killing what keeps forking


def _fail(message: str, status: int) -> None:
    print(f"tbrun: on {socket.gethostname()}: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def _read_setup() -> tuple[bytes, bytes]:
    """The set-up line, and what followed it in the same reads. os.read, not sys.stdin: no
    BufferedReader, whose lock a thread still reading at interpreter exit makes fatal."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def _follow_orders(pid: int, rest: bytes, feed: queue.SimpleQueue | None) -> None:
    """Pass on signals and input until tbrun goes away; then kill the rank."""
    pending = [rest]

    def read(n: int) -> bytes:
        return (pending.pop() if pending else b"") or os.read(0, n)

    for kind, payload in read_frames(read):
        name = payload.decode(errors="replace")
        if kind == "signal" and name in ("INT", "TERM", "HUP", "KILL", "CONT"):
            _signal_group(pid, signal.Signals[f"SIG{name}"])
        elif kind == "signal" and name == STACKS_SIGNAL.name[3:]:
            _signal_rank(pid, STACKS_SIGNAL)  # its children need not handle it
        elif kind == "stdin" and feed is not None:
            feed.put(payload)
    _signal_group(pid, signal.SIGKILL)


def _feed_input(pipe, feed: queue.SimpleQueue) -> None:
    """Write the rank's input in a thread of its own, so that a rank not reading it never
    holds up the signals behind it; b'' ends the input."""
    try:
        while chunk := feed.get():
            pipe.write(chunk)
            pipe.flush()
    except OSError:
        pass  # the rank closed its stdin or ended
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_rank(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_reaping(proc: subprocess.Popen) -> int:
    """Wait for the rank, reaping the orphans adopted meanwhile; its Popen returncode."""
    while True:
        child, status = os.waitpid(-1, 0)
        if child == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode


def _end_leftovers(pid: int, env: dict[str, str]) -> None:
    """SIGKILL what the rank left: its process group, then what left the group."""
    _signal_group(pid, signal.SIGKILL)
    marks = rank_marks(env)
    me = os.getpid()
    sweep(lambda table: {p.pid: p for p in [*descendants(me, table), *carrying(marks, table)]
                         }.values(), (), _PATIENCE)


def _names_folder(folder: str, env: dict[str, str]) -> str | None:
    """A folder in folder where the rank writes its shared-memory names down, set in env as
    TBCOLL_SHM_NAMES; None where tbrun gave one (a local wrapper) or there is no job."""
    if segment_names(env) or not job_id(env):
        return None
    names = os.path.join(folder, "shm")
    os.mkdir(names, 0o700)
    env["TBCOLL_SHM_NAMES"] = names
    return names


def main() -> None:
    line, rest = _read_setup()
    try:
        setup = json.loads(line)
        argv, cwd = list(setup["argv"]), setup["cwd"]
        env = {**setup["defaults"], **os.environ, **setup["env"]}
    except (ValueError, KeyError, TypeError) as e:
        _fail(f"tbcoll.launch.remote expects tbrun's set-up line on stdin ({e})", 2)
    if not os.path.isdir(cwd):
        _fail(f"working directory {cwd} does not exist here; give tbrun --cwd DIR", 2)
    set_subreaper(True)  # the rank's orphans become this wrapper's children (Linux)
    raise_open_files()  # as tbrun does, for a rank on another host
    with tempfile.TemporaryDirectory(prefix="tbrun-") as folder:  # mode 0700
        for name, content in setup.get("files", {}).items():
            path = os.path.join(folder, f"{name}.json")
            with open(path, "w") as f:
                f.write(content)
            env[name] = path
        names = _names_folder(folder, env)
        wants_input = bool(setup.get("stdin"))
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                                    stdin=subprocess.PIPE if wants_input else subprocess.DEVNULL)
        except OSError as e:
            _fail(f"cannot start {argv[0]}: {e.strerror}", 127)
        feed = queue.SimpleQueue() if wants_input else None
        if feed is not None:
            threading.Thread(target=_feed_input, args=(proc.stdin, feed), daemon=True).start()
        threading.Thread(target=_follow_orders, args=(proc.pid, rest, feed),
                         daemon=True).start()
        status = _wait_reaping(proc)
        _end_leftovers(proc.pid, env)
        if names is not None:
            remove_written_down(segment_prefix(job_id(env)), names,
                                lambda message: print(f"tbrun: on {socket.gethostname()}: "
                                                      f"{message}", file=sys.stderr))
    sys.exit(status if status >= 0 else 128 - status)


if __name__ == "__main__":
    main()
