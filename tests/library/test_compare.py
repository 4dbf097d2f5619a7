"""benchmarks/compare.py end to end on a tiny sweep: every system's job runs and is checked."""

import json
import subprocess
import sys

from ..conftest import REPO


def test_compare_tbcoll_mpi_and_mlx(tmp_path):
    plot, rows = tmp_path / "plot.png", tmp_path / "rows.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare.py"), "-np", "2", "-b", "8",
         "-e", "2K", "-f", "16", "-n", "3", "-w", "1", "--rounds", "1",
         "--systems", "tbcoll-shm,tbcoll-tcp,mpi4py,mlx", "--plot", str(plot),
         "--json", str(rows)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| size | mlx | mpi4py | tbcoll-shm default | tbcoll-tcp default |" in p.stdout
    lines = [line for line in p.stdout.splitlines() if line.startswith("| 8 |")]
    assert len(lines) == 1 and lines[0].count("|") == 9  # size, 4 systems, best, 2 ratios
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(rows.read_text())
    assert {r["system"] for r in data} == {"tbcoll-shm", "tbcoll-tcp", "mpi4py", "mlx"}
    assert all(r["wrong"] == 0 and r["ranks"] == 2 for r in data)


def test_compare_buffers_from_comm_empty():
    """tbcoll-shm-empty(-out): the same job's shm communicators on comm.empty's buffers (all,
    or only out=) beside one on numpy's."""
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare.py"), "-np", "2", "-b", "2M",
         "-e", "2M", "-n", "2", "-w", "1", "--rounds", "1", "--collective", "all_gather",
         "--systems", "tbcoll-shm,tbcoll-shm-empty,tbcoll-shm-empty-out", "--interleave"],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("| size | tbcoll-shm default | tbcoll-shm-empty default | tbcoll-shm-empty-out "
            "default |") in p.stdout
