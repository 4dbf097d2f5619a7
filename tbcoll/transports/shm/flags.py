"""64-bit flags in shared memory with acquire/release order, through the C extension
tbcoll.transports.shm._atomics (GCC/Clang __atomic builtins).

A rank stores a flag (release) after writing the data it guards; a reader that sees the flag
(acquire) then sees the data. Plain Python or numpy stores give no such order on ARM64 (Apple
Silicon), whose weak memory model lets other cores see stores out of program order; on
x86-64 the same builtins compile to plain moves. Without a compiler at install the module is
missing (atomics is None) and the shm backend says so (tbcoll.transports.shm.native.available).
"""

from __future__ import annotations

from tbcoll.core.callbacks import check_callbacks
from tbcoll.core.extensions import c_extension
from tbcoll.core.names import LANE_KINDS
from tbcoll.core.wire_check import check_constants, check_wire

# None: built without a compiler (or TBCOLL_NO_C=1)
atomics = c_extension("tbcoll.transports.shm._atomics")
if atomics is not None:
    check_wire(atomics)
    check_callbacks(atomics, ("shm",))
    check_constants(atomics, {"LANE_KINDS": LANE_KINDS}, "tbcoll.core.names")


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
