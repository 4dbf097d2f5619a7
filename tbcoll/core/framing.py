"""The stream engine's wire: what a message's bytes are, as C describes them too.

A message is a 32-byte header (context u32, tag u32, nbytes u64, seq u64, call u64) and its
payload; a pulled message's announcement carries a descriptor instead (address, nbytes, pull
id). tbcoll/include/wire.h holds the same layout, and tbcoll.core.wire_check compares the two as
each C extension is imported: this module is the one Python side of that contract.
"""

from __future__ import annotations

import struct

import numpy as np

# The wire, as C describes it too (tbcoll/include/wire.h; tbcoll.core.wire_check compares the two
# as each C extension is imported): the header's and the descriptor's fields, big-endian
HEADER_FIELDS = (("context", "I"), ("tag", "I"), ("nbytes", "Q"), ("seq", "Q"), ("call", "Q"))
DESCRIPTOR_FIELDS = (("address", "Q"), ("nbytes", "Q"), ("pull", "Q"))  # a pulled message's
HEADER = struct.Struct("!" + "".join(code for _, code in HEADER_FIELDS))
DESCRIPTOR = struct.Struct("!" + "".join(code for _, code in DESCRIPTOR_FIELDS))
# Contexts with the top bit set carry the engine's own messages (communicators count from 0):
ANNOUNCE = 1 << 31  # | the message's context; payload: its DESCRIPTOR
PULLED = ANNOUNCE | 1 << 30  # tag: the pull id; seq: 0 pulled, 1 refused (send it)
RESENT = PULLED + 1  # tag: the pull id; payload: the message whose pull was refused
REVOKED = PULLED + 2  # tag: a communicator's first context; payload: the notice (UTF-8)
CONTEXTS = {"announce": ANNOUNCE, "pulled": PULLED, "resent": RESENT, "revoked": REVOKED}
NOTICE_BYTES = 1024  # a notice longer than this is cut
PULL_IDS = 0xFFFFFFFF  # pull ids count modulo 2**32 (an answer's tag holds one)


def bytes_of(buf: np.ndarray) -> memoryview:
    """buf's bytes as a flat memoryview (works for dtypes with no buffer format, e.g. bfloat16)."""
    # flat first: a 2-D view counts rows, not bytes, and a 0-d array has no view of bytes
    return memoryview(buf.reshape(-1).view(np.uint8))
