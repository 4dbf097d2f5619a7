"""The soft limit of open files: macOS's default is 256, and tbrun holds a few descriptors a
rank. tbrun raises the soft limit to the hard one (as mpirun does), and its ranks inherit
it; where the hard limit is too low for the job, tbrun says so before starting anything."""

import resource
import subprocess

from ..conftest import TBRUN, tagged_lines


def _limited(soft: int, hard: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit


def test_tbrun_and_its_ranks_raise_the_soft_limit_to_the_hard_one(script):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    path = script("import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    p = subprocess.run([TBRUN, "-np", "2", str(path)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL, preexec_fn=_limited(256, hard))
    assert p.returncode == 0, p.stderr
    wanted = str(hard if hard != resource.RLIM_INFINITY else 10240)
    assert tagged_lines(p.stdout) == {0: [wanted], 1: [wanted]}, p.stdout + p.stderr


def test_a_job_too_large_for_the_hard_limit_is_refused_with_the_fix(script):
    path = script("print('started')\n")
    p = subprocess.run([TBRUN, "-np", "60", str(path)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL, preexec_fn=_limited(256, 256))
    assert p.returncode != 0 and "started" not in p.stdout
    assert "60 ranks need about 304 open files in tbrun, and the limit is 256" in p.stderr
    assert "ulimit -n 304" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
