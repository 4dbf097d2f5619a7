"""The namespace cluster (tests/harness/netns.py) that the multi-host tests share: three hosts,
each its own network, /dev/shm and host name, with an sshd; tbrun runs in the first."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ..conftest import TBRUN, skip_or_fail, tagged_lines, wait_for
from ..harness import netns

HOSTS = 3


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Started once for the session (an sshd and a holder per host); test_multihost.py and
    test_two_level.py both run in it."""
    reason = netns.why_not_available()
    if reason:
        skip_or_fail(reason)
    c = netns.Cluster(f"tbc{os.getpid() % 10000}", tmp_path_factory.mktemp("cluster"), HOSTS)
    try:
        c.start()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.stop()
        skip_or_fail(f"cannot make network namespaces here: {e}")
    yield c
    c.stop()


def tbrun_on(cluster: netns.Cluster, *args: str, env: dict | None = None) -> subprocess.Popen:
    """Start tbrun (or `tbrun doctor` and the like) inside host 0 with the cluster's ssh; its
    stdin is a pipe (see finish)."""
    args = [str(a) for a in args]
    sub = args[:1] if args[0] in ("doctor", "hostfile") else []
    argv = cluster.exec_argv(0, TBRUN, *sub, "--ssh", cluster.ssh, *args[len(sub):])
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(p: subprocess.Popen, timeout: float = 90, input: str = "") -> tuple[int, str, str]:
    """Give tbrun input (closed at once when empty), wait for it, return (status, out, err);
    tbrun is killed where it outlives timeout."""
    try:
        out, err = p.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"tbrun still ran after {timeout} s:\n{out}{err}")
    return p.returncode, out, err


def assert_no_rank_left(cluster: netns.Cluster) -> None:
    for i in range(cluster.size):
        wait_for(lambda i=i: not cluster.pids(i), 10, f"the processes of host {i} to end")


def results(out: str) -> dict[int, dict]:
    """Each rank's last line of output, as JSON, by rank."""
    return {rank: json.loads(lines[-1]) for rank, lines in tagged_lines(out).items()}
