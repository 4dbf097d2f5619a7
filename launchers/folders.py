"""Where tbrun writes what the user asked for (--dump-dir, --output-dir, --trace): checked
before any rank starts, and written without following a link that another user planted.

A folder the user names is refused where another user could plant links in it: one owned by
another user (root's is fine), or writable by group or others without the sticky bit (as
/tmp has, which keeps others from renaming what tbrun made there). Inside it tbrun makes only
new names (mkdir, or O_CREAT|O_EXCL), never following a link (O_NOFOLLOW), and its own files
and folders are private (0600, 0700). Only os: tbrun starts without tempfile (~4 ms).
"""

from __future__ import annotations

import os
import stat

from tbcoll.core.errors import LaunchError

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def safe_folder(path: str, flag: str) -> str:
    """path, made (0700, with its parents) if missing, once it is a folder that tbrun can
    write to and that no other user can plant links in; else a LaunchError naming flag."""
    try:
        os.makedirs(path, mode=PRIVATE_FOLDER, exist_ok=True)
        info = os.stat(path)
    except OSError as e:
        raise LaunchError(f"{flag} {path}: cannot make it ({e.strerror}); give a folder you "
                          "can write to") from None
    if not stat.S_ISDIR(info.st_mode):
        raise LaunchError(f"{flag} {path}: not a folder")
    if info.st_uid not in (os.geteuid(), 0):
        raise LaunchError(f"{flag} {path}: owned by another user (uid {info.st_uid}), who "
                          "could plant links in it; give a folder of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise LaunchError(f"{flag} {path}: writable by others (mode "
                          f"{stat.S_IMODE(info.st_mode):o}), who could plant links in it; "
                          "give a folder only you can write to")
    return path


def new_folder(parent: str, prefix: str) -> str:
    """A folder of a new name (prefix, then random letters) made in parent, 0700."""
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, PRIVATE_FOLDER)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no new name for a folder in {parent}")


def write_new(path: str, data: bytes, mode: int = PRIVATE_FILE) -> None:
    """Write data to a file of a new name, never through a link."""
    fd = os.open(path, _NEW, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def open_own_file(path: str) -> int:
    """path opened for writing from its start, made if missing; a link, a file that is not
    a regular one of this user's, or one with another name (a hard link) is refused."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        if info.st_uid != os.geteuid() or info.st_nlink != 1:
            raise OSError(0, "a file of another user's, or with another name (a hard link)")
        os.ftruncate(fd, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def check_trace_path(path: str) -> None:
    """--trace FILE can be written at the end (beside it, then renamed over it): a new or
    regular file in a folder where tbrun can make files. LaunchError if not."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise LaunchError(f"--trace {path}: not a regular file; give a file's path")
    except FileNotFoundError:
        pass
    except OSError as e:
        raise LaunchError(f"--trace {path}: cannot write there ({e.strerror})") from None
    probe = beside(path, "probe")
    try:
        write_new(probe, b"")
        os.unlink(probe)
    except OSError as e:
        raise LaunchError(f"--trace {path}: cannot write there ({e.strerror}); give a file in "
                          "a folder you can write to") from None


def beside(path: str, what: str) -> str:
    """A new hidden name in path's folder (for a file renamed over path once written)."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.tbrun-{what}-{os.getpid()}-{os.urandom(4).hex()}")
