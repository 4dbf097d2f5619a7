"""Which failure is the job's, and when to stop the ranks: a pure function of what happened.

The supervisor turns what it sees (a rank's exit, a signal to tbrun, the clock, a closed
standard output) into events and hands each to `judge` with the verdict so far; `judge`
returns the next verdict and what to do (log a line, stop the ranks, kill them now). It reads
no clock, no process and no pipe, so every rule below is tested without processes
(tests/launch/test_verdict.py).

The rules: the first rank to fail for its own reason fails the job, with its status. A rank
that failed because of peers (it reported them to tbrun's store before raising) and a rank
that died of the signal tbrun's teardown sent only stand in until that rank's exit is seen;
if none is seen within FOLLOWER_WAIT, the job stops with the stand-in's status and the peers
the others failed because of are named (a frozen rank never exits). A signal to tbrun, the
--timeout and a closed standard output stop the job with their own statuses (128+N, 124, 141).
A launcher's (mpiexec's) failure is its caller's to explain.

Under --keep-going (Verdict.keep_going) tbrun is the job's one failure authority
(tbcoll.job.failures): a rank that ends badly does not stop the job. It is declared failed
(Declare: the whole failed set, with the next epoch, published in the store) and the others go
on. A rank a peer reports as frozen (Suspected) is checked (Probe); one found frozen is killed
for good (KillRank) and declared once its exit is seen; a live one is left alone. Two live
ranks that report no path left between them (a split) lose the higher of the two, killed and
declared alike. When every
rank has ended, the job's status is the first failure's, with a summary line; a signal to
tbrun, --timeout and a closed standard output still end the whole job with their statuses.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

from tbcoll.launch.diagnose import SSH_FAILED, describe_exit, plural, ranks_phrase, suspects

from tbcoll.core.errors import LINK_DOWN
from tbcoll.core.records import record
from tbcoll.job.failures import NO_PATH

TIMEOUT_STATUS = 124  # as timeout(1) does
STDOUT_CLOSED_STATUS = 128 + signal.SIGPIPE  # as the shell reports a writer SIGPIPE killed
# seconds a follower's failure waits for the failure it followed: the far end of a broken link
# sees it up to a dead-link check period (1 s) after the near end
FOLLOWER_WAIT = 2.0
# A rank's status after tbrun's teardown signals (128+INT/KILL/TERM, through a wrapper) or
# after tbrun killed its ssh: the teardown's doing, not the rank's own failure.
_TEARDOWN_STATUSES = (128 + signal.SIGINT, 128 + signal.SIGKILL, 128 + signal.SIGTERM,
                      SSH_FAILED)


# --- events: what the supervisor saw, each with the time and the ranks still running ------

@record
class Exited:
    """A rank (or the launcher) ended with a non-zero returncode (Popen's: -N for signal N)."""

    rank: int
    pid: int
    returncode: int
    now: float
    alive: tuple[int, ...]
    # what the rank reported before failing because of peers: (its error, those peers)
    report: tuple[str, tuple[int, ...]] | None = None
    hint: str = ""  # diagnose.hint's advice from the rank's last words, for its own failure
    launcher: bool = False


@record
class Signalled:
    """tbrun got SIGINT, SIGTERM or SIGHUP."""

    signum: int
    now: float
    alive: tuple[int, ...]


@record
class StdoutClosed:
    """tbrun's standard output lost its reader (`tbrun ... | head -1`), or a write to it
    failed (failure: why, e.g. a full disk)."""

    now: float
    alive: tuple[int, ...]
    failure: str = ""


@record
class Tick:
    """Time passed (at least until Verdict.deadline, when there is one)."""

    now: float
    alive: tuple[int, ...]


@record
class AllExited:
    """No rank runs any more."""

    now: float
    alive: tuple[int, ...] = ()


@record
class Suspected:
    """Under --keep-going, rank (reporter) waited past --comm-timeout on peers and asked
    tbrun to look at them (tbcoll.job.failures.SUSPECT); or, why NO_PATH, found no path
    left to them (a split)."""

    reporter: int
    peers: tuple[int, ...]
    now: float
    alive: tuple[int, ...]
    why: str = ""


@record
class Probed:
    """What the check of a suspected peer found: frozen (it answered nothing), or why not."""

    peer: int
    frozen: bool
    why: str  # what was seen, for the line tbrun logs
    now: float
    alive: tuple[int, ...]


Event = Exited | Signalled | StdoutClosed | Tick | AllExited | Suspected | Probed


# --- actions: what the supervisor is to do --------------------------------------------------

@record
class Log:
    line: str


@record
class Stop:
    """Send sig to every rank's process group; SIGKILL those left after the grace period."""

    sig: int


@record
class KillNow:
    """SIGKILL every rank's process group now."""


@record
class Dump:
    """Gather the ranks' dumps (tbcoll.observability.dumps) before they are stopped, and say where
    each rank was: the job is failing."""

    reason: str
    # only these ranks' dumps, sent as they failed, nobody asked (the end of a --keep-going
    # job: the ranks are gone); () for every rank's, asked for
    failed: tuple[int, ...] = ()


@record
class Declare:
    """Publish the failed set (every rank declared failed so far) as epoch's
    (tbcoll.job.failures: FAILED and FAILED_AT)."""

    epoch: int
    ranks: tuple[int, ...]


@record
class Probe:
    """Check whether each of peers is frozen or alive (answer with a Probed per peer);
    reporter asked."""

    reporter: int
    peers: tuple[int, ...]


@record
class KillRank:
    """SIGKILL one rank's process group, for good: the rank was found frozen, or it failed
    and what it started (its group) goes with it."""

    rank: int


Action = Log | Stop | KillNow | Dump | Declare | Probe | KillRank


@record
class Verdict:
    """The job's verdict so far; start with Verdict(names, timeout, started)."""

    names: Mapping[int, str]  # rank -> how messages name it
    timeout: float | None = None  # --timeout, seconds
    started: float = 0.0
    status: int | None = None  # the job's exit status, once something decided it
    culprit: int | None = None  # the rank whose own failure gave the status
    provisional: bool = False  # the status is a follower's, until its culprit's is seen
    launcher_failed: bool = False  # the status is a launcher's (mpiexec's) own
    follower_deadline: float | None = None  # stop the job then, if no culprit was seen
    tearing_down: bool = False  # the ranks were told to stop
    followers: tuple[tuple[int, tuple[int, ...]], ...] = ()  # rank -> the ranks it failed on
    broken: frozenset[tuple[int, int]] = frozenset()  # (rank, peer): links found dead
    keep_going: bool = False  # --keep-going: a rank's failure does not end the job
    # under --keep-going: the ranks declared failed, in order, each with its status
    failures: tuple[tuple[int, int], ...] = ()
    probing: frozenset[int] = frozenset()  # suspected ranks whose check is under way
    killed: frozenset[int] = frozenset()  # ranks found frozen and killed, until declared
    summarized: bool = False  # the end of a --keep-going job was told

    @property
    def deadline(self) -> float | None:
        """When the verdict needs a Tick, if nothing else happens before."""
        times = [self.follower_deadline]
        if self.timeout and (self.status is None or self.follower_deadline is not None):
            times.append(self.started + self.timeout)
        return min((t for t in times if t is not None), default=None)

    def name(self, rank: int) -> str:
        return self.names.get(rank, f"rank {rank}")

    @property
    def failed(self) -> frozenset[int]:
        """The ranks declared failed (under --keep-going)."""
        return frozenset(rank for rank, _ in self.failures)


def judge(verdict: Verdict, event: Event) -> tuple[Verdict, list[Action]]:
    """The verdict after event, and what to do about it."""
    return _RULES[type(event)](verdict, event)


def _stop(verdict: Verdict, status: int, sig: int, dump: str = "",
          **changes) -> tuple[Verdict, list[Action]]:
    """Begin the teardown with status as the job's; first gather the ranks' dumps, saying
    why, where dump says."""
    changes = {"provisional": False, **changes}
    return verdict._replace(status=status, follower_deadline=None, tearing_down=True,
                            **changes), [*([Dump(dump)] if dump else []), Stop(sig)]


def _name_suspects(verdict: Verdict, alive: tuple[int, ...]) -> list[Action]:
    """Name what the followers failed because of, when no rank failed by itself."""
    return [Log(line) for line in suspects(dict(verdict.followers), alive, verdict.name,
                                           verdict.broken)]


def _exit_line(verdict: Verdict, e: Exited) -> str:
    """How the rank ended, and what it reported (the peers it failed because of) or the
    advice for its own failure."""
    line = f"{verdict.name(e.rank)} (pid {e.pid}) {describe_exit(e.returncode)}"
    if e.report is not None:
        return line + f", failing because of {ranks_phrase(e.report[1]) or 'peers'} ({e.report[0]})"
    return line + e.hint


def _exited(verdict: Verdict, e: Exited) -> tuple[Verdict, list[Action]]:
    if verdict.keep_going and not verdict.tearing_down and not e.launcher:
        return _declare(verdict, e)
    if verdict.culprit is not None:
        return verdict, []
    if e.launcher:  # its caller explains the failure (tbcoll.launch.starters.mpiexec)
        if verdict.status is not None:
            return verdict, []
        return _stop(verdict, status_of(e.returncode), signal.SIGTERM,
                     f"{verdict.name(e.rank)} failed", launcher_failed=True)
    if verdict.status is not None and not verdict.provisional:
        return verdict, []  # ended by a signal to tbrun or --timeout: that is the job's status
    if e.report is not None:
        verdict = verdict._replace(
            followers=(*verdict.followers, (e.rank, e.report[1])),
            broken=verdict.broken | ({(e.rank, peer) for peer in e.report[1]}
                                     if LINK_DOWN in e.report[0] else set()))
    own = e.report is None and not (verdict.tearing_down and (
        e.returncode < 0 or e.returncode in _TEARDOWN_STATUSES))
    if verdict.status is not None and not own:
        return verdict, []  # a follower of the failure already reported
    status = status_of(e.returncode)
    message = _exit_line(verdict, e)
    changes: dict = {}
    if verdict.status is not None:  # the failure that a follower's stood for
        message += f"; it failed first: the job's status is {status}"
    elif not own:  # let the rank that failed first finish exiting, then stop
        message += "; waiting briefly for the rank that failed first"
        changes["follower_deadline"] = e.now + FOLLOWER_WAIT
    elif e.alive:
        message += f"; stopping the other {plural(len(e.alive), 'rank')}"
    verdict = verdict._replace(status=status, provisional=not own,
                                  culprit=e.rank if own else None, **changes)
    if own and not verdict.tearing_down:
        verdict, actions = _stop(verdict, status, signal.SIGTERM,
                                 f"{verdict.name(e.rank)} failed")
        return verdict, [Log(message), *actions]
    return verdict, [Log(message)]


def _signalled(verdict: Verdict, e: Signalled) -> tuple[Verdict, list[Action]]:
    name = signal.Signals(e.signum).name
    if verdict.tearing_down:
        return verdict, [Log(f"got {name} again; killing every rank now"), KillNow()]
    forward = signal.SIGINT if e.signum == signal.SIGINT else signal.SIGTERM
    verdict, actions = _stop(verdict, 128 + e.signum, forward)
    return verdict, [Log(f"got {name}; forwarding {forward.name} to "
                         f"{plural(len(e.alive), 'rank')}"), *actions]


def _stdout_closed(verdict: Verdict, e: StdoutClosed) -> tuple[Verdict, list[Action]]:
    """What a shell pipeline expects of a writer whose reader left: stop, status 141 (status
    1 where a write failed: the output is lost). The ranks' output has nowhere to go; a
    failure already being torn down keeps its status, and ranks that all ended well still
    lost output (141, or 1, as well)."""
    if verdict.tearing_down:
        return verdict, []
    if e.failure:
        log = Log(f"cannot write the ranks' output to standard output ({e.failure}); "
                  "stopping the job")
    else:
        log = Log("standard output was closed; stopping the job")
    closed = 1 if e.failure else STDOUT_CLOSED_STATUS
    if e.alive:
        # a follower's failure still waits for its culprit: it stays provisional
        status = closed if verdict.status is None else verdict.status
        verdict, actions = _stop(verdict, status, signal.SIGTERM,
                                 provisional=verdict.provisional)
        return verdict, [log, *actions]
    if verdict.status is None:
        verdict = verdict._replace(status=closed)
    return verdict, [log]


def _tick(verdict: Verdict, e: Tick) -> tuple[Verdict, list[Action]]:
    actions: list[Action] = []
    if verdict.follower_deadline is not None and e.now >= verdict.follower_deadline:
        actions += _name_suspects(verdict, e.alive)
        actions.append(Log(f"stopping the other {plural(len(e.alive), 'rank')}"))
        # the rank it followed may still show its own failure: the status stays provisional
        verdict, stop = _stop(verdict, verdict.status, signal.SIGTERM,
                              f"{ranks_phrase([r for r, _ in verdict.followers])} failed "
                              "because of peers", provisional=True)
        actions += stop
    if verdict.timeout and e.now >= verdict.started + verdict.timeout and (
            verdict.status is None or verdict.follower_deadline is not None):
        actions.append(Log(f"job exceeded --timeout {verdict.timeout:g} s; stopping "
                           f"{plural(len(e.alive), 'rank')}"))
        verdict, stop = _stop(verdict, TIMEOUT_STATUS, signal.SIGTERM,
                              f"the job exceeded --timeout {verdict.timeout:g} s")
        actions += stop
    return verdict, actions


def _declare(verdict: Verdict, e: Exited) -> tuple[Verdict, list[Action]]:
    """--keep-going: the rank is failed for good and the job goes on without it; the failed
    set is published with the next epoch."""
    status = status_of(e.returncode)
    if status > 128:  # killed: a report of peers is from an earlier failure it survived
        e = e._replace(report=None)
    failures = (*verdict.failures, (e.rank, status))
    verdict = verdict._replace(failures=failures, killed=verdict.killed - {e.rank},
                               probing=verdict.probing - {e.rank})
    message = _exit_line(verdict, e)
    if e.alive:
        message += (f"; the job goes on without it (--keep-going): "
                    f"{plural(len(e.alive), 'rank')} left")
    else:
        message += "; it was the last rank running"
    return verdict, [Log(message), KillRank(e.rank),
                     Declare(len(failures), tuple(sorted(verdict.failed)))]


def _suspected(verdict: Verdict, e: Suspected) -> tuple[Verdict, list[Action]]:
    """Check each reported peer that still runs and is not checked or killed already."""
    if verdict.tearing_down or not verdict.keep_going:
        return verdict, []
    if e.why == NO_PATH:
        return _split(verdict, e)
    settled = verdict.failed | verdict.probing | verdict.killed
    peers = tuple(p for p in e.peers if p in e.alive and p not in settled and p != e.reporter)
    if not peers:
        return verdict, []
    return verdict._replace(probing=verdict.probing | set(peers)), [Probe(e.reporter, peers)]


def _split(verdict: Verdict, e: Suspected) -> tuple[Verdict, list[Action]]:
    """Two live ranks with no path left between them: the higher of the two is failed, killed
    for good (declared once its exit is seen), so that every survivor, whichever end reported
    first, sees the same failed set. Ranks fill hosts in order, so where two hosts are cut
    apart their every pair of ranks (one per rail) fails the later host's rank: the later
    host goes whole. A pair with an end that ended, or failed already, is no split."""
    actions: list[Action] = []
    for peer in e.peers:
        low, high = sorted((e.reporter, peer))
        settled = verdict.failed | verdict.killed
        if low == high or not {low, high} <= set(e.alive) or {low, high} & settled:
            continue
        verdict = verdict._replace(killed=verdict.killed | {high})
        actions += [Log(f"{verdict.name(low)} and {verdict.name(high)} have no path left "
                        f"between them (a split, --keep-going): {verdict.name(high)} is failed "
                        "(the higher rank of the pair); killing it for good (SIGKILL)"),
                    KillRank(high)]
    return verdict, actions


def _probed(verdict: Verdict, e: Probed) -> tuple[Verdict, list[Action]]:
    """Kill a frozen peer for good (declared once its exit is seen); leave a live one."""
    verdict = verdict._replace(probing=verdict.probing - {e.peer})
    if verdict.tearing_down or e.peer not in e.alive or e.peer in verdict.failed:
        return verdict, []
    if not e.frozen:
        return verdict, [Log(f"{verdict.name(e.peer)} was reported as frozen, but {e.why}: "
                             "the report is not upheld; it goes on")]
    return verdict._replace(killed=verdict.killed | {e.peer}), [
        Log(f"{verdict.name(e.peer)} is frozen ({e.why}); killing it for good (SIGKILL)"),
        KillRank(e.peer)]


def _all_exited(verdict: Verdict, e: AllExited) -> tuple[Verdict, list[Action]]:
    if verdict.keep_going and verdict.failures and not verdict.summarized:
        return _summarize(verdict)
    if verdict.follower_deadline is None:
        return verdict, []
    # every rank ended while a follower's failure waited for its culprit
    return (verdict._replace(follower_deadline=None),
            [*_name_suspects(verdict, e.alive), Dump("ranks failed because of peers")])


def _summarize(verdict: Verdict) -> tuple[Verdict, list[Action]]:
    """The end of a --keep-going job where ranks failed: never status 0. The first failure's
    status is the job's, unless the job was ended otherwise (a signal to tbrun, --timeout);
    the dumps the failed ranks sent as they failed are written down (nobody is asked: at a
    death, asking would wake a stopped rank and hold up the survivors)."""
    failed = [rank for rank, _ in verdict.failures]
    named = f"{plural(len(failed), 'rank')} failed ({', '.join(map(verdict.name, failed))})"
    if verdict.status is None:
        status = verdict.failures[0][1]
        line = (f"{named}; {plural(len(verdict.names) - len(failed), 'rank')} went on to the "
                f"end; the job's status is {status}, the first failure's")
    else:
        status, line = verdict.status, f"{named} before the job was stopped"
    reason = f"{ranks_phrase(sorted(failed))} failed (--keep-going)"
    # a teardown gathered every rank's dumps already
    dump = [] if verdict.tearing_down else [Dump(reason, tuple(sorted(failed)))]
    return verdict._replace(status=status, summarized=True), [Log(line), *dump]


_RULES = {Exited: _exited, Signalled: _signalled, StdoutClosed: _stdout_closed, Tick: _tick,
          AllExited: _all_exited, Suspected: _suspected, Probed: _probed}


def status_of(returncode: int) -> int:
    """tbrun's status for a Popen returncode: 128+N for signal N."""
    return returncode if returncode >= 0 else 128 - returncode
