"""macOS's rules, applied to a Linux Python as far as Linux allows (the macOS lane).

What a Mac's CPython has not, and what a Mac's kernel does not do, is taken away here before
tbcoll is imported, so that the code paths only a Mac would take run in CI:

- NAMES: the names CPython builds on Linux but not on macOS, removed from their modules. The
  list is read from CPython 3.11's library reference ("Availability: Linux" or "Unix, not
  macOS" beside each name) and from the #ifdef guards beside them in Modules/posixmodule.c,
  selectmodule.c, signalmodule.c and socketmodule.c (os.waitid is built only
  `#if defined(HAVE_WAITID) && !defined(__APPLE__)`). Only names a Mac lacks are here; a
  name that exists on both (os.sched_yield, select.poll) stays.
- ADDED: socket.TCP_KEEPALIVE, macOS's name for the idle time before keepalive probes, given
  the value of Linux's TCP_KEEPIDLE (the same option), so that the Mac's branch runs and works.
- SWITCHES: the code's own Linux-only switches, turned off as each module is imported:
  PR_SET_PDEATHSIG (tbcoll.launch.parentdeath.PDEATHSIG) and the child subreaper with its
  /proc walks (tbcoll.launch.reaper.LINUX). process_vm_readv goes off through the
  environment (TBCOLL_SHM_CMA=0, set by the lane's plugin).
- HIDDEN: in tbrun and the ranks (not in pytest, which watches them), /proc and /dev/shm do
  not exist: opening or listing anything under them fails with ENOENT, as on a Mac.
- SELECTOR: selectors.DefaultSelector behaves as macOS's kqueue does where it differs from
  epoll: it accepts a regular file and reports it readable only while its offset is before
  its end (never its end of file), and it refuses a device that is not a terminal.
- The soft limit of open files at macOS's default, 256 (set by the plugin, inherited).

What cannot be had on Linux: kqueue itself, Mach, macOS's shared-memory and socket-buffer
limits, its scheduler, Local Network privacy and the firewall, TCP_CONNECTION_INFO.
"""

from __future__ import annotations

import errno
import importlib.abc
import os
import selectors
import socket
import stat
import sys

NAMES = {
    "os": [
        "waitid", "P_PID", "P_PGID", "P_ALL", "P_PIDFD", "pidfd_open", "PIDFD_NONBLOCK",
        "sched_getaffinity", "sched_setaffinity", "sched_getscheduler", "sched_setscheduler",
        "sched_getparam", "sched_setparam", "sched_rr_get_interval", "sched_param",
        "memfd_create", "posix_fallocate", "posix_fadvise", "pipe2", "eventfd",
        "eventfd_read", "eventfd_write", "splice", "copy_file_range", "getrandom",
        "getxattr", "setxattr", "listxattr", "removexattr", "getresuid", "getresgid",
        "setresuid", "setresgid", "O_DIRECT", "O_PATH", "O_TMPFILE", "O_NOATIME",
        "O_LARGEFILE", "O_RSYNC",
    ],
    "select": ["epoll", "EPOLLIN", "EPOLLOUT", "EPOLLERR", "EPOLLHUP", "EPOLLET",
               "EPOLLONESHOT", "EPOLLEXCLUSIVE", "EPOLLRDHUP", "EPOLL_CLOEXEC"],
    "signal": ["pidfd_send_signal", "sigtimedwait", "sigwaitinfo", "SIGRTMIN", "SIGRTMAX",
               "SIGPWR", "SIGSTKFLT", "SIGPOLL", "SIGCLD"],
    "socket": ["TCP_INFO", "SO_PEERCRED", "TCP_KEEPIDLE", "TCP_USER_TIMEOUT", "TCP_CORK",
               "TCP_QUICKACK", "TCP_SYNCNT", "TCP_LINGER2", "TCP_DEFER_ACCEPT",
               "TCP_WINDOW_CLAMP", "TCP_CONGESTION", "SO_PASSCRED", "SO_PEERSEC",
               "SO_BINDTODEVICE", "SO_MARK", "SO_PRIORITY", "SO_DOMAIN", "SO_PROTOCOL",
               "SOCK_NONBLOCK", "SOCK_CLOEXEC", "MSG_NOSIGNAL", "MSG_MORE", "MSG_CONFIRM",
               "MSG_CMSG_CLOEXEC", "SCM_CREDENTIALS", "AF_NETLINK", "AF_PACKET", "AF_ALG",
               "AF_VSOCK"],
    "resource": ["prlimit", "RLIMIT_RTPRIO", "RLIMIT_RTTIME", "RLIMIT_SIGPENDING",
                 "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_LOCKS"],
    "fcntl": ["F_SETPIPE_SZ", "F_GETPIPE_SZ", "F_OFD_GETLK", "F_OFD_SETLK", "F_OFD_SETLKW",
              "F_ADD_SEALS", "F_GET_SEALS", "F_NOTIFY"],
    "mmap": ["MAP_POPULATE", "MADV_HUGEPAGE", "MADV_NOHUGEPAGE", "MADV_DONTDUMP",
             "MADV_DODUMP", "MADV_REMOVE", "MADV_DONTFORK", "MADV_DOFORK"],
    "time": ["CLOCK_BOOTTIME", "CLOCK_TAI"],
}

SWITCHES = {
    "tbcoll.launch.parentdeath": {"PDEATHSIG": False},
    "tbcoll.launch.reaper": {"LINUX": False},
}

HIDDEN = ("/proc", "/dev/shm")
_HIDING_EVENTS = {"open", "os.listdir", "os.scandir", "os.chdir"}


def remove_names() -> None:
    """Take away what macOS's CPython does not build (NAMES), and add TCP_KEEPALIVE."""
    import importlib

    for module_name, names in NAMES.items():
        module = importlib.import_module(module_name)
        for name in names:
            if hasattr(module, name):
                delattr(module, name)
    if "posix" in sys.modules:  # os re-exports posix's names: a `from posix import` too
        for name in NAMES["os"]:
            if hasattr(sys.modules["posix"], name):
                delattr(sys.modules["posix"], name)
    socket.TCP_KEEPALIVE = 4  # Linux's TCP_KEEPIDLE: what macOS's TCP_KEEPALIVE means
    if "tempfile" in sys.modules:  # it looked for O_TMPFILE when it was imported
        sys.modules["tempfile"]._O_TMPFILE_WORKS = False


class KqueueLikeSelector(selectors.PollSelector):
    """poll(2), with kqueue's answers where they differ from it on macOS: a regular file is
    accepted and is readable only while its offset is before its end (kqueue's EVFILT_READ
    on a vnode: "data contains the offset from current position to end of file", and it
    never fires at the end: a reader waiting for end of file waits forever); a device other
    than a terminal is refused."""

    def register(self, fileobj, events, data=None):
        fd = self._fileobj_lookup(fileobj)
        mode = os.fstat(fd).st_mode
        if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and not os.isatty(fd):
            raise OSError(errno.EINVAL, "kqueue (macOS) refuses this device")
        if stat.S_ISREG(mode):  # kept out of poll, which calls a file always readable
            self._files = getattr(self, "_files", set()) | {fd}
            return selectors._BaseSelectorImpl.register(self, fileobj, events, data)
        return super().register(fileobj, events, data)

    def unregister(self, fileobj):
        key = self.get_key(fileobj)
        if key.fd in getattr(self, "_files", ()):
            self._files.discard(key.fd)
            return selectors._BaseSelectorImpl.unregister(self, fileobj)
        return super().unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout=None):
        files = [key for key in self.get_map().values() if key.fd in getattr(self, "_files", ())]
        ready = [(key, selectors.EVENT_READ) for key in files
                 if key.events & selectors.EVENT_READ and _before_end(key.fd)]
        return ready + super().select(0 if ready else timeout)


def _before_end(fd: int) -> bool:
    return os.lseek(fd, 0, os.SEEK_CUR) < os.fstat(fd).st_size


def use_kqueue_like_selector() -> None:
    selectors.DefaultSelector = KqueueLikeSelector


class _Switches(importlib.abc.MetaPathFinder):
    """Set SWITCHES' values in a module right after it is executed."""

    def find_spec(self, name, path, target=None):
        values = SWITCHES.get(name)
        if values is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module, execute=execute, values=values):
            execute(module)
            for attribute, value in values.items():
                setattr(module, attribute, value)

        spec.loader.exec_module = exec_module
        return spec


def turn_switches_off() -> None:
    for name, values in SWITCHES.items():
        if name in sys.modules:  # imported already: set it there too
            for attribute, value in values.items():
                setattr(sys.modules[name], attribute, value)
    sys.meta_path.insert(0, _Switches())


def _hide(event: str, args: tuple) -> None:
    if event not in _HIDING_EVENTS or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if isinstance(path, str) and any(path == p or path.startswith(p + "/") for p in HIDDEN):
        raise FileNotFoundError(errno.ENOENT, "no such file on macOS (the macOS lane)", path)


def hide_linux_folders() -> None:
    sys.addaudithook(_hide)


def apply(in_rank: bool) -> None:
    """The rules, for pytest's own process (in_rank False) or for tbrun and its ranks."""
    remove_names()
    use_kqueue_like_selector()
    turn_switches_off()
    if in_rank:
        hide_linux_folders()
