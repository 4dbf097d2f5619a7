"""Greedy decoding that goes on over the survivors when ranks fail (under tbrun --keep-going).

A Survivor holds a tensor-parallel model and its communicator. Where a call on the
communicator raises one of `failures` (tbcoll.RankFailedError, tbcoll.CommRevokedError: tp
imports no other part of tbcoll, so the caller names them), every survivor:
1. revokes the communicator (any survivor still waiting in a call is released at once) and
   shrinks it to the survivors, renumbered in order (the old one closed);
2. drops its part of the model, then loads its part of the new split (tbcoll.tp.plan over
   the survivors: uneven where the counts do not divide);
3. agrees on the tokens made so far: a rank may have chosen one more token than another
   before the failure reached it (or finished the answer and gone on to the next one's
   barrier), and the longest list is the uninterrupted run's;
4. prefills the prompt and those tokens in one forward pass (the KV cache rebuilt), and goes on.
A failure during a recovery starts another. The tokens equal the uninterrupted run's wherever
the greedy margins are wider than float32's rounding (the new split sums in another order).
Without a failure this costs one barrier before each answer and one at close: there a rank
that finished waits for any survivor still in the answer's last call, or recovers with it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Recovery:
    """One recovery: the world ranks lost, the token being made when it came (1 = the first
    of the answer, with its prompt; 0: before the answer), the ranks before and after, and its
    parts' seconds."""

    failed: tuple[int, ...]
    token: int
    ranks_before: int
    ranks_after: int
    shrink_s: float
    load_s: float
    prefill_s: float

    @property
    def seconds(self) -> float:
        return self.shrink_s + self.load_s + self.prefill_s

    def line(self) -> str:
        """What rank 0 prints of it, one line."""
        lost = ", ".join(map(str, self.failed)) or "none named"
        when = f"at token {self.token}" if self.token else "before the answer"
        return (f"rank{'s' * (len(self.failed) > 1)} {lost} failed {when}: "
                f"went on over {self.ranks_after} of {self.ranks_before} ranks, recovered in "
                f"{self.seconds:.2f} s (shrink {self.shrink_s:.2f} s, load {self.load_s:.2f} "
                f"s, prefill {self.prefill_s:.2f} s)")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": list(self.failed), "seconds": self.seconds,
                "line": self.line()}


class Survivor:
    """A model (TensorParallelLlama's stream and forward) and its communicator, going on over
    the survivors when ranks fail. load(comm) builds this rank's part for comm (it is called
    again after each shrink). rank, size and backend are the current communicator's."""

    def __init__(self, comm: Any, model: Any, load: Callable[[Any], Any],
                 failures: tuple[type[BaseException], ...]) -> None:
        self.communicator, self.model, self.load, self.failures = comm, model, load, failures
        self.members = tuple(range(comm.size))  # the world ranks of the communicator's ranks
        self.world_rank = comm.rank
        self.answered: list[list[int]] = []  # the tokens of each answer finished
        self.recoveries: list[Recovery] = []

    rank = property(lambda self: self.communicator.rank)
    size = property(lambda self: self.communicator.size)
    backend = property(lambda self: self.communicator.backend)
    comm = property(lambda self: self.model.comm, doc="the model's communicator (wrapper)")

    def barrier(self) -> None:
        """The barrier before an answer (and at close). Where ranks fail in it, the survivors
        recover, and meet in it again where one of them was still finishing the last answer."""
        while self._failed(self.communicator.barrier):
            if not self._recover(None):
                return

    def close(self) -> None:
        """Close the survivors' communicator, once every survivor has finished."""
        self.barrier()
        self.communicator.close()

    def stream(self, prompt: list[int], max_tokens: int, stop: frozenset[int] = frozenset()
               ) -> Iterator[tuple[int, Any]]:
        """TensorParallelLlama.stream's tokens, going on over the survivors. A token that
        another survivor chose before the failure reached this rank comes with logits None."""
        answer = _Answer(list(prompt), [], max_tokens, stop)
        made, yielded = answer.made, 0
        logits = self._step(answer, prefill=True)
        while True:
            if logits is not None:  # the logits after made: choose the next token
                made.append(int(np.argmax(np.asarray(logits))))
            for token in made[yielded:]:
                last = yielded == len(made) - 1 and logits is not None
                yield token, np.asarray(logits) if last else None
                yielded += 1
            if answer.finished:
                break
            logits = self._step(answer, prefill=False)
        self.answered.append(made)

    def _prefill(self, tokens: list[int]) -> Any:
        self.model.reset()
        return self.model.forward(np.asarray(tokens))

    def _failed(self, call: Callable[[], Any]) -> bool:
        """Whether call raised one of the failures. The error is dropped here, before any
        recovery: its traceback holds the frames, and so the layers, of the old part."""
        try:
            call()
        except self.failures:
            return True
        return False

    def _step(self, answer: _Answer, prefill: bool) -> Any:
        """The logits after the prompt (prefill) or the last token made; where ranks fail,
        those after the survivors' recovery (None where the answer is finished)."""
        found: list[Any] = []

        def forward() -> None:
            if prefill:
                found.append(self._prefill(answer.prompt))
            else:
                found.append(self.model.forward(np.asarray(answer.made[-1:])))

        if not self._failed(forward):
            return found[0]
        return self._recover(answer)

    def _recover(self, answer: _Answer | None) -> Any:
        """Revoke, shrink, load, then _agree (answer: in it; None: in the barrier before the
        next): its result. Another failure on the way starts again from the shrink."""
        token, before = len(answer.made) + 1 if answer else 0, self.members
        found: list[Any] = []
        seconds = np.zeros(3)  # shrink, load, prefill: of every attempt
        while not found:
            started = time.perf_counter()
            self._shrink()
            shrunk = time.perf_counter()
            self.model = None  # this rank's old part goes before its new part comes: the
            gc.collect()  # failed call's frames hold it, in cycles with their tracebacks
            self.model = self.load(self.communicator)
            loaded = time.perf_counter()
            self._failed(lambda: found.append(self._agree(answer)))
            seconds += (shrunk - started, loaded - shrunk, time.perf_counter() - loaded)
        failed = tuple(sorted(set(before) - set(self.members)))
        self.recoveries.append(Recovery(failed, token, len(before), len(self.members),
                                        *map(float, seconds)))
        return found[0]

    def _shrink(self) -> None:
        """The survivors' communicator in place of this one (revoked first, then closed). A
        shrink that more failures interrupt is asked again: each one leaves fewer ranks."""
        old = self.communicator
        self._failed(old.revoke)  # already revoked (by a peer) is as good
        shrunk: list[Any] = []
        while self._failed(lambda: shrunk.append(old.shrink())):
            pass
        self.communicator = shrunk[0]
        old.close()

    def _agree(self, answer: _Answer | None) -> Any:
        """Where every survivor is: in answer number n with k tokens made, or in the barrier
        after answer n (k: all its tokens). The longest list of the latest answer goes to
        the survivors still in it. In an answer: the logits after the prompt and its tokens
        (prefilled), or None where it is finished. In the barrier: whether to meet in it
        again (a survivor was still in the answer this rank finished)."""
        comm = self.communicator
        number = len(self.answered) + (answer is not None)
        tokens = answer.made if answer else (self.answered[-1] if self.answered else [])
        mine = np.array([self.world_rank, number, len(tokens), answer is None], np.int64)
        table = np.asarray(comm.all_gather(mine)).reshape(comm.size, 4)
        self.members = tuple(int(r) for r in table[:, 0])
        root = max(range(comm.size), key=lambda r: (table[r, 1], table[r, 2]))
        latest, longest = int(table[root, 1]), int(table[root, 2])
        if ((table[:, 1] == latest) & (table[:, 2] < longest)).any():  # a survivor behind
            padded = np.zeros(longest, np.int64)
            if number == latest:
                padded[:len(tokens)] = tokens
            learned = np.asarray(comm.broadcast(padded, root=root)).tolist()
            if answer is not None and number == latest:
                answer.made[:] = learned
        if answer is None:
            in_it = (table[:, 1] == number) & (table[:, 3] == 0)
            return bool(in_it.any())
        if answer.finished:
            return None
        return self._prefill(answer.prompt + answer.made)


@dataclass
class _Answer:
    """An answer in progress: its prompt, the tokens made so far (every survivor's the same
    after a recovery), the most it may have and the tokens that end it."""

    prompt: list[int]
    made: list[int]
    max_tokens: int
    stop: frozenset[int]

    @property
    def finished(self) -> bool:
        return bool(self.made) and (self.made[-1] in self.stop
                                    or len(self.made) == self.max_tokens)
