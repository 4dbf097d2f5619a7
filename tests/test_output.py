"""Rank output: line-buffered, tagged, stdout and stderr kept apart, optional files."""

from .conftest import tagged_lines, tbrun

TWO_STREAMS = """
import os, sys
r = os.environ["RANK"]
print(f"out {r}")
print(f"err {r}", file=sys.stderr)
sys.stdout.write(f"unfinished {r}")
"""


def test_stdout_and_stderr_tagged_and_apart(script):
    p = tbrun("-np", 3, script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {r: [f"out {r}", f"unfinished {r}"] for r in range(3)}
    assert tagged_lines(p.stderr) == {r: [f"err {r}"] for r in range(3)}


def test_no_tag_output(script):
    p = tbrun("-np", 2, "--no-tag-output", script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["out 0", "out 1", "unfinished 0", "unfinished 1"]
    assert sorted(p.stderr.splitlines()) == ["err 0", "err 1"]


def test_long_lines_of_ranks_never_interleave(script):
    path = script("""
        import os
        r = os.environ["RANK"]
        for _ in range(300):
            print(r * 3000)
    """)
    p = tbrun("-np", 4, path)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    assert {r: len(v) for r, v in lines.items()} == {r: 300 for r in range(4)}
    for rank, rank_lines in lines.items():
        assert set(rank_lines) == {str(rank) * 3000}


def test_output_dir_holds_untagged_files(script, tmp_path):
    out_dir = tmp_path / "logs"
    p = tbrun("-np", 2, "--output-dir", out_dir, script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert "[0] out 0" in p.stdout  # the terminal still gets the output
    for r in range(2):
        assert (out_dir / f"rank-{r}.out").read_text() == f"out {r}\nunfinished {r}"
        assert (out_dir / f"rank-{r}.err").read_text() == f"err {r}\n"
