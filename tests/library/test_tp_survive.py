"""tbcoll.tp.survive's Survivor in one process, its communicators and model stood in for: what
no real job shows on demand, a survivor that had chosen fewer tokens than another when the
failure reached it, or had finished the answer and gone on to the barrier after it. The one
behind learns the longest list (the uninterrupted run's), yields each token once and prefills
only an unfinished answer; the one ahead meets it in the barrier again.
(A real death: test_llm.py's test_the_answer_goes_on_over_the_survivors.)"""

import weakref

import numpy as np
import pytest

from tbcoll.tp.survive import Survivor

PROMPT = [1, 1]
ANSWER = [5, 3, 7, 2, 9]  # the uninterrupted answer; 9 ends it


class Failed(Exception):
    pass


class Comm:
    """World rank 0 of 3, whose calls fail once it is told so; its shrink gives a communicator
    of 2 where the other survivor (world rank 1) is at `theirs`: [answer number, tokens made,
    1 in the barrier after that answer or 0 in it]."""

    def __init__(self, theirs, size=3, fail_at=None):
        self.theirs, self.size, self.rank, self.fail_at = theirs, size, 0, fail_at
        self.calls = []

    def __getattr__(self, name):  # revoke, close, barrier
        def call():
            self.calls.append(name)
            if name == "barrier" and self.fail_at == "barrier":
                raise Failed("a peer failed")
        return call

    def shrink(self):
        self.calls.append("shrink")
        return Comm(self.theirs, 2)

    def all_gather(self, mine):
        return np.concatenate([mine, [1, *self.theirs]])

    def broadcast(self, tokens, root):
        self.calls.append(f"broadcast {len(tokens)} from {root}")
        return np.array(ANSWER[:len(tokens)])


class Model:
    """Logits that choose ANSWER; fails where the tokens fed reach comm.fail_at."""

    def __init__(self, comm):
        self.comm, self.fed, self.forwards = comm, [], 0

    def reset(self):
        self.fed = []

    def forward(self, tokens):
        if self.comm.fail_at == len(self.fed) + len(tokens):
            try:
                raise Failed("a peer failed")
            except Failed as e:
                error = e  # this frame, which holds self, and the traceback: a cycle
                raise error from None
        self.forwards += 1
        self.fed += list(tokens)
        logits = np.zeros(10)
        logits[ANSWER[len(self.fed) - len(PROMPT)]] = 1
        return logits


@pytest.mark.parametrize("theirs", [[1, 3, 0], [1, 5, 0], [1, 5, 1]])
def test_a_survivor_behind_learns_the_tokens_made(theirs):
    """Rank 0 fails choosing the third token (two made); the other survivor had made 3 (then
    rank 0 prefills the prompt and those 3, and goes on) or all 5 (nothing left to compute),
    and may be waiting in the barrier after the answer."""
    world = Comm(theirs, fail_at=len(PROMPT) + 2)
    old = Model(world)
    held = weakref.ref(old)

    def load(comm):  # the old part is gone before the new one comes
        assert held() is None
        return Model(comm)

    survivor = Survivor(world, old, load, (Failed,))
    del old
    steps = list(survivor.stream(PROMPT, 8, frozenset({9})))
    assert [token for token, _ in steps] == ANSWER
    assert [token for token, logits in steps if logits is None] == ANSWER[2:theirs[1]]
    assert world.calls == ["revoke", "shrink", "close"] and survivor.size == 2
    assert survivor.communicator.calls == [f"broadcast {theirs[1]} from 1"]
    assert survivor.model.forwards == (0 if theirs[1] == 5 else 2)  # prefill, then token 5
    [recovery] = survivor.recoveries
    assert (recovery.failed, recovery.token, recovery.ranks_before, recovery.ranks_after) == (
        (2,), 3, 3, 2)
    assert recovery.line().startswith("rank 2 failed at token 3: went on over 2 of 3 ranks, ")


@pytest.mark.parametrize("theirs, calls", [
    ([1, 3, 0], ["broadcast 5 from 0", "barrier"]), ([2, 0, 0], []), ([1, 5, 1], [])])
def test_a_survivor_ahead_waits_for_the_one_behind(theirs, calls):
    """Rank 0 finished the answer and fails in the barrier after it: it meets the other
    survivor in the barrier again where that one was still in the answer (3 of its 5 tokens),
    not where it had gone on into the next one (passed the barrier) or was in it too."""
    world = Comm(theirs, fail_at="barrier")
    survivor = Survivor(world, Model(world), Model, (Failed,))
    survivor.answered.append(ANSWER)
    survivor.barrier()
    assert world.calls == ["barrier", "revoke", "shrink", "close"]
    assert survivor.communicator.calls == calls
    assert survivor.recoveries[0].line().startswith("rank 2 failed before the answer: ")
