"""tbrun --backend mlx gives ranks what mlx.launch gives them, so unmodified MLX scripts run."""

import json
import math
import time

import pytest

from ..conftest import tagged_lines, tbrun

MLX_SCRIPT = """
import json
import math
import time
import mlx.core as mx

group = mx.distributed.init()
rank, size = group.rank(), group.size()
total = mx.distributed.all_sum(mx.ones(3) * (rank + 1))
gathered = mx.distributed.all_gather(mx.array([rank * 10]))
got = None
if rank == 0:
    mx.eval(mx.distributed.send(mx.array([42.0, 43.0]), 1))
elif rank == 1:
    got = mx.distributed.recv_like(mx.zeros(2), 0)
    mx.eval(got)
mx.eval(total, gathered)
print(json.dumps({"rank": rank, "size": size, "total": total.tolist(),
                  "gathered": gathered.tolist(), "got": None if got is None else got.tolist()}))
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_an_unmodified_mlx_script_runs_under_tbrun(script, np_):
    pytest.importorskip("mlx.core")
    p = tbrun("-np", np_, "--backend", "mlx", script(MLX_SCRIPT), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    results = {r: json.loads(lines[0]) for r, lines in tagged_lines(p.stdout).items()}
    assert sorted(results) == list(range(np_))
    for rank, result in results.items():
        assert result["size"] == np_
        assert result["total"] == [np_ * (np_ + 1) / 2] * 3
        assert result["gathered"] == [10 * r for r in range(np_)]
        assert result["got"] == ([42.0, 43.0] if rank == 1 else None)


def test_dry_run_shows_mlx_variables():
    p = tbrun("-np", 2, "--backend", "mlx", "--dry-run", "true", timeout=30)
    assert p.returncode == 0
    assert "MLX_RANK=0" in p.stdout and "MLX_RANK=1" in p.stdout
    assert p.stdout.count("MLX_HOSTFILE=<job directory>/MLX_HOSTFILE.json") == 2


def test_tbcoll_over_mlx_names_a_peer_that_never_comes(script):
    """MLX would wait forever; tbcoll's watchdog ends the rank after TBCOLL_TIMEOUT."""
    pytest.importorskip("mlx.core")
    start = time.monotonic()
    p = tbrun("-np", 2, "--backend", "mlx", "--comm-timeout", 2, script(
        "import time\nimport mlx.core as mx\nimport tbcoll\n"
        "comm = tbcoll.init()\n"
        "if comm.rank == 1:\n    time.sleep(60)\n"
        "comm.all_reduce(mx.ones(4), algorithm=\"native\")\n"), timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "rank 0: all_reduce has waited more than 2 s (TBCOLL_TIMEOUT)" in p.stderr
    assert time.monotonic() - start < 20


def test_tbcoll_over_mlx_uses_mlx_collectives_and_tcp_for_the_rest(script):
    pytest.importorskip("mlx.core")
    p = tbrun("-np", 3, "--backend", "mlx", script("""
        import json
        import mlx.core as mx
        import tbcoll

        comm = tbcoll.init()
        x = mx.arange(6, dtype=mx.float32) + comm.rank
        pair = comm.split(comm.rank // 2)
        mlx = "native"  # MLX's own collectives, and what tbcoll adds on top of them
        print(json.dumps({
            "sum": comm.all_reduce(x, algorithm=mlx).tolist(),
            "prod": comm.all_reduce(mx.array([comm.rank + 2]), op="prod", algorithm=mlx).tolist(),
            "max_scatter": comm.reduce_scatter(x, op="max", algorithm=mlx).tolist(),
            "bcast": comm.broadcast(mx.array([-0.0, comm.rank]), root=2, algorithm=mlx).tolist(),
            "pair_sum": pair.all_reduce(mx.array([comm.rank])).tolist(),
            "gather": comm.all_gather(mx.array(comm.rank), algorithm=mlx).tolist(),
            "bf16": comm.all_reduce(mx.array([1.5], dtype=mx.bfloat16), algorithm=mlx).tolist(),
            "default": comm.all_reduce(x).tolist()}))
        """), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    results = {r: json.loads(lines[0]) for r, lines in tagged_lines(p.stdout).items()}
    for rank, r in results.items():
        assert r["sum"] == [3.0 * k + 3 for k in range(6)]
        assert r["prod"] == [2 * 3 * 4]
        assert r["max_scatter"] == [2.0 + 2 * rank, 3.0 + 2 * rank]
        assert r["bcast"] == [0.0, 2.0] and math.copysign(1, r["bcast"][0]) == -1  # bit-exact
        assert r["pair_sum"] == ([1] if rank < 2 else [2])
        assert r["gather"] == [0, 1, 2] and r["bf16"] == [4.5]
        assert r["default"] == r["sum"]  # tbcoll's rd over tcp beside MLX's ring backend
