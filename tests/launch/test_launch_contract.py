"""The environment tbrun gives every rank, and how ranks read it."""

import json
import os
import platform

import pytest

from tbcoll import TbcollError
from tbcoll.job.env import LaunchInfo, launch_info, worker_env
from tbcoll.job.topology import Layout

from ..conftest import REPO, tagged_lines, tbrun

CONTRACT = ["TBCOLL_RANK", "TBCOLL_SIZE", "TBCOLL_LOCAL_RANK", "TBCOLL_LOCAL_SIZE",
            "TBCOLL_NODE_RANK", "TBCOLL_BACKEND", "TBCOLL_STORE", "TBCOLL_TOKEN",
            "TBCOLL_HOSTFILE", "TBCOLL_TIMEOUT", "TBCOLL_JOB", "TBCOLL_SHM_NAMES", "RANK",
            "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
            "FROM_X", "HOME"]

PRINT_ENV = f"""
import json, os
import tbcoll
info = tbcoll.launch_info()
print(json.dumps({{"env": {{k: os.environ.get(k) for k in {CONTRACT!r}}},
                  "info": [info.rank, info.size, info.local_rank, info.backend, info.timeout]}}))
"""


def run_print_env(script, *flags, np=3, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(extra_env or {})
    p = tbrun("-np", np, *flags, script(PRINT_ENV), env=env)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    assert sorted(lines) == list(range(np))
    return {rank: json.loads(out[0]) for rank, out in lines.items()}


def test_every_rank_gets_the_contract(script):
    ranks = run_print_env(script, "-x", "FROM_X=hello", "-x", "HOME", "--backend", "tcp",
                          "--comm-timeout", "42")
    tokens = {r["env"]["TBCOLL_TOKEN"] for r in ranks.values()}
    assert len(tokens) == 1 and len(tokens.pop()) == 64
    jobs = {r["env"]["TBCOLL_JOB"] for r in ranks.values()}
    assert len(jobs) == 1 and len(jobs.pop()) == 16  # one random id for the whole job
    names = {r["env"]["TBCOLL_SHM_NAMES"] for r in ranks.values()}  # one folder, removed after
    assert len(names) == 1 and os.path.basename(names.pop()).startswith("tbrun-shm-")
    for rank, out in ranks.items():
        env = out["env"]
        assert env["TBCOLL_RANK"] == env["RANK"] == env["TBCOLL_LOCAL_RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank)
        assert env["TBCOLL_SIZE"] == env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["TBCOLL_LOCAL_SIZE"] == "3" and env["TBCOLL_NODE_RANK"] == "0"
        assert env["TBCOLL_BACKEND"] == "tcp" and env["TBCOLL_TIMEOUT"] == "42"
        host, port = env["TBCOLL_STORE"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["MASTER_PORT"] != port
        assert json.loads(env["TBCOLL_HOSTFILE"]) == {
            "hosts": [{"name": "localhost", "ranks": [0, 1, 2]}]}
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
        assert env["MKL_NUM_THREADS"] == "1"
        assert env["FROM_X"] == "hello" and env["HOME"] == os.environ["HOME"]
        assert out["info"] == [rank, 3, rank, "tcp", 42.0]


def test_an_exported_timeout_is_the_comm_timeout(script):
    """-x TBCOLL_TIMEOUT=S, as mpirun users pass variables, is not overwritten by the default."""
    ranks = run_print_env(script, "-x", "TBCOLL_TIMEOUT=7")
    assert {out["env"]["TBCOLL_TIMEOUT"] for out in ranks.values()} == {"7"}

def test_thread_limits_only_when_ranks_share_a_host_and_unset(script):
    alone = run_print_env(script, np=1)
    assert alone[0]["env"]["OMP_NUM_THREADS"] is None
    kept = run_print_env(script, np=2, extra_env={"OMP_NUM_THREADS": "2"})
    assert kept[0]["env"]["OMP_NUM_THREADS"] == "2"
    assert kept[0]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    exported = run_print_env(script, "-x", "MKL_NUM_THREADS=4", np=2)
    assert exported[1]["env"]["MKL_NUM_THREADS"] == "4"


def test_flags_fall_back_to_tbrun_environment_variables(script):
    ranks = run_print_env(script, np=2, extra_env={"TBRUN_BACKEND": "tcp"})
    assert {r["env"]["TBCOLL_BACKEND"] for r in ranks.values()} == {"tcp"}


def test_script_arguments_pass_through_untouched(script):
    path = script("import sys; print(sys.argv[1:])")
    p = tbrun("-np", 2, path, "-n", "3", "--timeout", "x y")
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {r: ["['-n', '3', '--timeout', 'x y']"] for r in (0, 1)}


def test_executable_and_module_programs():
    p = tbrun("-np", 2, "echo", "hi there")
    assert p.returncode == 0 and tagged_lines(p.stdout) == {0: ["hi there"], 1: ["hi there"]}
    p = tbrun("-np", 2, "-m", "platform")
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {0: [platform.platform()], 1: [platform.platform()]}


def test_dry_run_prints_and_starts_nothing(script, tmp_path):
    marker = tmp_path / "started"
    path = script(f"open({str(marker)!r}, 'w').close()")
    p = tbrun("-np", 2, "--dry-run", "-x", "FOO=bar", path, "arg")
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    for rank in (0, 1):
        assert f"rank {rank}: " in p.stdout
        assert f"TBCOLL_RANK={rank}" in p.stdout
    assert p.stdout.count(f"{path} arg") == 2
    assert p.stdout.count("FOO=bar") == 2 and "TBCOLL_TOKEN=<made at launch>" in p.stdout


def test_hello_example():
    p = tbrun("-np", 4, REPO / "examples" / "hello.py")
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    for rank in range(4):
        assert any(f"hello from rank {rank} of 4" in line for line in lines[rank])
    assert any("start skew across 4 ranks" in line for line in lines[0])


def test_launch_info_round_trip_and_errors():
    info = LaunchInfo(rank=1, size=2, local_rank=1, local_size=2, node_rank=0, backend="shm",
                      store=("::1", 5000), token="t", topology=Layout(()), timeout=7.5,
                      job="1a2b")
    env = worker_env(info, ("127.0.0.1", 6000))
    assert env["TBCOLL_STORE"] == "[::1]:5000" and env["TBCOLL_JOB"] == "1a2b"
    assert launch_info(env) == info
    assert launch_info({}) is None
    with pytest.raises(TbcollError, match="TBCOLL_RANK=5 is outside 0..1"):
        launch_info({**env, "TBCOLL_RANK": "5"})
    with pytest.raises(TbcollError, match="TBCOLL_SIZE='two' is not an integer"):
        launch_info({**env, "TBCOLL_SIZE": "two"})
    with pytest.raises(TbcollError, match="TBCOLL_BACKEND='udp'"):
        launch_info({**env, "TBCOLL_BACKEND": "udp"})
    with pytest.raises(TbcollError, match="TBCOLL_STORE='nohost' is not host:port"):
        launch_info({**env, "TBCOLL_STORE": "nohost"})


def test_torchrun_names_under_every_launch(script):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_* also under --backend mpi (from
    MPI's own variables); a user's MASTER_ADDR/MASTER_PORT win (-x, --master-*)."""
    path = script("""
        import json, os
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")
        print(json.dumps({n: os.environ.get(n) for n in names}))
    """)
    for backend in ("shm", "mpi"):
        p = tbrun("-np", 2, "--backend", backend, "-x", "MASTER_PORT=29555", path, timeout=60)
        assert p.returncode == 0, p.stderr
        for rank, (line,) in tagged_lines(p.stdout).items():
            assert json.loads(line) == {
                "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    p = tbrun("-np", 1, "--master-addr", "10.9.8.7", "--master-port", 29600,
              "-x", "MASTER_PORT=1", path)
    env = json.loads(tagged_lines(p.stdout)[0][0])
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.9.8.7", "29600")  # the flag wins
