"""tbrun's side of the ranks' dumps (tbcoll.observability.dumps): ask the running ranks through the
store, wait briefly for their answers, write every dump to a folder that outlives the job, and say
where each rank was (tbcoll.launch.whereabouts).

Ranks that failed in a call sent their dump before they exited; the ranks still running answer
from a thread of theirs within milliseconds, whatever their main thread does. Only ranks that
run tbcoll (their listener said so at init) are waited for, so a job of other programs loses
no time; one that does not answer within DUMP_WAIT is named as silent.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence

from tbcoll.launch.diagnose import ranks_phrase
from tbcoll.launch.folders import PRIVATE_FOLDER, new_folder, write_new

from tbcoll.job.rendezvous import StoreServer
from tbcoll.observability.dump_keys import ANSWER_KEY, DUMP_KEY, LISTENING_KEY, REQUEST_KEY

DUMP_WAIT = 3.0  # seconds the ranks get to answer a request for their dumps
_PEEK = 0.05  # seconds between looks at which ranks still run, while waiting for answers
# seconds a nudged rank gets to write its stacks before the teardown: Linux kills a process
# at once on a fatal signal (SIGTERM) even while a handled one (the nudge) is pending
_NUDGED = 0.3


class Postmortem:
    def __init__(self, store: StoreServer, size: int, log: Callable[[str], None],
                 folder: str | None = None) -> None:
        """folder: the job's own folder under --dump-dir (tbcoll.launch.scope made it), where
        request n writes dump-n; by default a new private folder in the temporary directory,
        one per request."""
        self._store = store
        self.size = size
        self._log = log
        self._folder = folder
        self._asked = 0

    def gather(self, reason: str, running: Callable[[], Sequence[int]],
               nudge: Callable[[list[int]], None] | None = None) -> str | None:
        """Ask the ranks that run tbcoll for their dumps, write down every dump there is and
        log where each rank was; the folder written, None if no rank sent one. running():
        the ranks whose process has not ended (those that end meanwhile are not waited for);
        nudge(ranks): make silent ranks write their stacks
        (tbcoll.observability.dumps.STACKS_SIGNAL)."""
        n = self.request(reason)
        deadline = time.monotonic() + DUMP_WAIT
        while True:
            silent = [r for r in running() if self._store.get(LISTENING_KEY.format(r))
                      and self._store.get(ANSWER_KEY.format(n, r)) is None]
            if not silent or time.monotonic() >= deadline:
                break
            self._store.wait([ANSWER_KEY.format(n, r) for r in silent], _PEEK)
        if silent and nudge is not None:
            nudge(silent)
            time.sleep(_NUDGED)
            self._log(f"{ranks_phrase(silent)} did not answer in {DUMP_WAIT:g} s: asked with "
                      "SIGUSR2 for the Python stacks of its threads (on its stderr)")
        return self._report(n, reason, self._dumps(range(self.size)), silent)

    def failed(self, reason: str, ranks: Sequence[int]) -> str | None:
        """Write down the dumps that ranks (declared failed under tbrun --keep-going, ended
        now) sent as they failed, and log where they were; nobody is asked, and the other
        ranks' dumps, from an earlier request, would be stale. The folder, or None."""
        return self._report(self.request(reason), reason, self._dumps(ranks), [],
                            "no dump (none asked: a killed rank sends none, and the others "
                            "went on)")

    def _dumps(self, ranks: Sequence[int]) -> dict[int, dict]:
        dumps = {}
        for rank in ranks:
            if (text := self._store.get(DUMP_KEY.format(rank))) is not None:
                try:
                    dumps[rank] = json.loads(text)
                except ValueError:
                    self._log(f"rank {rank} sent a dump that is not JSON; left out")
        return dumps

    def _report(self, n: int, reason: str, dumps: dict[int, dict], silent: Sequence[int],
                absent: str | None = None) -> str | None:
        """Write dumps to folder n and log where each rank was (absent: what a rank without
        a dump is said to be, where whereabouts' default would be wrong); None if there is
        none."""
        if not dumps:
            return None
        from tbcoll.launch.whereabouts import NOT_ASKED, where  # here: typing, for a job that fails

        lines = where(dumps, silent, absent or NOT_ASKED)
        try:
            folder = self._write(n, reason, dumps)
        except OSError as e:  # said in one line; the screen and the job's status stay
            folder = None
            self._log(f"cannot write the dumps ({e.filename or self._folder}: {e.strerror})")
        where_they_are = f"dumps in {folder}" if folder else "dumps not written"
        if lines:
            self._log(f"where each rank was ({reason}; {where_they_are}):")
            for line in lines:
                self._log(line)
        else:
            self._log(f"no rank was in a call ({reason}; {where_they_are})")
        return folder

    def request(self, reason: str) -> int:
        """Ask every listening rank for its dump (request n, returned): each answers
        ANSWER_KEY of (n, its rank) from a thread of its own (tbcoll.launch.authority's check
        of a frozen rank asks this way too)."""
        self._asked += 1
        self._store.set(REQUEST_KEY.format(self._asked), reason)
        return self._asked

    def _write(self, n: int, reason: str, dumps: dict[int, dict]) -> str:
        """A new folder (in the job's own, under --dump-dir; else in the temporary
        directory) and the dumps in it, each file new (tbcoll.launch.folders)."""
        if self._folder is not None:
            folder = os.path.join(self._folder, f"dump-{n}")
            os.mkdir(folder, PRIVATE_FOLDER)
        else:
            import tempfile  # here: a job that does not fail starts without it (~4 ms)

            folder = new_folder(tempfile.gettempdir(), f"tbrun-dump-{os.getpid()}-{n}-")
        for rank, dump in dumps.items():
            write_new(os.path.join(folder, f"rank-{rank}.json"),
                      json.dumps(dump, indent=1).encode())
        write_new(os.path.join(folder, "stacks.txt"), _stacks_text(reason, dumps).encode())
        return folder


def _stacks_text(reason: str, dumps: dict[int, dict]) -> str:
    """Every rank's threads and last calls, as a person reads them."""
    out = [f"why: {reason}", ""]
    for rank, dump in sorted(dumps.items()):
        out.append(f"=== rank {rank} (pid {dump.get('pid')} on {dump.get('host')}): "
                   f"{dump.get('reason')}")
        for comm in dump.get("communicators", ()):
            line = f"  communicator of ranks {comm['ranks']}: {comm['completed']} calls"
            if calls := comm.get("calls", [])[-5:]:
                line += ", last: " + ", ".join(f"{c['collective']} #{c['seq']}" for c in calls)
            if now := comm.get("current"):
                line += f"; now in {now['collective']} at {now['site']}"
            out.append(line)
        for stack in dump.get("stacks", ()):
            out.append(f"  thread {stack['thread']}{' (main)' if stack.get('main') else ''}:")
            out += [f"    {frame}" for frame in stack["frames"]]
        out.append("")
    return "\n".join(out)
