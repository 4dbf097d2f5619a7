"""Run one rank on a remote host: what tbrun starts there through ssh.

tbrun sends one JSON line on stdin, {"argv", "cwd", "env", "defaults", "files"}, so that the
job's token never shows on a command line, then keeps stdin open. "files" maps a variable to
the content of a file it should name (MLX's hostfiles); they live in a private temporary
folder removed when the rank ends. Each further line names a signal
to pass on to the rank's process group ("TERM", "INT"); end of file means tbrun or the ssh
connection is gone, and the rank is killed: the remote twin of PR_SET_PDEATHSIG. The rank's
output goes straight to ssh's channels; the exit status is the rank's (128+N for signal N).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator


def _fail(message: str, status: int) -> None:
    print(f"tbrun: on {socket.gethostname()}: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def _stdin_lines() -> Iterator[bytes]:
    """Lines of stdin read with os.read: no BufferedReader, whose lock a thread still reading
    at interpreter exit makes fatal."""
    pending = b""
    while chunk := os.read(0, 4096):
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            yield line
    if pending:
        yield pending


def _follow_orders(pid: int, lines: Iterator[bytes]) -> None:
    for line in lines:
        name = line.strip().decode(errors="replace")
        if name in ("INT", "TERM", "HUP", "KILL"):
            _signal_group(pid, signal.Signals[f"SIG{name}"])
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> None:
    lines = _stdin_lines()
    try:
        setup = json.loads(next(lines, b""))
        argv, cwd = list(setup["argv"]), setup["cwd"]
        env = {**setup["defaults"], **os.environ, **setup["env"]}
    except (ValueError, KeyError, TypeError) as e:
        _fail(f"launchers.remote expects tbrun's set-up line on stdin ({e})", 2)
    if not os.path.isdir(cwd):
        _fail(f"working directory {cwd} does not exist here; give tbrun --cwd DIR", 2)
    with tempfile.TemporaryDirectory(prefix="tbrun-") as folder:  # mode 0700
        for name, content in setup.get("files", {}).items():
            path = os.path.join(folder, f"{name}.json")
            with open(path, "w") as f:
                f.write(content)
            env[name] = path
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            _fail(f"cannot start {argv[0]}: {e.strerror}", 127)
        threading.Thread(target=_follow_orders, args=(proc.pid, lines), daemon=True).start()
        status = proc.wait()
    sys.exit(status if status >= 0 else 128 - status)


if __name__ == "__main__":
    main()
