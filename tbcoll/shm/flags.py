"""64-bit flags in shared memory with acquire/release order, through the C extension
tbcoll.shm._atomics (GCC/Clang __atomic builtins).

A rank stores a flag (release) after writing the data it guards; a reader that sees the flag
(acquire) then sees the data. Plain Python or numpy stores give no such order on ARM64 (Apple
Silicon), whose weak memory model lets other cores see stores out of program order; on
x86-64 the same builtins compile to plain moves. Without a compiler at install the module is
missing (atomics is None) and the shm backend says so (tbcoll.shm.native.available).
"""

from __future__ import annotations

from tbcoll.callbacks import check_callbacks
from tbcoll.wire_check import check_wire

try:
    from tbcoll.shm import _atomics as atomics
except ImportError:  # built without a compiler
    atomics = None
if atomics is not None:
    check_wire(atomics)
    check_callbacks(atomics, ("shm",))


class AtomicFlags:
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
