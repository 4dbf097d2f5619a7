"""When a job hangs or diverges, tbrun says where every rank was (tbcoll.observability.recorder,
tbcoll.observability.dumps, tbcoll.launch.postmortem), and --trace writes a timeline
(tbcoll.observability.trace)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import TBRUN, tbrun, wait_for

DESYNC = """
import numpy as np, tbcoll
comm = tbcoll.init()
x = np.ones(1024, np.float32)
for step in range(50):
    comm.all_reduce(x)
if comm.rank == 2:
    comm.barrier()
else:
    comm.all_reduce(x)
"""


def diagnosis(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.startswith("tbrun:")]
    start = next(i for i, line in enumerate(lines) if "where each rank was" in line)
    return lines[start:]


def dumps_folder(stderr: str) -> str:
    """The folder tbrun said it wrote the dumps in."""
    line = next(line for line in stderr.splitlines() if "dumps in " in line)
    return line.split("dumps in ", 1)[1].rstrip("):")


def labels(said: list[str]) -> dict[int, str]:
    """rank -> what the diagnosis says of it ("tbrun:   ranks 0, 1: all_reduce ...")."""
    found = {}
    for line in said:
        ranks, colon, label = line.removeprefix("tbrun:   ").partition(": ")
        if colon and ranks.startswith("rank"):
            found.update((int(r), label) for r in ranks.split(" ", 1)[1].split(", "))
    return found


# tcp's all_reduce by an algorithm (its 4 KB would take its one-call native path, as shm's)
@pytest.mark.parametrize("backend, algorithm", [("shm", ""), ("tcp", "all_reduce=rd")])
def test_a_rank_that_takes_another_branch_is_named_with_its_line(script, tmp_path, backend,
                                                                 algorithm):
    started = time.monotonic()
    p = tbrun("-np", 4, "--backend", backend, "--comm-timeout", 10, "--dump-dir",
              tmp_path / "dumps", "-x", f"TBCOLL_ALGO={algorithm}", script(DESYNC), timeout=60,
              cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert time.monotonic() - started < 10 + 5
    said = diagnosis(p.stderr)
    folder = Path(dumps_folder(said[0]))
    assert folder.name == "dump-1" and folder.parent.parent == tmp_path / "dumps"
    # (a rank that had not failed yet when asked is still waiting: "(for ... s)")
    where = labels(said)
    assert {r: where[r].split(" (")[0] for r in range(4)} == {
        0: "all_reduce #51 float32 4096 B at job.py:10", 2: "barrier #51 at job.py:8",
        1: "all_reduce #51 float32 4096 B at job.py:10",
        3: "all_reduce #51 float32 4096 B at job.py:10"}
    assert said[-1] == "tbrun:   -- rank 2 left the common path (the others are in all_reduce #51)"
    dumps = {r: json.loads((folder / f"rank-{r}.json").read_text())
             for r in range(4)}
    calls = dumps[0]["communicators"][0]["calls"]
    assert [c["seq"] for c in calls] == list(range(1, 51))
    assert {c["collective"] for c in calls} == {"all_reduce"}
    if backend == "shm":  # the lane (one C call): no times
        assert all(c["start"] is None and c["end"] is None and c["bytes"] == 4096
                   and c["dtype"] == "float32" and c["algorithm"] == "native" for c in calls)
    else:
        assert all(c["start"] <= c["end"] and c["bytes"] == 4096 for c in calls)
        assert [c["end"] for c in calls] == sorted(c["end"] for c in calls)


HANG = """
import os, signal, sys, time, numpy as np, tbcoll
comm = tbcoll.init()
for step in range(3):
    comm.all_reduce(np.ones(4))
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
comm.all_reduce(np.ones(4))
"""


def test_a_stopped_rank_shows_its_stack(script, tmp_path):
    started = time.monotonic()
    p = tbrun("-np", 3, "--comm-timeout", 3, "--dump-dir", tmp_path, script(HANG), timeout=60,
              cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert time.monotonic() - started < 3 + 10
    said = diagnosis(p.stderr)
    where = labels(said)
    assert where[0] == where[2] == "all_reduce #4 float64 32 B at job.py:9 (failed)"
    # stopped at line 7, it may answer before it is back in the sleep of line 8
    assert where[1] in ("not in a call (3 made), at job.py:7",
                        "not in a call (3 made), at job.py:8")
    assert said[-1] == "tbrun:   -- rank 1 did not enter all_reduce #4 (ranks 0, 2 did)"
    stacks = (Path(dumps_folder(p.stderr)) / "stacks.txt").read_text()
    rank1 = stacks[stacks.index("=== rank 1"):stacks.index("=== rank 2")]
    assert "job.py:8 in <module>: time.sleep(60)" in rank1 or \
        "job.py:7 in <module>: os.kill(os.getpid(), signal.SIGSTOP)" in rank1


HEALTHY = """
import os, sys, time, numpy as np, tbcoll
comm = tbcoll.init()
open(os.path.join(sys.argv[1], f"{comm.rank}.up"), "w").close()
go = os.path.join(sys.argv[1], "go")
while not comm.all_reduce(np.array([os.path.exists(go)], np.int32))[0]:  # all stop together
    time.sleep(0.001)
comm.barrier()
print("done")
"""


def test_a_dump_asked_for_with_sigusr1_leaves_the_job_running(script, tmp_path):
    proc = subprocess.Popen([TBRUN, "-np", "3", "--dump-dir", str(tmp_path / "dumps"),
                             str(script(HEALTHY)), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.up"))) == 3, 30, "the ranks to start")
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: list(tmp_path.glob("dumps/*/dump-1/stacks.txt")), 30,
                 "the dumps")
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.count("done") == 3
    assert "asked with SIGUSR1" in err
    for rank in range(3):
        (folder,) = tmp_path.glob("dumps/*/dump-1")
        dump = json.loads((folder / f"rank-{rank}.json").read_text())
        assert dump["rank"] == rank and dump["reason"] == "asked with SIGUSR1"
        assert any(s["main"] for s in dump["stacks"])


TRACED = """
import numpy as np, tbcoll
comm = tbcoll.init()
sub = comm.split(comm.rank % 2)
for step in range(20):
    comm.all_reduce(np.ones(256, np.float32))
    sub.broadcast(np.ones(8), root=0)
"""


def test_trace_holds_every_rank_and_the_summary_adds_up(script, tmp_path):
    path = tmp_path / "run.json"
    p = tbrun("-np", 4, "--trace", path, script(TRACED), timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    # per rank: split's all_gather, 20 all_reduce, 20 broadcasts
    assert sorted(e["name"] for e in events if e["pid"] == 3) == (
        ["all_gather"] + ["all_reduce"] * 20 + ["broadcast"] * 20)
    assert {e["args"]["site"] for e in events if e["name"] == "all_reduce"} == {"job.py:6"}
    summary = subprocess.run([sys.executable, "-m", "tbcoll.observability.trace", "summary",
                              str(path)],
                             capture_output=True, text=True, timeout=30)
    assert summary.returncode == 0, summary.stderr
    rows = {line.split()[0]: line.split() for line in summary.stdout.splitlines()[1:]}
    reduce_calls = [e for e in events if e["name"] == "all_reduce"]
    assert rows["all_reduce"][1] == "20" and rows["broadcast"][1] == "40"
    # the total: each call's mean duration over its 4 ranks, summed
    total = sum(e["dur"] for e in reduce_calls) / 4 / 1e3
    assert float(rows["all_reduce"][2]) == pytest.approx(total, abs=2e-3)


def test_trace_summary_refuses_what_is_not_a_trace(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    p = subprocess.run([sys.executable, "-m", "tbcoll.observability.trace", "summary", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "not a trace that tbrun --trace wrote" in p.stderr


def test_the_recorder_keeps_the_last_calls_and_can_be_turned_off(script):
    path = script("""
        import os, numpy as np, tbcoll
        from tbcoll.observability.dumps import snapshot
        comm = tbcoll.init()
        for i in range(10):
            comm.all_reduce(np.full(3, i))
        calls = snapshot("test")["communicators"][0]["calls"]
        print([(c["seq"], c["bytes"], c["collective"]) for c in calls])
    """)
    def run(record):
        env = {**os.environ, "TBCOLL_RECORD": record}
        return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              env=env, timeout=30)
    assert run("4").stdout.strip() == str([(s, 24, "all_reduce") for s in (7, 8, 9, 10)])
    assert run("0").stdout.strip() == "[]"
    for value in ("many", "²", "100000000", "99999999999"):
        bad = run(value)
        assert bad.returncode == 1 and f"TBCOLL_RECORD={value!r}: give" in bad.stderr, value
        assert "MemoryError" not in bad.stderr and "ValueError" not in bad.stderr, value
    assert "a whole number from 0 to 100000" in run("100001").stderr


def test_a_rank_stuck_in_c_code_that_holds_pythons_lock_still_shows_its_stack(script, tmp_path):
    path = script("""
        import ctypes, numpy as np, tbcoll
        comm = tbcoll.init()
        comm.all_reduce(np.ones(4))
        if comm.rank == 1:
            ctypes.PyDLL(None).sleep(30)  # C code that keeps Python's lock: no dump thread
        comm.all_reduce(np.ones(4))
    """)
    p = tbrun("-np", 3, "--comm-timeout", 2, "--dump-dir", tmp_path, path, timeout=60,
              cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "rank 1 did not answer in 3 s: asked with SIGUSR2" in p.stderr
    # (the signal cuts the sleep short: the rank may then answer late, from wherever it got
    # to, or not at all; either way the diagnosis names it)
    assert 1 in labels(diagnosis(p.stderr))
    # faulthandler wrote its stack from the signal handler, lock or not
    assert f'[1]   File "{path}", line 6 in <module>' in p.stdout + p.stderr


STREAMED = """
import os, signal, time, numpy as np, tbcoll
comm = tbcoll.init()
for step in range(1000):
    comm.all_reduce(np.ones(4, np.float32))
if comm.rank == 1:
    time.sleep(2)  # its calls go to tbrun as it runs, a chunk at a time
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_trace_streams_while_the_job_runs_so_a_killed_rank_keeps_its_calls(script, tmp_path):
    """The ranks send their calls in bounded chunks as they go (TBCOLL_TRACE_CHUNK calls
    each), and tbrun writes the trace whole from them: here 16 chunks a rank, and rank 1,
    killed, loses none of the calls it made a while before."""
    path = tmp_path / "run.json"
    p = tbrun("-np", 2, "--trace", path, "-x", "TBCOLL_TRACE_CHUNK=64", script(STREAMED),
              timeout=60, cwd=tmp_path)
    assert p.returncode == 137, p.stderr
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        assert [e["args"]["seq"] for e in mine] == list(range(1, 1001)), rank
        assert {e["name"] for e in mine} == {"all_reduce"}
    assert "2000 calls of 2 ranks" in p.stderr
    assert "rank 1's calls may end early (it did not exit normally)" in p.stderr


def test_a_dump_that_cannot_be_written_still_says_where_each_rank_was(script, tmp_path):
    """The dump folder turns into a file while the job runs: one line says so, the screen
    is shown, and the job's status is the failed rank's. (No traceback of tbrun's own, which
    would be untagged: rank 1 may print one, "[1] Traceback", of the PeerLostError it gets
    when it sees rank 0 gone before tbrun stops it. That is the rule for wrapped ranks, as on
    macOS or under the lane, where tbrun learns of rank 0's end through its wrapper.)"""
    dumps = tmp_path / "dumps"
    path = script(f"""
        import os, shutil, sys, tbcoll
        comm = tbcoll.init()
        comm.barrier()
        if comm.rank == 0:
            for entry in os.scandir({str(dumps)!r}):  # the job's own folder, made at start
                shutil.rmtree(entry.path)
                open(entry.path, "w").close()
            open(os.path.join({str(dumps)!r}, "dump-1"), "w").close()
            sys.exit(3)
        comm.barrier()
    """)
    p = tbrun("-np", 2, "--comm-timeout", 30, "--dump-dir", dumps, path, timeout=60,
              cwd=tmp_path)
    assert p.returncode == 3, p.stderr
    assert not [line for line in p.stderr.splitlines() if line.startswith("Traceback")]
    assert "tbrun: cannot write the dumps" in p.stderr
    assert "where each rank was" in p.stderr and "rank 1: barrier #2" in p.stderr


def test_a_trace_that_cannot_be_written_at_the_end_leaves_the_status_alone(script, tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    path = script(f"""
        import shutil, tbcoll
        comm = tbcoll.init()
        comm.barrier()
        if comm.rank == 0:
            shutil.rmtree({str(folder)!r})
    """)
    p = tbrun("-np", 2, "--trace", folder / "t.json", path, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    said = [line for line in p.stderr.splitlines() if "--trace" in line]
    assert len(said) == 1 and f"cannot write {folder / 't.json'}" in said[0], p.stderr


FAILS = """
import sys, tbcoll
comm = tbcoll.init()
comm.barrier()
if comm.rank == 0:
    sys.exit(3)
comm.barrier()  # asked for its dump while it waits here
"""


def test_each_job_writes_its_dumps_in_a_new_folder_and_follows_no_planted_link(script,
                                                                               tmp_path):
    """A second job with the same --dump-dir writes apart from the first; a link planted
    where the old naming wrote (dump-1) is not followed."""
    dumps, victim = tmp_path / "dumps", tmp_path / "victim"
    dumps.mkdir(mode=0o700)
    victim.mkdir()
    (dumps / "dump-1").symlink_to(victim)
    first = tbrun("-np", 2, "--dump-dir", dumps, script(FAILS), timeout=60, cwd=tmp_path)
    second = tbrun("-np", 2, "--dump-dir", dumps, script(FAILS), timeout=60, cwd=tmp_path)
    assert first.returncode == second.returncode == 3, (first.stderr, second.stderr)
    folders = {dumps_folder(first.stderr), dumps_folder(second.stderr)}
    assert len(folders) == 2
    for folder in folders:
        assert os.path.dirname(os.path.dirname(folder)) == str(dumps)
        assert sorted(os.listdir(folder)) == ["rank-1.json", "stacks.txt"]
        assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.listdir(victim) == []


@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_dump_dir_another_user_could_plant_links_in_is_refused(script, tmp_path, how):
    dumps, victim = tmp_path / "dumps", tmp_path / "victim.txt"
    dumps.mkdir()
    victim.write_text("precious")
    (dumps / "dump-1").mkdir()
    (dumps / "dump-1" / "stacks.txt").symlink_to(victim)
    if how == "writable by others":
        dumps.chmod(0o777)
    else:
        os.chown(dumps, 65534, 65534)
    p = tbrun("-np", 2, "--dump-dir", dumps, script(FAILS), timeout=60, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"tbrun: error: --dump-dir {dumps}: ") and how in p.stderr
    assert len(p.stderr.splitlines()) == 1
    assert victim.read_text() == "precious"
