"""Each protocol is written once, in one language: what Python and C share is one function or
one description that both read, so that the two sides cannot drift (issue 47, item 4)."""

import pytest

from tbcoll.transports.shm.flags import atomics

needs_c = pytest.mark.skipif(atomics is None, reason="tbcoll.transports.shm._atomics was not built")


def _covered(steps: list[tuple[int, int]], nbytes: int) -> bool:
    """Whether the (start, length) ranges cover [0, nbytes) once each."""
    at = 0
    for start, length in sorted(steps):
        if start != at or length < 0:
            return False
        at += length
    return at == nbytes


@needs_c
@pytest.mark.parametrize("size", [2, 3, 5, 7])
@pytest.mark.parametrize(("count", "item"), [(1, 4), (13, 4), (1001, 2), (4099, 8), (0, 4)])
def test_copy_plan_on_uneven_sizes(size, count, item):
    """The one-copy schedule (one_copy.c's copy_plan, which the kernel's copies and the mapped
    ones both follow): every byte once, parts on whole elements, the ranks agreeing on which
    rank owns which all_reduce part."""
    nbytes = count * item
    owned = {}
    for rank in range(size):
        plan = atomics.copy_plan(atomics.ALL_REDUCE, rank, size, -1, nbytes, item, False)
        assert [step[0] for step in plan] == [(rank + i) % size for i in range(1, size + 1)]
        assert _covered([(mine, length) for _, _, _, mine, length, _ in plan], nbytes)
        for peer, buffer, theirs, mine, length, write in plan:
            assert theirs == mine and mine % item == 0 and length % item == 0 and not write
            assert owned.setdefault(peer, (mine, length)) == (mine, length)
            assert buffer == 1  # the other parts come from their owners' results
        gather = atomics.copy_plan(atomics.ALL_GATHER, rank, size, -1, nbytes, 1, False)
        assert _covered([(mine, length) for _, _, _, mine, length, _ in gather],
                        size * nbytes)
        for root in range(size):
            cast = atomics.copy_plan(atomics.BROADCAST, rank, size, root, nbytes, 1, False)
            if rank == root:
                assert sorted(step[0] for step in cast) == [k for k in range(size) if k != root]
                continue
            written = [(theirs, length) for peer, _, theirs, _, length, write in
                       atomics.copy_plan(atomics.BROADCAST, root, size, root, nbytes, 1, False)
                       if peer == rank and write]
            read = [(mine, length) for peer, _, _, mine, length, write in cast
                    if peer == root and not write]
            assert _covered(written + read, nbytes)
    with pytest.raises(ValueError, match="whole elements"):
        atomics.copy_plan(atomics.ALL_REDUCE, 0, 2, -1, 10, 4, False)


@needs_c
def test_the_pull_steps_are_cs_and_take_the_engines_pull_ids():
    """The pull's steps (tbcoll/shm/moves.c) are what the engine's Python sends too: the
    announcement takes the peer's next pull id from the engine's words (modulo 2**32), as the
    lane's own moves do, and packs what framing reads back; the answer says pulled or
    refused; the copy refuses a view of another size than announced."""
    import os

    import numpy as np

    from tbcoll.core.framing import ANNOUNCE, DESCRIPTOR, HEADER, PULLED
    from tbcoll.transports.stream.words import NEXT_PULL_WORD, PEER_WORDS, WORDS_PER_PEER

    words = np.zeros(PEER_WORDS + 3 * WORDS_PER_PEER, np.uint64)
    at = PEER_WORDS + 2 * WORDS_PER_PEER + NEXT_PULL_WORD
    words[at] = 0xFFFFFFFF
    payload = np.arange(10, dtype=np.float32)
    pulls = []
    for _ in range(2):
        message, pull = atomics.pull_announcement(words, 2, payload, 7, 9, 3, 5)
        header, descriptor = message[:HEADER.size], message[HEADER.size:]
        assert HEADER.unpack(header) == (7 | ANNOUNCE, 9, DESCRIPTOR.size, 3, 5)
        assert DESCRIPTOR.unpack(descriptor) == (atomics.address(payload), 40, pull)
        pulls.append(pull)
    assert pulls == [0xFFFFFFFF, 0] and words[at] == 1
    assert HEADER.unpack(atomics.pull_answer(pulls[0], True)) == (PULLED, pulls[0], 0, 1, 0)
    assert HEADER.unpack(atomics.pull_answer(5, False)) == (PULLED, 5, 0, 0, 0)
    into = np.empty(10, np.float32)
    if atomics.HAVE_CMA:
        assert atomics.pull_payload(os.getpid(), descriptor, into) == 0
        assert np.array_equal(into, payload)
    assert atomics.pull_payload(os.getpid(), descriptor, into[:5]) != 0
    with pytest.raises(ValueError, match="the engine's words"):
        atomics.pull_announcement(words, 3, payload, 7, 9, 3, 5)


# Import the stream engine's framing with wire.h's tag widened to 8 bytes (a copy of the
# package whose header is edited, as a change of the wire would be): Python follows it.
WIDER_TAG = r"""
import pathlib, shutil, sys, tempfile
import tbcoll
copy = pathlib.Path(tempfile.mkdtemp()) / "tbcoll"
shutil.copytree(pathlib.Path(tbcoll.__file__).parent / "include", copy / "include")
header = copy / "include" / "wire.h"
text = header.read_text()
for old, new in [('X(HEADER_TAG, "tag", 4, 4)', 'X(HEADER_TAG, "tag", 4, 8)'),
                 ('"nbytes", 8, 8) X(HEADER_SEQ, "seq", 16, 8) X(HEADER_CALL, "call", 24, 8)',
                  '"nbytes", 12, 8) X(HEADER_SEQ, "seq", 20, 8) X(HEADER_CALL, "call", 28, 8)'),
                 ("0x40000000u", "0x20000000u")]:
    assert old in text, old
    text = text.replace(old, new)
header.write_text(text)
import tbcoll.core.wire_check as wire_check
assert "tbcoll.core.framing" not in sys.modules
wire_check.INCLUDE = copy / "include"  # where wire_check finds wire.h
wire_check.read_wire.cache_clear()
from tbcoll.core import framing
print(framing.HEADER.format, framing.HEADER.size, hex(framing.PULLED), hex(framing.RESENT))
"""


def test_the_framing_is_read_from_wire_h():
    """Python restates no offset, width or context of the stream's framing: it reads
    tbcoll/include/wire.h's X-macro lists, which C compiles (a build of another wire.h is
    refused at import: test_wire.py)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", WIDER_TAG], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["!IQQQQ", "36", "0xa0000000", "0xa0000001"]


# What a build without a compiler runs (TBCOLL_NO_C=1), or one whose call gate alone failed to
# build (argv[1] "partial"): each protocol's whole Python path, never C's and Python's mixed.
PURE = """
import sys
if sys.argv[1] == "partial":
    sys.modules["tbcoll.core._gate"] = None  # as a build whose _gate.c did not compile
import numpy as np
import tbcoll
from tbcoll.core import gate
from tbcoll.transports.shm.flags import atomics
from tbcoll.transports.tcp import transport as tcp

comm = tbcoll.init()
r, n = comm.rank, comm.size
c_parts = (gate.C_GATE, atomics is not None, tcp._sockets is not None,
           comm._routes.lane is not None)
for count in (1, 1000, 300_001):  # (past tcp's whole-message exchange and shm's pull size)
    def part(k):
        return np.arange(count, dtype=np.float32) + 1000 * k
    assert np.array_equal(comm.all_reduce(part(r)), sum(part(k) for k in range(n))), count
    assert np.array_equal(comm.all_gather(part(r)), np.concatenate([part(k) for k in range(n)]))
    request = comm.isend(part(r), (r + 1) % n, tag=3)
    assert np.array_equal(comm.recv(np.empty(count, np.float32), (r - 1) % n, tag=3),
                          part((r - 1) % n))
    request.wait()
print(comm.backend, *c_parts, flush=True)
"""


@pytest.mark.parametrize(("backend", "how", "expect"), [
    ("tcp", "no_c", "tcp False False False False"),
    ("auto", "no_c", "tcp False False False False"),  # one host, but shm needs C: tcp
    ("auto", "partial", "tcp False True True False"),  # no C gate: no lane bound
])
def test_the_pure_python_paths_run_whole(script, backend, how, expect):
    import os
    import sys

    from ..conftest import tagged_lines, tbrun

    env = {**os.environ, "TBCOLL_NO_C": "1" if how == "no_c" else "0"}
    p = tbrun("-np", 3, "--backend", backend, "--comm-timeout", 30, sys.executable,
              script(PURE), how, env=env, timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    assert tagged_lines(p.stdout) == {rank: [expect] for rank in range(3)}, p.stdout
