"""The RDMA lab's agent: runs inside the VM (as its --exec), brings up Soft-RoCE, then runs
the commands the host drops into the lab's folder, one thread each, until told to stop.

Host and guest share only that folder (a 9p mount, where inotify sees nothing: poll). Every
file appears by rename, so neither side reads half of one:
  host -> guest  cmd-ID.json  {"argv", "env", "cwd", "timeout"}; stop (empty: shut down);
                 heartbeat    (a count the host rewrites every few seconds while it lives)
  guest -> host  ready.json   {"device", "address", "netdev", "seconds"} or failed.json {"error"}
                 res-ID.json  {"returncode", "stdout", "stderr", "timed_out", "error"}
Standard library only: it runs on the guest's view of the host's Python.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DEVICE = "rxe0"
NETDEV = "rxelab0"  # a veth; its peer rxelab1 is only there to make the link come up
ADDRESS = "10.99.0.1"
# seconds between looks at the folder: each look is Python and 9p under emulation, so an
# idle VM polling every 0.02 s took a quarter of a host core for the whole session
POLL = 0.1
# the host's root again, mounted with the guest's page cache (rdmalab.py: CACHED_SHARE)
CACHED_TAG, CACHED_AT = "tbcoll.host", "/run/tbcoll-host"
HEARTBEAT_LOST = 60  # seconds without a new heartbeat from the host: it is gone, power off


def write_json(folder: Path, name: str, value: dict) -> None:
    """Write folder/name whole: to a temporary name first, then rename."""
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(value))
    os.replace(tmp, folder / name)


def sh(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): "
                           f"{(p.stderr or p.stdout).strip()}")
    return p.stdout


def port_ready() -> bool:
    """rxe0's port 1 is ACTIVE and has its IPv4-mapped GID (index 1)."""
    port = Path(f"/sys/class/infiniband/{DEVICE}/ports/1")
    try:
        state = (port / "state").read_text()
        gid = (port / "gids/1").read_text().strip()
    except OSError:
        return False
    return "ACTIVE" in state and gid.replace("0", "").replace(":", "") != ""


def bring_up_rxe() -> None:
    """rdma_rxe on a veth with an IPv4 address; one device that every process shares (two rxe
    devices on one guest did not reach RTR, rxe inside a network namespace hung: kernel 6.1)."""
    sh("modprobe", "rdma_rxe")
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", NETDEV, "type", "veth", "peer", "name", "rxelab1")
    sh("ip", "addr", "add", f"{ADDRESS}/24", "dev", NETDEV)
    sh("ip", "link", "set", "rxelab1", "up")
    sh("ip", "link", "set", NETDEV, "up")
    sh("rdma", "link", "add", DEVICE, "type", "rxe", "netdev", NETDEV)
    deadline = time.monotonic() + 30
    while not port_ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{DEVICE} did not become ACTIVE with a GID within 30 s")
        time.sleep(0.05)


def cache_python(paths: list[str]) -> None:
    """Bind paths (this checkout, the Pythons) from a cached view of the host's root over the
    uncached one vng gives: a Python start is then 1.7 s, not 2.7, `import numpy` 6 s, not 10.
    cache=loose: the guest keeps what it read and never asks again, which is right for files
    that do not change while the lab is up (the tests' own files are under /tmp, not cached)."""
    os.makedirs(CACHED_AT, exist_ok=True)
    sh("mount", "-t", "9p", "-o", "ro,trans=virtio,version=9p2000.L,msize=524288,cache=loose",
       CACHED_TAG, CACHED_AT)
    for path in sorted(set(paths)):
        if not any(path.startswith(outer + "/") for outer in paths):
            sh("mount", "--bind", CACHED_AT + path, path)


def run_one(folder: Path, ident: str, request: dict, running: set) -> None:
    """Run one command to completion or to its timeout (then kill its whole group)."""
    result = {"returncode": None, "stdout": "", "stderr": "", "timed_out": False, "error": None}
    env = {**os.environ, **(request.get("env") or {})}
    try:
        proc = subprocess.Popen(request["argv"], env=env, cwd=request.get("cwd"),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
    except OSError as e:
        result["error"] = f"{type(e).__name__}: {e}"
    else:
        try:
            result["stdout"], result["stderr"] = proc.communicate(timeout=request["timeout"])
        except subprocess.TimeoutExpired:
            result["timed_out"] = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            result["stdout"], result["stderr"] = proc.communicate()
        result["returncode"] = proc.returncode
    write_json(folder, f"res-{ident}.json", result)
    running.discard(ident)


def host_alive(folder: Path, seen: list) -> bool:
    """False once the host's heartbeat file has not changed for HEARTBEAT_LOST seconds: the
    host process died without stopping the lab (SIGKILL), and nobody else will."""
    now = time.monotonic()
    if now - seen[1] >= 1:  # look once a second
        try:
            beat = (folder / "heartbeat").read_text()
        except OSError:
            beat = None
        if beat != seen[0]:
            seen[:] = [beat, now, now]
        else:
            seen[1] = now
    return now - seen[2] < HEARTBEAT_LOST


def serve(folder: Path) -> None:
    """Run each cmd-ID.json once, until `stop` appears, the folder is gone or the host is."""
    running: set[str] = set()
    seen = [None, 0.0, time.monotonic()]  # the last heartbeat, when looked, when it changed
    while (folder.is_dir() and not (folder / "stop").exists()
           and host_alive(folder, seen)):
        for name in os.listdir(folder):
            if not (name.startswith("cmd-") and name.endswith(".json")):
                continue
            ident = name[4:-5]
            path = folder / name
            request = json.loads(path.read_text())
            path.unlink()
            running.add(ident)
            threading.Thread(target=run_one, args=(folder, ident, request, running),
                             daemon=True).start()
        time.sleep(POLL)


def main() -> None:
    folder = Path(sys.argv[1])
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    started = time.monotonic()
    try:
        cache_python([os.path.realpath(p) for p in (os.getcwd(), sys.prefix, sys.base_prefix)])
        bring_up_rxe()
    except Exception as e:  # any failure: tell the host why, in one line
        write_json(folder, "failed.json", {"error": f"{type(e).__name__}: {e}"})
        return
    # for commands: `ib_write_lat -d $RDMALAB_DEVICE ... $RDMALAB_ADDRESS`
    os.environ.update(RDMALAB_DEVICE=DEVICE, RDMALAB_ADDRESS=ADDRESS)
    write_json(folder, "ready.json", {"device": DEVICE, "address": ADDRESS, "netdev": NETDEV,
                                      "seconds": round(time.monotonic() - started, 2)})
    serve(folder)


if __name__ == "__main__":
    main()
