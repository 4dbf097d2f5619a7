"""When a job hangs or diverges, tbrun says where every rank was (tbcoll.recorder,
tbcoll.dumps, tbcoll.launch.postmortem), and --trace writes a timeline (tbcoll.trace)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import TBRUN, tbrun, wait_for

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
    assert f"dumps in {tmp_path / 'dumps' / 'dump-1'}" in said[0]
    # (a rank that had not failed yet when asked is still waiting: "(for ... s)")
    where = labels(said)
    assert {r: where[r].split(" (")[0] for r in range(4)} == {
        0: "all_reduce #51 float32 4096 B at job.py:10", 2: "barrier #51 at job.py:8",
        1: "all_reduce #51 float32 4096 B at job.py:10",
        3: "all_reduce #51 float32 4096 B at job.py:10"}
    assert said[-1] == "tbrun:   -- rank 2 left the common path (the others are in all_reduce #51)"
    dumps = {r: json.loads((tmp_path / "dumps" / "dump-1" / f"rank-{r}.json").read_text())
             for r in range(4)}
    calls = dumps[0]["communicators"][0]["calls"]
    assert [c["seq"] for c in calls] == list(range(1, 51))
    assert {c["collective"] for c in calls} == {"all_reduce"}
    if backend == "shm":  # the one-call path: no times, no size
        assert all(c["start"] is None and c["end"] is None and c["bytes"] is None
                   and c["dtype"] == "float32" for c in calls)
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
    stacks = (tmp_path / "dump-1" / "stacks.txt").read_text()
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
        wait_for(lambda: (tmp_path / "dumps" / "dump-1" / "stacks.txt").exists(), 30,
                 "the dumps")
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.count("done") == 3
    assert "asked with SIGUSR1" in err
    for rank in range(3):
        dump = json.loads((tmp_path / "dumps" / "dump-1" / f"rank-{rank}.json").read_text())
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
    summary = subprocess.run([sys.executable, "-m", "tbcoll.trace", "summary", str(path)],
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
    p = subprocess.run([sys.executable, "-m", "tbcoll.trace", "summary", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "not a trace that tbrun --trace wrote" in p.stderr


def test_the_recorder_keeps_the_last_calls_and_can_be_turned_off(script):
    path = script("""
        import os, numpy as np, tbcoll
        from tbcoll.dumps import snapshot
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
    bad = run("many")
    assert bad.returncode == 1 and "TBCOLL_RECORD='many'" in bad.stderr


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
