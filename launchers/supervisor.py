"""Run the ranks of a job and keep them in line, as mpirun and torchrun do.

- every rank gets its own process group, so teardown reaches whatever it spawned;
- output is read by one select loop and routed line by line (tbcoll.launch.output);
- the first rank to exit non-zero or die by a signal fails the job: its status is the job's,
  the others get SIGTERM, then SIGKILL after a grace period;
- SIGINT, SIGTERM and SIGHUP sent to tbrun are forwarded to every rank, then the same teardown;
- a job past its --timeout is torn down the same way and exits with status 124;
- a job whose standard output lost its reader (`tbrun ... | head -1`) is torn down the same
  way and exits with status 141, as a writer killed by SIGPIPE in a shell pipeline;
- under --keep-going, a rank that fails is declared failed instead (tbcoll.launch.authority
  publishes the failed set) and the others go on; a rank a peer reports as frozen is checked,
  and killed for good if it is; of two live ranks with no path left between them (a split),
  the higher is killed for good;
- each rank also dies if tbrun itself is killed: on Linux by PR_SET_PDEATHSIG
  (tbcoll.launch.parentdeath), elsewhere (macOS) and on remote hosts through
  tbcoll.launch.remote, below;
- what the ranks started outside their process groups (a child in a session of its own, a
  double-forked daemon) is killed when the job ends (Linux): tbrun is a child subreaper, so
  those orphans stay its descendants, and each carries the job's cookie (TBCOLL_JOB) in its
  environment (tbcoll.launch.reaper); tbcoll.launch.janitor does the same should tbrun be killed.

A rank with a set-up line runs under tbcoll.launch.remote (on a remote host through ssh): its
set-up goes on stdin, then signals and the rank's input as frames (tbcoll.launch.stdin), and for
SIGKILL tbrun closes that stdin, whose end of file makes the wrapper kill the rank.

Which failure is the job's, and when to stop the ranks, is decided by tbcoll.launch.verdict
from the events the supervisor sees; the supervisor does the I/O.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from tbcoll.launch.diagnose import hint, plural
from tbcoll.launch.output import STREAMS, OutputRouter
from tbcoll.launch.parentdeath import tied
from tbcoll.launch.postmortem import Postmortem
from tbcoll.launch.reaper import (
    carrying,
    children,
    descendants,
    reap_adopted,
    set_subreaper,
    sweep,
)
from tbcoll.launch.stdin import InputForwarder
from tbcoll.launch.verdict import (
    AllExited,
    Declare,
    Dump,
    Event,
    Exited,
    KillNow,
    KillRank,
    Log,
    Probe,
    Probed,
    Signalled,
    StdoutClosed,
    Stop,
    Suspected,
    Tick,
    Verdict,
    judge,
    status_of,
)

from tbcoll.core.errors import LaunchError
from tbcoll.core.records import record
from tbcoll.job.env import job_marks
from tbcoll.observability.dump_keys import STACKS_SIGNAL

TYPE_CHECKING = False  # typing's, without importing typing (~2 ms of tbrun's start-up)
if TYPE_CHECKING:
    from tbcoll.launch.authority import Authority

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL = 0.5  # backstop for SIGCHLD wake-ups; exits are normally seen at once
# seconds the sweep of what the ranks left behind may go on killing (a process that keeps
# forking); it normally ends after one or two rounds of a few milliseconds
_STRAY_PATIENCE = 5.0


@record
class RankCommand:
    rank: int
    argv: Sequence[str]
    env: dict[str, str]
    cwd: str | None = None
    host: str = ""  # for messages; "" on this machine
    setup: bytes | None = None  # for a remote rank: tbcoll.launch.remote's set-up line
    label: str = ""  # for messages, instead of "rank N"
    # a launcher of the ranks (mpiexec): its output passes untagged, it reads tbrun's stdin
    # itself, and its caller explains its failure
    launcher: bool = False
    stdin: bool = False  # reads tbrun's standard input (--stdin)
    runs: str = ""  # for messages: what a wrapped rank runs (its interpreter), else argv[0]

    @property
    def program(self) -> str:
        return self.runs or self.argv[0]

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return f"rank {self.rank} on {self.host}" if self.host else f"rank {self.rank}"


class Supervisor:
    def __init__(self, commands: Sequence[RankCommand], output: OutputRouter, *,
                 timeout: float | None, grace: float, log: Callable[[str], None],
                 streams: Mapping[tuple[int, str], int] | None = None,
                 keepalive: Sequence[int] = (), stdin_fd: int | None = None,
                 peer_failure: Callable[[int], tuple[str, tuple[int, ...]] | None]
                 = lambda rank: None,
                 on_spawn: Callable[[int, bool], None] = lambda pgid, wrapped: None,
                 job: str = "", postmortem: Postmortem | None = None,
                 authority: Authority | None = None) -> None:
        """streams: more (rank, "out"/"err") -> readable fd to route, beside the commands'
        pipes (e.g. FIFOs mpiexec writes); keepalive: write ends of those held open so that
        they do not end before their writer opens them, closed once every command exited;
        stdin_fd: tbrun's standard input, forwarded to the commands with stdin set;
        peer_failure(rank): what the rank reported before failing because of peers (the
        error, and those peers), or None; on_spawn(pgid, wrapped): a process group was started
        (for tbcoll.launch.janitor), wrapped: a local tbcoll.launch.remote's; job: the job's
        TBCOLL_JOB, whose carriers are killed at the end;
        postmortem: gathers the ranks' dumps when the job fails and on SIGUSR1;
        authority: under --keep-going, the failed set's side of the store (a rank's failure
        then does not end the job)."""
        self._commands = commands
        self._streams = dict(streams or {})
        self._keepalive = list(keepalive)
        self._output = output
        self._grace = grace
        self._log = log
        self._procs: dict[int, subprocess.Popen] = {}
        self._told: set[int] = set()  # the ranks whose end _reap handled
        self._by_rank = {cmd.rank: cmd for cmd in commands}
        self._pending_signals: list[int] = []
        self._peer_failure = peer_failure
        self._on_spawn = on_spawn
        self._input = InputForwarder(
            stdin_fd if any(c.stdin and not c.launcher for c in commands) else None, log)
        self._verdict = Verdict({cmd.rank: cmd.name for cmd in commands}, timeout,
                                keep_going=authority is not None)
        self._authority = authority
        self._kill_at: float | None = None  # SIGKILL deadline once teardown has begun
        self._stdout_lost = False  # tbrun's stdout lost its reader, and the verdict was told
        self._job_marks = job_marks(job)
        self._helpers: set[int] = set()  # tbrun's children before the ranks (the janitor)
        self._adopting = False  # tbrun is a subreaper: orphans of the job become its children
        self._child_exited = False  # SIGCHLD came: an adopted orphan may wait to be reaped
        self._next_reaping = 0.0
        self._postmortem = postmortem

    @property
    def launcher_failed(self) -> bool:
        """The job's status is a launcher's (mpiexec's) own, for its caller to explain."""
        return self._verdict.launcher_failed

    def run(self, after_spawn: Callable[[], None] = lambda: None) -> int:
        """Start every rank, supervise until all have exited, return the job's exit status.

        after_spawn runs once every rank is started; threads started there do not exist yet
        when the ranks are forked.
        """
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        if self._authority is not None:  # a rank's report of frozen peers wakes the loop
            self._authority.wake_with(wake_w)
        watched = (*_FORWARDED, signal.SIGCHLD, signal.SIGUSR1)
        old_handlers = {sig: signal.signal(sig, self._on_signal) for sig in watched}
        # Reading a terminal from the background would stop tbrun (SIGTTIN); ignored, the
        # read fails with EIO instead and the forwarder says so.
        old_handlers[signal.SIGTTIN] = signal.signal(signal.SIGTTIN, signal.SIG_IGN)
        selector = selectors.DefaultSelector()
        selector.register(wake_r, selectors.EVENT_READ)
        was_subreaper = set_subreaper(True)
        self._adopting = was_subreaper is not None
        me = os.getpid()
        self._helpers = children(me)
        for key, fd in self._streams.items():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, key)
        try:
            self._spawn(selector)
            after_spawn()
            self._loop(selector, wake_r)
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wakeup)
            if self._authority is not None:
                self._authority.wake_with(None)
            self._kill_groups(signal.SIGKILL)  # no process of the job outlives tbrun
            for proc in self._procs.values():
                proc.wait()
            self._kill_strays()
            if was_subreaper is not None:
                set_subreaper(was_subreaper)
            self._input.close()
            for key in list(selector.get_map().values()):
                if key.data in self._streams:
                    os.close(key.fileobj)  # a stream of self._streams not read to its end
            while self._keepalive:
                os.close(self._keepalive.pop())
            selector.close()
            os.close(wake_r)
            os.close(wake_w)
            self._output.close()
        return self._verdict.status or 0

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGCHLD:
            self._child_exited = True
        else:
            self._pending_signals.append(signum)

    def _spawn(self, selector: selectors.BaseSelector) -> None:
        # A preexec_fn (from tied) is safe here: tbrun has no other thread yet (see run's
        # after_spawn). Should tbrun die, a launcher gets SIGTERM, not SIGKILL: mpiexec passes
        # it on through its proxies and lives on long enough for tbrun's janitor to note the
        # files those proxies hold, before the janitor's SIGKILL (tbcoll.launch.hydratopo).
        for cmd in self._commands:
            if cmd.launcher:  # it reads tbrun's stdin itself (mpiexec: for rank 0)
                stdin = None if cmd.stdin else subprocess.DEVNULL
            else:
                piped = cmd.setup is not None or (cmd.stdin and self._input.source is not None)
                stdin = subprocess.PIPE if piped else subprocess.DEVNULL
            try:
                argv, hook = tied(cmd.argv, cmd.env, cmd.cwd,
                                  signal.SIGTERM if cmd.launcher else signal.SIGKILL)
                proc = subprocess.Popen(
                    argv, env=cmd.env, cwd=cmd.cwd,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=stdin, start_new_session=True, preexec_fn=hook)  # noqa: PLW1509
            except OSError as e:
                self._kill_groups(signal.SIGKILL)
                raise LaunchError(f"cannot start {cmd.name} ({cmd.argv[0]}): {e}") from e
            self._procs[cmd.rank] = proc
            # its own session: the group's id is its pid
            self._on_spawn(proc.pid, cmd.setup is not None and not cmd.host)
            if proc.stdin is not None:  # the forwarder takes over its own copy of the pipe
                pipe = self._input.add(cmd.rank, os.dup(proc.stdin.fileno()),
                                       framed=cmd.setup is not None, reads_stdin=cmd.stdin)
                proc.stdin.close()
                if cmd.setup is not None:
                    pipe.put_raw(cmd.setup)
            for stream, pipe in (("out", proc.stdout), ("err", proc.stderr)):
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe, selectors.EVENT_READ, (cmd.rank, stream))

    def _loop(self, selector: selectors.BaseSelector, wake_r: int) -> None:
        self._verdict = self._verdict._replace(started=time.monotonic())
        drain_until = None  # once every rank has exited, leftover pipes get a short while
        while True:
            checks = self._authority.deadline if self._authority is not None else None
            deadlines = [d for d in (self._verdict.deadline, self._kill_at, drain_until, checks)
                         if d is not None]
            wait = min([_POLL, *(d - time.monotonic() for d in deadlines)])
            if (at := self._output.next_deadline()) is not None:
                wait = min(wait, at - time.monotonic())
            if self._input.watch(selector):
                wait = 0.0
            for key, _ in selector.select(max(0.0, wait)):
                if key.fileobj == wake_r:
                    while _read(wake_r):
                        pass
                elif key.data[0] in ("stdin", "input"):
                    self._input.ready(selector, key)
                else:
                    self._pump(selector, key)
            self._output.flush_due()
            if self._output.stdout_closed and not self._stdout_lost:
                self._stdout_lost = True
                self._tell(StdoutClosed(time.monotonic(), self._alive(),
                                        self._output.stdout_failure))
            while self._pending_signals:
                signum = self._pending_signals.pop(0)
                if signum == signal.SIGUSR1:  # where is every rank? the job goes on
                    self._gather("asked with SIGUSR1", resume=False)
                else:
                    self._tell(Signalled(signum, time.monotonic(), self._alive()))
            self._reap(selector)
            self._hear_authority()
            now = time.monotonic()
            if self._adopting and self._child_exited and now >= self._next_reaping:
                # reads /proc (tbrun's children, else every process): at most once per
                # _POLL, however many ranks end at once
                self._child_exited = False
                self._next_reaping = now + _POLL
                reap_adopted(self._own())
            if (at := self._verdict.deadline) is not None and now >= at:
                self._tell(Tick(now, self._alive()))
            if self._kill_at is not None and now >= self._kill_at and self._alive():
                self._log(f"{plural(len(self._alive()), 'rank')} still running "
                          f"{self._grace:g} s after SIGTERM; sending SIGKILL")
                self._kill_groups(signal.SIGKILL)
                self._kill_at = None
            if not self._alive():
                self._tell(AllExited(now))
                while self._keepalive:  # the writers are gone: let their streams end
                    os.close(self._keepalive.pop())
                self._input.stop(selector)  # nobody is left to read it
                if len(selector.get_map()) == 1:
                    return  # only the wake-up pipe is left
                if drain_until is None:
                    # Descendants may still hold a pipe open: end them, then drain briefly.
                    self._kill_groups(signal.SIGKILL)
                    self._kill_strays()
                    drain_until = time.monotonic() + 1.0
                elif now >= drain_until:
                    return

    def _tell(self, event: Event) -> None:
        """Hand the verdict an event and carry out what it says."""
        self._verdict, actions = judge(self._verdict, event)
        for action in actions:
            if isinstance(action, Log):
                self._log(action.line)
            elif isinstance(action, Stop):
                self._kill_groups(action.sig)
                self._kill_at = time.monotonic() + self._grace
            elif isinstance(action, KillNow):
                self._kill_groups(signal.SIGKILL)
            elif isinstance(action, Dump) and action.failed:
                if self._postmortem is not None:
                    self._postmortem.failed(action.reason, action.failed)
            elif isinstance(action, Dump):
                self._gather(action.reason, resume=True)
            elif isinstance(action, Declare):
                self._authority.declare(action.epoch, action.ranks)
            elif isinstance(action, Probe):
                self._authority.probe(action.peers, f"rank {action.reporter} reported "
                                      f"{', '.join(map(str, action.peers))} as frozen")
            elif isinstance(action, KillRank):
                self._signal_rank(action.rank, signal.SIGKILL)

    def _hear_authority(self) -> None:
        """Under --keep-going: tell the verdict of the ranks' reports of frozen peers, and of
        the checks of those peers that are due."""
        if self._authority is None:
            return
        for reporter, peers, why in self._authority.reports():
            self._tell(Suspected(reporter, peers, time.monotonic(), self._alive(), why))
        for peer, frozen, why in self._authority.due(time.monotonic()):
            self._tell(Probed(peer, frozen, why, time.monotonic(), self._alive()))

    def _gather(self, reason: str, resume: bool) -> None:
        """Have the ranks' dumps written and where each rank was said (tbcoll.launch.postmortem);
        resume: first SIGCONT every rank, so that a stopped one answers too (the job is being
        torn down: a rank that was stopped on purpose is stopped for good next)."""
        if self._postmortem is None:
            return
        if resume:
            self._kill_groups(signal.SIGCONT)
        self._postmortem.gather(reason, self._running, self._ask_for_stacks)

    def _ask_for_stacks(self, ranks: list[int]) -> None:
        """Signal silent ranks to write their stacks to stderr (tbcoll.observability.dumps), the
        rank's process only: its children need not handle the signal. A wrapped rank (every local
        rank on macOS, a remote one) is asked through its wrapper (tbcoll.launch.remote),
        which signals the rank alone; a launcher's (mpiexec's) ranks are not asked."""
        for rank in ranks:
            cmd, proc = self._by_rank.get(rank), self._procs.get(rank)
            if cmd is None or proc is None or cmd.launcher:
                continue
            if cmd.setup is not None:
                self._input.pipes[rank].put_signal(STACKS_SIGNAL.name[3:])
                continue
            try:
                os.kill(proc.pid, STACKS_SIGNAL)
            except (ProcessLookupError, PermissionError):
                pass

    def _running(self) -> range | list[int]:
        """The ranks whose process has not ended yet; all ranks while a launcher (mpiexec) of
        them runs. Popen.poll (waitpid with WNOHANG) reaps a rank that ended and keeps its
        status, which _reap tells the verdict next: os.waitid, which could look without
        reaping, is not built on macOS."""
        running = []
        for rank, proc in self._procs.items():
            if proc.poll() is None:  # an ended rank is reaped here; _reap tells its exit
                if self._by_rank[rank].launcher:
                    return range(self._postmortem.size)
                running.append(rank)
        return running

    def _pump(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> bool:
        """Route what one stream has; False when nothing was there or it ended."""
        rank, stream = key.data
        data = _read(key.fd)
        if data is None:
            return False
        if data:
            self._output.write(rank, stream, data)
        else:
            selector.unregister(key.fileobj)
            if isinstance(key.fileobj, int):
                os.close(key.fileobj)
            else:
                key.fileobj.close()
            self._output.end(rank, stream)
        return bool(data)

    def _reap(self, selector: selectors.BaseSelector) -> None:
        """Tell the verdict of each rank that ended non-zero, with what it left: its last
        words (routed first), its report of peers it failed because of, a hint."""
        for rank, proc in self._procs.items():
            if rank in self._told or proc.poll() is None:
                continue
            self._told.add(rank)
            cmd = self._by_rank[rank]
            self._input.rank_exited(rank)
            if proc.returncode == 0:
                continue
            returncode = _rank_returncode(cmd, proc.returncode)
            report = advice = None
            if not cmd.launcher:
                self._drain(selector, rank)
                report = self._peer_failure(rank)
                if report is None:
                    advice = hint(cmd.host, status_of(returncode), cmd.argv[-1], cmd.program,
                                  self._output.stderr_tail(rank))
            self._tell(Exited(rank, proc.pid, returncode, time.monotonic(), self._alive(),
                              report, advice or "", cmd.launcher))

    def _drain(self, selector: selectors.BaseSelector, rank: int) -> None:
        """Route what an exited rank's pipes still hold."""
        for key in list(selector.get_map().values()):
            if isinstance(key.data, tuple) and key.data[0] == rank and key.data[1] in STREAMS:
                while self._pump(selector, key):
                    pass

    def _own(self) -> set[int]:
        """tbrun's children whose exit status someone here still waits for."""
        return self._helpers | {p.pid for p in self._procs.values() if p.returncode is None}

    def _kill_strays(self) -> None:
        """SIGKILL what the ranks left outside their process groups (Linux): tbrun's
        descendants but its helpers (orphans it adopted as subreaper, and theirs), and this
        user's processes that carry the job's cookie; reap the adopted."""
        def strays(table):
            found = {p.pid: p for p in descendants(os.getpid(), table, spare=self._own())}
            found.update((p.pid, p) for p in carrying(self._job_marks, table)
                         if p.pid not in self._helpers)
            return found.values()

        sweep(strays, self._own(), _STRAY_PATIENCE)

    def _alive(self) -> tuple[int, ...]:
        """The ranks whose end the verdict was not told yet (_reap tells it)."""
        return tuple(rank for rank in self._procs if rank not in self._told)

    def _kill_groups(self, sig: int) -> None:
        """Signal the process group of every rank: the rank and all it started. A wrapped
        rank (tbcoll.launch.remote) gets the signal's name on stdin, and for SIGKILL the end of
        its stdin, on which the wrapper kills the rank's group; ssh is killed as well, in
        case its connection hangs."""
        for rank in self._procs:
            self._signal_rank(rank, sig)

    def _signal_rank(self, rank: int, sig: int) -> None:
        """Signal one rank's process group (through its wrapper where it has one)."""
        proc, cmd = self._procs[rank], self._by_rank[rank]
        if cmd.setup is not None:
            if sig != signal.SIGKILL:
                self._input.pipes[rank].put_signal(signal.Signals(sig).name[3:])
                return
            self._input.pipes[rank].close()
            if not cmd.host:
                return  # the local wrapper ends by itself once its rank is dead
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone


def _rank_returncode(cmd: RankCommand, returncode: int) -> int:
    """The rank's own returncode (-N for signal N). A rank wrapped on this machine (macOS,
    where tbcoll.launch.remote stands in for PR_SET_PDEATHSIG) has its wrapper's status, in
    which a signal N is 128 + N: tbrun names the signal, as it does for a rank it runs."""
    if cmd.setup is not None and not cmd.host and 128 < returncode < 128 + signal.NSIG:
        return 128 - returncode
    return returncode


def _read(fd: int) -> bytes | None:
    """Read what is there; b'' at end of file, None if nothing is ready."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
