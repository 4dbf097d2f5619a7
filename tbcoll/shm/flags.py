"""64-bit flags in shared memory with acquire/release order.

A rank stores a flag (release) after writing the data it guards; a reader that sees the flag
(acquire) then sees the data. Plain Python or numpy stores give no such order on ARM64, so:

- AtomicFlags uses the C extension tbcoll.shm._atomics (GCC/Clang __atomic builtins);
- LockedFlags, for installs without a compiler, takes an fcntl lock on a shared file around
  every flag access. The kernel lock is an acquire on lock and a release on unlock, so the
  writer's earlier data stores are ordered before its unlock, and the reader's later data
  loads after its lock: correct on any CPU, at a few microseconds per access.

TBCOLL_SHM_FLAGS=python forces LockedFlags (tests use it to check that both agree).
"""

from __future__ import annotations

import fcntl
import os
import time

try:
    from tbcoll.shm import _atomics as atomics
except ImportError:  # built without a compiler
    atomics = None

WORD = 8


def atomics_available() -> bool:
    return atomics is not None


class AtomicFlags:
    name = "atomic"

    def __init__(self, buffer: memoryview) -> None:
        self._buffer = buffer

    def load(self, offset: int) -> int:
        return atomics.load_acquire(self._buffer, offset)

    def store(self, offset: int, value: int) -> None:
        atomics.store_release(self._buffer, offset, value)

    def wait_all(self, offset: int, stride: int, count: int, target: int, budget: float) -> bool:
        """True once the count flags at offset + i*stride are all >= target; False if budget
        seconds pass first."""
        return atomics.wait_all(self._buffer, offset, stride, count, target, budget)


class LockedFlags:
    name = "locked"

    def __init__(self, buffer: memoryview, lock_fd: int) -> None:
        self._buffer, self._fd = buffer, lock_fd

    def load(self, offset: int) -> int:
        fcntl.lockf(self._fd, fcntl.LOCK_SH)
        try:
            return int.from_bytes(self._buffer[offset:offset + WORD], "little")
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def store(self, offset: int, value: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            self._buffer[offset:offset + WORD] = value.to_bytes(WORD, "little")
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def wait_all(self, offset: int, stride: int, count: int, target: int, budget: float) -> bool:
        deadline = time.monotonic() + budget
        nap = 0.0
        while True:
            if all(self.load(offset + i * stride) >= target for i in range(count)):
                return True
            if time.monotonic() >= deadline:
                return False
            if nap:
                time.sleep(nap)
            else:
                os.sched_yield()
            nap = min(1e-3, nap * 2 or 1e-5)
