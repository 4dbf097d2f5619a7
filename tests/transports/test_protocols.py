"""Each protocol is written once, in one language: what Python and C share is one function or
one description that both read, so that the two sides cannot drift (issue 47, item 4)."""

import pytest

from tbcoll.shm.flags import atomics

needs_c = pytest.mark.skipif(atomics is None, reason="tbcoll.shm._atomics was not built")


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
