"""tbrun's verdict (tbcoll.launch.verdict) on sequences of events, without processes."""

import signal

from tbcoll.launch.verdict import (
    FOLLOWER_WAIT,
    STDOUT_CLOSED_STATUS,
    TIMEOUT_STATUS,
    AllExited,
    Declare,
    Dump,
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
)

from tbcoll.core.errors import LINK_DOWN
from tbcoll.job.failures import NO_PATH

NAMES = {0: "rank 0", 1: "rank 1", 2: "rank 2"}


def run(events, verdict=None):
    """Fold events into a verdict; returns it and every action, in order."""
    verdict = verdict or Verdict(NAMES, timeout=None, started=0.0)
    actions = []
    for event in events:
        verdict, done = judge(verdict, event)
        actions += done
    return verdict, actions


def lines(actions):
    return [a.line for a in actions if isinstance(a, Log)]


def stops(actions):
    return [a.sig for a in actions if isinstance(a, Stop)]


def test_first_rank_to_fail_by_itself_decides_and_the_teardown_victims_do_not():
    verdict, actions = run([
        Exited(1, 101, 3, now=1.0, alive=(0, 2), hint=" (a hint)"),
        Exited(0, 100, -signal.SIGTERM, now=1.1, alive=(2,)),  # tbrun's SIGTERM
        Exited(2, 102, 128 + signal.SIGTERM, now=1.2, alive=()),  # through a wrapper
    ])
    assert verdict.status == 3 and verdict.culprit == 1
    assert lines(actions) == [
        "rank 1 (pid 101) exited with status 3 (a hint); stopping the other 2 ranks"]
    assert stops(actions) == [signal.SIGTERM]


def test_a_follower_waits_for_the_rank_it_followed_which_then_decides():
    verdict, actions = run([
        Exited(1, 101, 1, now=5.0, alive=(0,), report=("lost rank 0", (0,))),
    ])
    assert verdict.status == 1 and verdict.provisional and verdict.culprit is None
    assert verdict.deadline == 5.0 + FOLLOWER_WAIT and not stops(actions)
    assert lines(actions) == ["rank 1 (pid 101) exited with status 1, failing because of "
                              "rank 0 (lost rank 0); waiting briefly for the rank that failed "
                              "first"]
    verdict, actions = run([Exited(0, 100, -signal.SIGSEGV, now=5.5, alive=())], verdict)
    assert verdict.status == 128 + signal.SIGSEGV and verdict.culprit == 0
    assert not verdict.provisional and verdict.deadline is None
    assert lines(actions) == ["rank 0 (pid 100) was killed by signal 11 (SIGSEGV); it failed "
                              f"first: the job's status is {128 + signal.SIGSEGV}"]
    assert stops(actions) == [signal.SIGTERM]


def test_a_frozen_rank_is_named_when_the_wait_runs_out_and_its_teardown_does_not_count():
    waiting, _ = run([Exited(1, 101, 1, now=5.0, alive=(0, 2), report=("timeout", (0,))),
                      Exited(2, 102, 1, now=5.1, alive=(0,), report=("timeout", (0,)))])
    before, actions = run([Tick(5.0 + FOLLOWER_WAIT - 0.1, alive=(0,))], waiting)
    assert before == waiting and actions == []
    verdict, actions = run([Tick(5.0 + FOLLOWER_WAIT, alive=(0,))], waiting)
    assert lines(actions) == [
        "rank 0 did not answer: 2 ranks failed waiting for it or on losing it; it still runs: "
        "frozen, stopped, or cut off from them?", "stopping the other 1 rank"]
    assert stops(actions) == [signal.SIGTERM] and verdict.status == 1 and verdict.provisional
    # the frozen rank dies of the teardown's SIGKILL: that is not its own failure
    verdict, actions = run([Exited(0, 100, -signal.SIGKILL, now=8.0, alive=())], verdict)
    assert verdict.status == 1 and actions == []


def test_both_ends_of_a_dead_link_name_the_link():
    _, actions = run([
        Exited(0, 100, 1, now=1.0, alive=(1,), report=(f"rank 1: {LINK_DOWN}", (1,))),
        Exited(1, 101, 1, now=1.5, alive=(), report=("lost rank 0", (0,))),
        AllExited(now=1.6),
    ])
    assert lines(actions)[-1].startswith("the link between rank 0 and rank 1 failed")
    assert not stops(actions)  # every rank ended by itself


def test_signals_to_tbrun_are_forwarded_then_escalated():
    verdict, actions = run([Signalled(signal.SIGINT, now=1.0, alive=(0, 1)),
                            Exited(0, 100, -signal.SIGINT, now=1.1, alive=(1,)),
                            Signalled(signal.SIGTERM, now=1.2, alive=(1,))])
    assert verdict.status == 128 + signal.SIGINT
    assert lines(actions) == ["got SIGINT; forwarding SIGINT to 2 ranks",
                              "got SIGTERM again; killing every rank now"]
    assert stops(actions) == [signal.SIGINT] and isinstance(actions[-1], KillNow)


def test_timeout_stops_a_job_that_nothing_else_stopped():
    verdict = Verdict(NAMES, timeout=10.0, started=100.0)
    assert verdict.deadline == 110.0
    verdict, actions = run([Tick(109.0, alive=(0, 1))], verdict)
    assert actions == [] and verdict.status is None
    verdict, actions = run([Tick(110.0, alive=(0, 1))], verdict)
    assert verdict.status == TIMEOUT_STATUS and stops(actions) == [signal.SIGTERM]
    assert lines(actions) == ["job exceeded --timeout 10 s; stopping 2 ranks"]
    assert verdict.deadline is None


def test_timeout_also_ends_a_followers_wait_and_not_a_decided_failure():
    decided, _ = run([Exited(0, 100, 2, now=101.0, alive=(1,))],
                     Verdict(NAMES, timeout=10.0, started=100.0))
    assert decided.deadline is None
    waiting, _ = run([Exited(1, 101, 1, now=109.5, alive=(0,), report=("timeout", (0,)))],
                     Verdict(NAMES, timeout=10.0, started=100.0))
    assert waiting.deadline == 110.0  # before the follower's own wait ends
    verdict, _ = run([Tick(110.0, alive=(0,))], waiting)
    assert verdict.status == TIMEOUT_STATUS


def test_a_closed_stdout_stops_the_job_with_141_unless_a_failure_already_does():
    verdict, actions = run([StdoutClosed(now=1.0, alive=(0, 1))])
    assert verdict.status == STDOUT_CLOSED_STATUS and stops(actions) == [signal.SIGTERM]
    ended, actions = run([StdoutClosed(now=1.0, alive=())])
    assert ended.status == STDOUT_CLOSED_STATUS and not stops(actions)
    failed, _ = run([Exited(0, 100, 4, now=0.5, alive=(1,))])
    verdict, actions = run([StdoutClosed(now=1.0, alive=(1,))], failed)
    assert verdict.status == 4 and actions == []
    # a follower still waiting keeps its provisional status and may still be overruled
    waiting, _ = run([Exited(1, 101, 1, now=0.5, alive=(0,), report=("lost", (0,)))])
    verdict, _ = run([StdoutClosed(now=1.0, alive=(0,)),
                      Exited(0, 100, 9, now=1.1, alive=())], waiting)
    assert verdict.status == 9


def test_a_launchers_failure_is_marked_for_its_caller_to_explain():
    verdict, actions = run([Exited(-1, 50, 7, now=1.0, alive=(), launcher=True)])
    assert verdict.launcher_failed and verdict.status == 7 and lines(actions) == []
    verdict, _ = run([Signalled(signal.SIGTERM, now=0.5, alive=(-1,)),
                      Exited(-1, 50, 143, now=1.0, alive=(), launcher=True)])
    assert not verdict.launcher_failed and verdict.status == 128 + signal.SIGTERM


def dumps(actions):
    return [a.reason for a in actions if isinstance(a, Dump)]


def test_the_ranks_dumps_are_gathered_before_a_failing_job_is_stopped_and_only_then():
    _, actions = run([Exited(1, 101, 3, now=1.0, alive=(0, 2))])
    assert dumps(actions) == ["rank 1 failed"]
    assert [type(a) for a in actions] == [Log, Dump, Stop]  # asked before they are stopped
    waiting, _ = run([Exited(1, 101, 1, now=5.0, alive=(0,), report=("timeout", (0,)))])
    _, actions = run([Tick(5.0 + FOLLOWER_WAIT, alive=(0,))], waiting)
    assert dumps(actions) == ["rank 1 failed because of peers"]
    _, actions = run([AllExited(now=5.5)], waiting)  # the failure dumps they sent are read
    assert dumps(actions) == ["ranks failed because of peers"]
    _, actions = run([Tick(110.0, alive=(0, 1))], Verdict(NAMES, timeout=10.0, started=100.0))
    assert dumps(actions) == ["the job exceeded --timeout 10 s"]
    for event in (Signalled(signal.SIGINT, now=1.0, alive=(0, 1)),
                  StdoutClosed(now=1.0, alive=(0, 1))):
        assert dumps(run([event])[1]) == []  # stopped on purpose: nothing to explain


# --- --keep-going: tbrun declares failed ranks, and the job goes on ---------------------------

KEEP_GOING = Verdict(NAMES, timeout=10.0, started=0.0, keep_going=True)


def test_keep_going_declares_each_death_and_ends_with_the_first_failures_status():
    verdict, actions = run([
        Exited(1, 101, -signal.SIGKILL, now=1.0, alive=(0, 2)),
        Exited(2, 102, 3, now=2.0, alive=(0,), report=("lost rank 1", (1,))),
        Tick(now=5.0, alive=(0,)),  # the job goes on: no teardown before --timeout
        Exited(0, 100, -signal.SIGKILL, now=6.0, alive=(), report=("lost rank 1", (1,))),
        AllExited(now=6.1),
        AllExited(now=6.2),  # told again while the pipes drain: said once
    ], KEEP_GOING)
    assert lines(actions) == [
        "rank 1 (pid 101) was killed by signal 9 (SIGKILL); the job goes on without it "
        "(--keep-going): 2 ranks left",
        "rank 2 (pid 102) exited with status 3, failing because of rank 1 (lost rank 1); the "
        "job goes on without it (--keep-going): 1 rank left",
        # killed later: the peers it reported, it had survived (RankFailedError, shrink)
        "rank 0 (pid 100) was killed by signal 9 (SIGKILL); it was the last rank running",
        "3 ranks failed (rank 1, rank 2, rank 0); 0 ranks went on to the end; the job's "
        "status is 137, the first failure's"]
    assert [a for a in actions if isinstance(a, Declare)] == [
        Declare(1, (1,)), Declare(2, (1, 2)), Declare(3, (0, 1, 2))]
    # each failed rank's group goes with it
    assert [a for a in actions if isinstance(a, KillRank)] == [KillRank(1), KillRank(2),
                                                               KillRank(0)]
    assert not stops(actions) and verdict.status == 128 + signal.SIGKILL
    assert [a.failed for a in actions if isinstance(a, Dump)] == [(0, 1, 2)]  # once, at the end


def test_keep_going_still_ends_the_whole_job_on_timeout_and_signals():
    verdict, actions = run([
        Exited(1, 101, 2, now=1.0, alive=(0, 2)),
        Tick(now=10.0, alive=(0, 2)),
        Exited(0, 100, -signal.SIGTERM, now=10.1, alive=(2,)),  # the teardown's: not declared
        AllExited(now=10.2),
    ], KEEP_GOING)
    assert verdict.status == TIMEOUT_STATUS and stops(actions) == [signal.SIGTERM]
    assert [a.ranks for a in actions if isinstance(a, Declare)] == [(1,)]
    assert lines(actions)[-1] == "1 rank failed (rank 1) before the job was stopped"
    assert [a.failed for a in actions if isinstance(a, Dump)] == [()]  # the teardown's only
    verdict, actions = run([Signalled(signal.SIGINT, now=1.0, alive=(0, 1, 2))], KEEP_GOING)
    assert verdict.status == 130 and stops(actions) == [signal.SIGINT]


def test_a_suspect_is_checked_once_killed_if_frozen_and_left_alone_if_alive():
    verdict, actions = run([
        Suspected(0, (1, 2), now=1.0, alive=(0, 1, 2)),
        Suspected(2, (1,), now=1.1, alive=(0, 1, 2)),  # already being checked
        Probed(2, False, "it answered tbrun", now=1.2, alive=(0, 1, 2)),
        Probed(1, True, "it answered nothing in 1 s", now=2.0, alive=(0, 1, 2)),
        Suspected(0, (1,), now=2.1, alive=(0, 1, 2)),  # killed already: not again
        Exited(1, 101, -signal.SIGKILL, now=2.2, alive=(0, 2)),
    ], KEEP_GOING)
    assert [a for a in actions if isinstance(a, Probe)] == [Probe(0, (1, 2))]
    # killed when found frozen, then its group once its exit is seen
    assert [a for a in actions if isinstance(a, KillRank)] == [KillRank(1), KillRank(1)]
    assert lines(actions)[:2] == [
        "rank 2 was reported as frozen, but it answered tbrun: the report is not upheld; "
        "it goes on",
        "rank 1 is frozen (it answered nothing in 1 s); killing it for good (SIGKILL)"]
    assert [a.ranks for a in actions if isinstance(a, Declare)] == [(1,)]
    assert verdict.failed == {1} and not verdict.killed and not verdict.probing


def test_a_split_fails_the_higher_rank_of_the_pair_whichever_end_reports_first():
    """Two live ranks with no path left (NO_PATH): the higher is killed and declared, once,
    whichever end reports first; a pair with an end that ended already is no split."""
    for first, second in ((0, 2), (2, 0)):
        verdict, actions = run([
            Suspected(first, (second,), now=1.0, alive=(0, 1, 2), why=NO_PATH),
            Suspected(second, (first,), now=1.1, alive=(0, 1, 2), why=NO_PATH),
            Exited(2, 102, -signal.SIGKILL, now=1.2, alive=(0, 1)),
            Suspected(1, (2,), now=1.3, alive=(0, 1), why=NO_PATH),  # ended: no split
        ], KEEP_GOING)
        assert [a for a in actions if isinstance(a, KillRank)] == [KillRank(2), KillRank(2)]
        assert not [a for a in actions if isinstance(a, Probe)]
        assert lines(actions)[0] == (
            "rank 0 and rank 2 have no path left between them (a split, --keep-going): rank 2 "
            "is failed (the higher rank of the pair); killing it for good (SIGKILL)")
        assert verdict.failed == {2} and not verdict.killed
    verdict, actions = run([Suspected(0, (1,), now=1.0, alive=(0, 1), why=NO_PATH)],
                           Verdict({0: "rank 0", 1: "rank 1"}))  # not --keep-going
    assert actions == []
