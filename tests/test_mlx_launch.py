"""tbrun --backend mlx gives ranks what mlx.launch gives them, so unmodified MLX scripts run."""

import json

import pytest

from .conftest import tagged_lines, tbrun

MLX_SCRIPT = """
import json
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
