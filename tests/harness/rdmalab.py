"""The RDMA lab: a VM with the kernel's Soft-RoCE (rdma_rxe), booted once, running many commands.

This kernel has no RDMA; a guest kernel does. One VM (virtme-ng over QEMU's software
emulation: /dev/kvm here does not boot guests) sees the host's file system as its own, so this
checkout and its venv are there. Inside, tests/harness/rdmalab_agent.py puts rxe0 on a veth with
an IPv4 address and runs the commands Lab.run hands it through a private folder. Every process
shares rxe0: two rxe devices on one guest did not reach RTR, rxe in a network namespace hung.

    with Lab() as lab:
        p = lab.run(["ibv_devices"], timeout=30)   # a subprocess.CompletedProcess
        lab.device, lab.address                    # "rxe0", its netdev's IPv4 address

From a shell: `python -m tests.harness.rdmalab -- ibv_devinfo` (boots, runs, prints, exits with
the command's status). `make rdma-lab` installs what it needs and runs a self-check.

What the guest sees: the host's files read-only, except the lab's folder (read-write, both
ways) and overlays on /tmp, /etc, /var, /home, /opt, /usr (the host's files as of each read;
what the guest writes there stays in the guest). A Python loop runs ~16x slower than here, and
a Python process takes ~1.7 s to start.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).resolve().with_name("rdmalab_agent.py")
INSTALL = "as root: `make rdma-lab` installs it"
# Modules udev would load for QEMU's emulated hardware (watchdog, SATA, CD-ROM, PC speaker,
# kvm, crypto accelerations...). Each costs seconds under emulation and rdma_rxe needs none
# of them: not loading them cut a boot from ~31 s to ~13 s here.
NOT_LOADED = ("kvm,kvm_amd,kvm_intel,powernow_k8,iTCO_wdt,iTCO_vendor_support,sr_mod,cdrom,"
              "ahci,libahci,psmouse,i6300esb,lpc_ich,i2c_i801,pcspkr,aesni_intel,crypto_simd,"
              "cryptd,ghash_clmulni_intel,sha512_ssse3,sha256_ssse3,evdev,button,joydev,sg,"
              "serio_raw,intel_rapl_msr,intel_rapl_common,ata_generic,ata_piix,drm,bochs,"
              "qemu_fw_cfg,virtio_rng,rng_core,polyval_clmulni,polyval_generic,crc32_pclmul,"
              "crc32c_intel")
# Guest kernel options. hpet is the clocksource the guest picks under emulation, and every
# clock read is then a trapped syscall (~0.3 ms: 2400 of them in numpy's import, and one each
# 16 polls of a waiting rank); tsc reads in user space. TCG's TSC runs at a steady rate, so the
# boot-time stability watchdog is turned off with tsc=reliable.
KERNEL_OPTIONS = f"modprobe.blacklist={NOT_LOADED} clocksource=tsc tsc=reliable"
# A second share of the host's root for tests/harness/rdmalab_agent.py, read-only like the root
# one vng makes. vng mounts its own without a cache (each stat, open and read a round trip to
# QEMU), and a tag is mounted once; the agent mounts this one with the guest's cache.
CACHED_SHARE = ("-fsdev local,id=tbcoll_host,path=/,security_model=none,readonly=on,"
                "multidevs=remap -device virtio-9p-pci,fsdev=tbcoll_host,mount_tag=tbcoll.host")
POLL = 0.02  # seconds between looks for a result file
HEARTBEAT = 5  # seconds between the host's heartbeats (the agent gives up after 60 without)


class LabError(RuntimeError):
    """The lab could not boot, or its VM went away."""


def find_kernel() -> str | None:
    """The newest /boot/vmlinuz-VERSION whose modules include rdma_rxe."""
    def version(path: Path) -> list:
        return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", path.name[8:])]
    for kernel in sorted(Path("/boot").glob("vmlinuz-*"), key=version, reverse=True):
        rxe = Path("/lib/modules", kernel.name[8:], "kernel/drivers/infiniband/sw/rxe")
        if any(rxe.glob("rdma_rxe.ko*")):
            return str(kernel)
    return None


def find_vng() -> str | None:
    """virtme-ng's vng: beside this Python (make rdma-lab puts it in .venv), else on PATH."""
    beside = Path(sys.executable).with_name("vng")
    return str(beside) if beside.exists() else shutil.which("vng")


def why_not_available() -> str | None:
    """A one-line reason the lab cannot run here (and what to install), or None."""
    if not sys.platform.startswith("linux"):
        return "the RDMA lab runs a Linux guest under QEMU: Linux hosts only"
    if os.geteuid() != 0:
        return "the RDMA lab needs root (the guest's root user reads /boot and the host's files)"
    needs = [("qemu-system-x86_64", "qemu-system-x86"), ("busybox", "busybox-static"),
             ("ibv_devices", "ibverbs-utils"), ("ib_write_lat", "perftest"),
             ("rdma", "iproute2")]
    for tool, package in needs:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package}; {INSTALL})"
    if not any(Path(d).glob("libibverbs.so.1") for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib")):
        return f"libibverbs.so.1 is not installed (apt-get install libibverbs1; {INSTALL})"
    if find_kernel() is None:
        return ("no /boot/vmlinuz-* with the rdma_rxe module (apt-get install "
                f"linux-image-amd64; {INSTALL})")
    if find_vng() is None:
        return f"virtme-ng is not installed (pip install virtme-ng into this venv; {INSTALL})"
    return None


class Lab:
    """One VM with rxe0 up, for the life of the context (or start() .. stop())."""

    def __init__(self, cpus: int = 2, memory: str = "3G", boot_timeout: float = 300) -> None:
        self.cpus, self.memory, self.boot_timeout = cpus, memory, boot_timeout
        self.device = ""  # "rxe0" once started
        self.address = ""  # the IPv4 address of the netdev rxe0 sits on
        self.netdev = ""
        self.boot_seconds = 0.0  # from starting QEMU to rxe0 ready, setup included
        self.setup_seconds = 0.0  # rdma_rxe, the veth and rxe0, inside the guest
        self.folder: Path | None = None  # shared with the guest, read-write; mode 0700
        self._vm: subprocess.Popen | None = None
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._beating = threading.Event()  # set: stop beating

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Lab:
        """Boot the VM and wait until the agent has rxe0 up; raise LabError if it cannot."""
        reason = why_not_available()
        if reason:
            raise LabError(reason)
        self.folder = Path(tempfile.mkdtemp(prefix="tbcoll-rdmalab-"))  # 0700: ours alone
        atexit.register(self.stop)
        vng = find_vng()
        bin_dir = str(Path(vng).parent)  # vng calls virtme-run from its own bin/
        argv = [vng, "--disable-kvm", "--cpus", str(self.cpus), "--memory", self.memory,
                "--run", find_kernel(), "--user", "root", "--rwdir", str(self.folder),
                "--cwd", str(REPO), "--append", KERNEL_OPTIONS, f"--qemu-opts={CACHED_SHARE}",
                "--exec", shlex.join([sys.executable, str(AGENT), str(self.folder)])]
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        self._beating.clear()
        threading.Thread(target=self._heartbeat, args=(self.folder,), daemon=True).start()
        started = time.monotonic()
        with open(self.folder / "console.log", "w") as console:
            self._vm = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console,
                                        stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        try:
            ready = self._wait_ready(started + self.boot_timeout)
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - started
        self.device, self.address = ready["device"], ready["address"]
        self.netdev, self.setup_seconds = ready["netdev"], ready["seconds"]
        return self

    def _heartbeat(self, folder: Path) -> None:
        """Rewrite folder/heartbeat every few seconds until stop(): should this process die
        without stopping the lab, the agent sees the beats stop and powers the VM off."""
        for beat in itertools.count():
            tmp = folder / ".heartbeat.tmp"
            try:
                tmp.write_text(str(beat))
                os.replace(tmp, folder / "heartbeat")
            except OSError:
                return  # the folder is gone: stopped
            if self._beating.wait(HEARTBEAT):
                return

    def _wait_ready(self, deadline: float) -> dict:
        ready, failed = self.folder / "ready.json", self.folder / "failed.json"
        while not ready.exists():
            if failed.exists():
                error = json.loads(failed.read_text())["error"]
                raise LabError(f"the lab's VM booted but Soft-RoCE did not come up: {error}")
            if self._vm.poll() is not None:
                raise LabError(f"the lab's VM exited ({self._vm.returncode}) before rxe0 was "
                               f"up; its console ends with:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise LabError(f"the lab's VM did not have rxe0 up within {self.boot_timeout} s;"
                               f" its console ends with:\n{self.console_tail()}")
            time.sleep(0.1)
        return json.loads(ready.read_text())

    def console_tail(self, lines: int = 20) -> str:
        try:
            text = (self.folder / "console.log").read_text(errors="replace")
        except (OSError, TypeError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def run(self, argv: list[str], timeout: float, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        """Run argv in the VM as root and wait for it; text stdout and stderr come back.

        env is added to the guest's environment, where PATH starts with this venv's bin/ and
        RDMALAB_DEVICE, RDMALAB_ADDRESS are the device and its address;
        cwd defaults to this checkout. Past timeout seconds the command's whole process group
        is killed and TimeoutError raised. Several threads may run commands at once."""
        if self._vm is None or self._vm.poll() is not None:
            raise LabError("the lab is not running (start it, or see its console: "
                           f"{self.console_tail(5)!r})")
        with self._lock:
            ident = f"{next(self._ids)}"
        request = {"argv": [str(a) for a in argv], "timeout": timeout,
                   "env": {str(k): str(v) for k, v in (env or {}).items()},
                   "cwd": str(cwd) if cwd is not None else None}
        tmp = self.folder / f".cmd-{ident}.tmp"
        tmp.write_text(json.dumps(request))
        os.replace(tmp, self.folder / f"cmd-{ident}.json")
        result = self._wait_result(ident, argv, timeout)
        if result["error"]:
            raise OSError(f"cannot run {argv[0]!r} in the lab: {result['error']}")
        if result["timed_out"]:
            raise TimeoutError(f"{shlex.join(map(str, argv))} ran past its {timeout} s in the "
                               f"lab and was killed; its output:\n{result['stdout']}"
                               f"{result['stderr']}")
        return subprocess.CompletedProcess(argv, result["returncode"], result["stdout"],
                                           result["stderr"])

    def _wait_result(self, ident: str, argv: list, timeout: float) -> dict:
        path = self.folder / f"res-{ident}.json"
        # the agent kills the command at timeout; past that plus a margin for an emulated
        # guest under load, the agent itself is stuck
        deadline = time.monotonic() + timeout + 30
        while not path.exists():
            if self._vm.poll() is not None:
                raise LabError(f"the lab's VM exited ({self._vm.returncode}) while running "
                               f"{argv[0]}; its console ends with:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the lab's agent did not answer for {argv[0]} within "
                                   f"{timeout + 30:.0f} s: the VM is stuck?")
            time.sleep(POLL)
        result = json.loads(path.read_text())
        path.unlink()
        return result

    def stop(self) -> None:
        """Ask the agent to finish (the VM then powers off), kill what is left, remove the
        folder. Safe to call twice."""
        if self._vm is not None:
            if self._vm.poll() is None and self.folder is not None:
                (self.folder / "stop").touch()
                try:
                    self._vm.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self._vm.pid, sig)  # vng, virtme-run, qemu: one group
                except ProcessLookupError:
                    break
                try:
                    self._vm.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    continue
            self._vm = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        self._beating.set()
        atexit.unregister(self.stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.rdmalab",
        description="Boot the RDMA lab (a VM with Soft-RoCE rxe0), run one command in it, print "
                    "its output and exit with its status.")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds the command may run (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command and its arguments, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run in the lab, e.g. -- ibv_devices")
    reason = why_not_available()
    if reason:
        print(f"rdmalab: cannot run here: {reason}", file=sys.stderr)
        return 2
    try:
        with Lab() as lab:
            print(f"rdmalab: {lab.device} on {lab.netdev} ({lab.address}) ready in "
                  f"{lab.boot_seconds:.1f} s (Soft-RoCE set-up {lab.setup_seconds:.1f} s)",
                  file=sys.stderr, flush=True)
            p = lab.run(command, timeout=args.timeout)
    except TimeoutError as e:
        print(f"rdmalab: {e}", file=sys.stderr)
        return 124
    except (LabError, OSError) as e:
        print(f"rdmalab: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
