"""tbcoll.tp.survive's Survivor in one process, its communicators and model stood in for: what
no real job shows on demand, a survivor that had chosen fewer tokens than another when the
failure reached it. It learns the longest list (the uninterrupted run's), yields each token
once, prefills only where the answer is not finished, and every survivor ends on an agree.
(A real death: test_llm.py's test_the_answer_goes_on_over_the_survivors.)"""

import numpy as np
import pytest

from tbcoll.tp.survive import Survivor

PROMPT = [1, 1]
ANSWER = [5, 3, 7, 2, 9]  # the uninterrupted answer; 9 ends it


class Failed(Exception):
    pass


class Comm:
    """A communicator of world rank 0 among 3, whose shrink gives one of 2 where the other
    survivor (world rank 1) had made `theirs` tokens of ANSWER."""

    def __init__(self, size=3, theirs=0, fail_at=None):
        self.rank, self.size, self.theirs, self.fail_at = 0, size, theirs, fail_at
        self.calls = []

    def revoke(self):
        self.calls.append("revoke")

    def close(self):
        self.calls.append("close")

    def shrink(self):
        self.calls.append("shrink")
        return Comm(2, self.theirs)

    def agree(self, flag):
        self.calls.append("agree")
        return flag

    def all_gather(self, mine):
        return np.concatenate([mine, [1, self.theirs]])

    def broadcast(self, tokens, root):
        assert root == 1
        tokens[:self.theirs] = ANSWER[:self.theirs]
        return tokens


class Model:
    """Logits that choose ANSWER; fails where the tokens fed reach comm.fail_at."""

    def __init__(self, comm):
        self.comm, self.fed, self.forwards = comm, [], 0

    def reset(self):
        self.fed = []

    def forward(self, tokens):
        if self.comm.fail_at == len(self.fed) + len(tokens):
            raise Failed("a peer failed")
        self.forwards += 1
        self.fed += list(tokens)
        logits = np.zeros(10)
        logits[ANSWER[len(self.fed) - len(PROMPT)]] = 1
        return logits


@pytest.mark.parametrize("theirs", [3, 5])
def test_a_survivor_behind_learns_the_tokens_made(theirs):
    """Rank 0 fails choosing the third token (two made); the other survivor had made 3 (then
    rank 0 prefills the prompt and those 3, and goes on) or all 5 (nothing left to compute)."""
    world = Comm(theirs=theirs, fail_at=len(PROMPT) + 2)
    survivor = Survivor(world, Model(world), Model, (Failed,))
    steps = list(survivor.stream(PROMPT, 8, frozenset({9})))
    assert [token for token, _ in steps] == ANSWER
    learned = [token for token, logits in steps if logits is None]
    assert learned == ANSWER[2:theirs]
    assert world.calls == ["revoke", "shrink", "close"]
    assert survivor.size == 2 and survivor.communicator.calls == ["agree"]
    prefilled = 0 if theirs == len(ANSWER) else 1 + len(ANSWER) - theirs - 1
    assert survivor.model.forwards == prefilled  # (the prefill, then a token at a time)
    [recovery] = survivor.recoveries
    assert (recovery.failed, recovery.token, recovery.ranks_before, recovery.ranks_after) == (
        (2,), 3, 3, 2)
    assert recovery.line().startswith("rank 2 failed at token 3: went on over 2 of 3 ranks, ")
