"""The shm collectives with every round in one C call (tbcoll.shm._atomics.shm_round).

Same segment, flags, rounds and signatures as tbcoll.shm.collectives' ShmNative, whose
Python rounds remain for the portable flags (no compiler, or TBCOLL_SHM_FLAGS=python); here
a round's copies, waits, signature check and reduction run in C, the large copies without
the GIL. A message larger than a slot takes one round per slot-sized chunk. all_reduce past
SINGLE_PASS_BYTES keeps ShmNative's two-phase rounds (bandwidth-bound: numpy's loops are as
fast as C's there).
"""

from __future__ import annotations

import numpy as np

from tbcoll.calls import signature
from tbcoll.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.shm.collectives import (
    _ARRIVE,
    LINE,
    SINGLE_PASS_BYTES,
    SLOT,
    WAIT_SLICE,
    ShmNative,
    prefault,
)
from tbcoll.shm.flags import atomics

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER = range(5)  # _atomics.c's kinds
_BYTES = DTYPE_CODES[np.dtype(np.uint8)]  # what a round that only copies calls its data
_NO_BYTES = np.empty(0, np.uint8)

# The one-call paths' signatures less the byte count, per dtype (and op, or root) code:
# computing one in full on each call cost ~0.7 us of a 3 us 8 B all_reduce.
_ALL_REDUCE = [[signature("all_reduce", dtype, op, 0) for op in OP_CODES]
               for dtype in DTYPE_CODES]
_ALL_GATHER = [signature("all_gather", dtype, None, 0) for dtype in DTYPE_CODES]
_REDUCE_SCATTER = [[signature("reduce_scatter", dtype, op, 0) for op in OP_CODES]
                   for dtype in DTYPE_CODES]
# dtype -> code by the registered dtype objects' ids (they live as long as the process, so
# their ids stay theirs), ~0.15 us faster than hashing a dtype; another object equal to one
# of them is looked up by value (_code).
_CODE_BY_ID = {id(dtype): code for dtype, code in DTYPE_CODES.items()}


def _code(dtype: np.dtype) -> int | None:
    code = _CODE_BY_ID.get(id(dtype))
    return DTYPE_CODES.get(dtype) if code is None else code


def _bytes(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes, as a 1-D uint8 view, to cut into chunks. (The C module
    takes arrays of any dtype as they are: it asks for no buffer format, which bfloat16
    lacks.)"""
    return array.reshape(-1).view(np.uint8)


class AtomicShmNative(ShmNative):
    """ShmNative with C rounds; needs the C module (AtomicFlags)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._flags_at, self._buffer = self.layout.flags, self.segment.buffer
        self._broadcast_calls: dict[tuple[int, int], int] = {}  # signatures less bytes

    # --- one-call paths (Native.direct_*): the Communicator's latency-critical cases -------

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        """all_reduce of a small contiguous array in one C call, into out (checked by the
        caller) or a new array; None when x does not qualify."""
        dtype = _code(x.dtype)
        if dtype is None or x.nbytes > SINGLE_PASS_BYTES:
            return None
        if out is None:
            out = np.empty_like(x)
        code = OP_CODES[op]
        try:  # (the C module refuses a non-contiguous x: cheaper than asking numpy first)
            self._round(ALL_REDUCE, x, 0, out, 0, dtype, code, 0,
                        _ALL_REDUCE[dtype][code] | x.nbytes)
        except BufferError:
            return None  # the general path copies x
        return out

    def direct_all_gather(self, x: np.ndarray, op: None, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        """all_gather likewise; out, if given, holds size blocks like x (checked by caller)."""
        dtype = _code(x.dtype)
        if dtype is None or x.nbytes > SLOT or not x.flags.c_contiguous:
            return None
        if out is None:
            shape = (self.size * x.shape[0], *x.shape[1:]) if x.ndim else (self.size,)
            out = np.empty(shape, x.dtype)
        self._round(ALL_GATHER, x, 0, out, x.nbytes, _BYTES, 0, 0,
                    _ALL_GATHER[dtype] | x.nbytes)
        return out

    def direct_broadcast(self, x: np.ndarray, op: None, root: int,
                         out: np.ndarray | None) -> np.ndarray | None:
        dtype = _code(x.dtype)
        if dtype is None or x.nbytes > SLOT or not x.flags.c_contiguous:
            return None
        out = np.empty_like(x) if out is None else out
        call = self._broadcast_calls.get((dtype, root))
        if call is None:
            call = signature("broadcast", x.dtype, None, 0, root)
            self._broadcast_calls[dtype, root] = call
        self._round(BROADCAST, x, 0, out, 0, _BYTES, 0, root,
                    call | x.nbytes)
        return out

    def direct_reduce_scatter(self, x: np.ndarray, op: str, root: int,
                              out: np.ndarray | None) -> np.ndarray | None:
        dtype = _code(x.dtype)
        if (dtype is None or x.nbytes > SLOT or not x.flags.c_contiguous or not x.ndim
                or x.shape[0] % self.size):
            return None
        if out is None:
            out = np.empty((x.shape[0] // self.size, *x.shape[1:]), x.dtype)
        code = OP_CODES[op]
        self._round(REDUCE_SCATTER, x, out.nbytes, out, 0, dtype, code, 0,
                    _REDUCE_SCATTER[dtype][code] | x.nbytes)
        return out

    # --- the collectives -----------------------------------------------------------------

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        if recv.nbytes > SINGLE_PASS_BYTES:
            super().all_reduce(send, recv, op)
            return
        data = _bytes(recv if send is None else send)
        self._round(ALL_REDUCE, data, 0, _bytes(recv), 0, DTYPE_CODES[recv.dtype],
                    OP_CODES[op], 0, signature("all_reduce", recv.dtype, op, recv.nbytes))

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Rank k's block is slot k; each chunk of the blocks goes in place in recv."""
        prefault(recv)
        src, dst, block = _bytes(send), _bytes(recv), send.nbytes
        call = signature("all_gather", send.dtype, None, send.nbytes)
        for lo in range(0, block, SLOT):
            self._round(ALL_GATHER, src[lo:lo + SLOT], 0, dst[lo:], block, _BYTES, 0, 0,
                        call if lo == 0 else 0)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        """Each round carries a piece of every rank's block: slot k holds rank k's pieces."""
        prefault(recv)
        src, dst, block = _bytes(send), _bytes(recv), recv.nbytes
        step = SLOT // self.size // send.itemsize * send.itemsize
        dtype, code = DTYPE_CODES[send.dtype], OP_CODES[op]
        call = signature("reduce_scatter", send.dtype, op, send.nbytes)
        for lo in range(0, block, step):
            self._round(REDUCE_SCATTER, src[lo:], block, dst[lo:lo + step], 0, dtype, code, 0,
                        call if lo == 0 else 0)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        prefault(buf)
        data = _bytes(buf)
        call = signature("broadcast", buf.dtype, None, buf.nbytes, root)
        for lo in range(0, buf.nbytes, SLOT):
            chunk = data[lo:lo + SLOT]
            self._round(BROADCAST, chunk, 0, chunk, 0, _BYTES, 0, root, call if lo == 0 else 0)

    def barrier(self) -> None:
        self._round(BARRIER, _NO_BYTES, 0, _NO_BYTES, 0, _BYTES, 0, 0,
                    signature("barrier"))

    def _round(self, kind: int, src: np.ndarray, src_stride: int, dst: np.ndarray,
               dst_stride: int, dtype: int, op: int, root: int, call: int) -> None:
        """One round in C; when a peer is slow, wait in Python (which notices dead ranks and
        the deadline) and resume. A buffer the C module refuses (BufferError: not
        contiguous) raises before the round touches the segment, and it stays to come."""
        s, stage = self._seq + 1, 1
        while stage := atomics.shm_round(
                self._buffer, self._flags_at, LINE, self.size, self.rank, s,
                self._set_offsets[s & 1], SLOT, src, src_stride, dst, dst_stride, kind, dtype,
                op, root, stage, WAIT_SLICE, call):
            self._seq = s
            if stage == 3:
                self._agree(s, call, range(self.size))
            self._wait_all(_ARRIVE, s - 1 if stage == 1 else s)
        self._seq = s
