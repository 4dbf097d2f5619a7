"""The rdma backend under the Apple profile (tests/harness/apple_profile.py): Apple's
Thunderbolt RDMA driver's known rules enforced over Soft-RoCE in the lab (UC only, 10 queue
pairs and 100 memory regions per device, 32 outstanding work requests per queue, MTU 1024, RTR
only from an IPv4-mapped GID, only jaccl's 16 symbols). The rules themselves are tried first,
with and without the profile; then tests/transports/test_rdma.py's SPMD suite at np=3 (its np=2
suite runs without the profile: each suite once, in the VM's minutes) and a rank killed mid-mesh
run under it: set-up, the mesh and the stream (credits against the queue depth)."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from ..conftest import skip_or_fail
from ..harness import apple_profile
from ..transports.test_rdma import (
    HELLO,
    THREE_RANKS_SUBSET,
    assert_suite_passed,
    killed_rank_is_named,
    lab_tbrun,
)

# Every rule the profile adds (the checker's names); Soft-RoCE itself drops a UC SEND that
# finds no receive, and refuses an RTR from a link-local GID to an IPv4 one, with or without it.
PROFILE_RULES = ("only-jaccls-symbols", "contexts-1-per-host", "mtu-1024", "rc-refused",
                 "rtr-path-mtu-1024", "recv-depth-32", "send-depth-32", "memory-regions-100",
                 "queue-pairs-10")
RDMA_RULES = ("rtr-needs-an-ipv4-mapped-gid", "send-before-recv-dropped")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """(the profile's path, the checker's path), built for this run."""
    reason = apple_profile.why_not_buildable()
    if reason:
        skip_or_fail(f"Apple profile: {reason}")
    return apple_profile.build(tmp_path_factory.mktemp("apple-profile"))


def under_profile(profile, **env) -> dict:
    return {"TBCOLL_RDMA_LIBRARY": str(profile[0]), **env}


# --- here: the library and the backend's loading of it ----------------------------------------

def test_the_profile_exports_only_jaccls_symbols(profile):
    library = ctypes.CDLL(str(profile[0]))  # not linked to libibverbs: it opens it at first use
    assert all(hasattr(library, name) for name in apple_profile.JACCL_SYMBOLS)
    for absent in ("ibv_wc_status_str", "ibv_query_device", "ibv_post_send", "ibv_create_ah"):
        assert not hasattr(library, absent), absent


def test_the_backend_loads_on_a_library_with_only_jaccls_symbols(profile):
    """It needed ibv_wc_status_str too, and failed to load: 'the RDMA library ... has no
    ibv_wc_status_str'. A process of its own: the library opened first stays opened."""
    code = f"from tbcoll.transports.rdma import _verbs; print(_verbs.devices({str(profile[0])!r}))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("["), p.stdout  # this host: no device, so []


# --- in the lab --------------------------------------------------------------------------------

def checked_rules(lab, library: str, checker) -> dict[str, str]:
    p = lab.run([checker, library, lab.device], timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    return {m[2]: m[1] for m in re.finditer(r"^(ok|no) ([\w-]+)", p.stdout, re.M)}


def test_apples_rules_hold_under_the_profile_and_not_without(rdma_lab, profile):
    rules = checked_rules(rdma_lab, str(profile[0]), profile[1])
    assert rules == dict.fromkeys(PROFILE_RULES + RDMA_RULES, "ok"), rules
    plain = checked_rules(rdma_lab, "libibverbs.so.1", profile[1])
    assert plain == {**dict.fromkeys(PROFILE_RULES, "no"), **dict.fromkeys(RDMA_RULES, "ok")}, \
        plain


def test_spmd_suite_under_the_apple_profile(rdma_lab, profile):
    """tests/transports/test_rdma.py's np=3 suite, under the profile (its np=2 suite runs
    without it)."""
    p = lab_tbrun(rdma_lab, "--timeout", "600", "-m", "pytest", "-q",
                  "-p", "no:cacheprovider", "-k", THREE_RANKS_SUBSET,
                  "tests/spmd/test_collectives.py", "tests/spmd/test_descriptors.py",
                  "--case-dtypes", "float32", np=3, timeout=650, env=under_profile(profile))
    assert_suite_passed(p, 13)


def test_a_killed_rank_is_named_under_the_apple_profile(rdma_lab, profile, tmp_path):
    killed_rank_is_named(rdma_lab, tmp_path, "native", 2, under_profile(profile))


# --- several ranks per host: Apple's limits per (device, host) ----------------------------------

ALL_REDUCE_ONCE = """
import numpy as np, tbcoll
comm = tbcoll.init()
print("sum", comm.all_reduce(np.ones(3, np.float32))[0], flush=True)
"""

# 2 hosts x 2 ranks through tbcoll.init(): shm inside a host, rdma among the hosts' leaders
# (tbcoll.hierarchy), each collective checked against numpy at the mesh's size (64 B a rank)
# and past it (256 KiB); point-to-point between the hosts' non-leaders (over tcp), a flat
# algorithm over the two levels (all_to_all) and a sub-communicator of a rank per host
TWO_HOSTS_OF_TWO = """
import numpy as np, tbcoll
comm = tbcoll.init()
r, n = comm.rank, comm.size
for count in (16, 1 << 16):
    x = np.arange(count, dtype=np.float32) * (r + 1)
    every = [np.arange(count, dtype=np.float32) * (k + 1) for k in range(n)]
    assert np.array_equal(comm.all_reduce(x), sum(every)), count
    assert np.array_equal(comm.all_gather(x), np.concatenate(every)), count
    assert np.array_equal(comm.broadcast(x, root=3), every[3]), count
    assert np.array_equal(comm.reduce_scatter(x), np.split(sum(every), n)[r]), count
    assert np.array_equal(comm.all_to_all(x),
                          np.concatenate([np.split(e, n)[r] for e in every])), count
    comm.barrier()
    if r == 1:
        comm.send(x, 3, tag=count % 1000)
    elif r == 3:
        assert np.array_equal(comm.recv(np.empty_like(x), 1, tag=count % 1000), every[1]), count
sub = comm.split(r % 2)  # ranks 0 and 2, ranks 1 and 3: one of each host
assert np.array_equal(sub.all_reduce(np.full(4, r, np.int64)), np.full(4, 2 + 2 * (r % 2)))
print("right", r, flush=True)
comm.close()
"""


def profile_counts(lab, folder) -> dict[str, list[int]]:
    """The most contexts, queue pairs and memory regions the profile counted at once per
    (host, device) in folder (APPLE_PROFILE_STATE): {"node0.rxe0": [1, 2, 1], ...}."""
    p = lab.run(["sh", "-c", 'for f in "$0"/*; do echo "${f##*/} $(head -n 1 "$f")"; done',
                 str(folder)], timeout=60)
    counts = {}
    for line in p.stdout.splitlines():
        name, word, *numbers = line.split()
        assert word == "peak", p.stdout
        counts[name.rpartition("-")[2]] = [int(n) for n in numbers]  # less the job's id
    return counts


def test_the_per_rank_design_is_refused_per_host_as_per_process_counting_did_not(
        rdma_lab, profile, script, tmp_path):
    """np 4 as 2 hosts x 2 ranks, every rank with its own device context and 2 queue pairs to
    each other rank (TBCOLL_HIERARCHY=0: rdma among every rank, tbcoll's design before issue
    48): each host's second context is refused (Apple's driver deadlocks with several, MLX
    PR #3245), named by the profile and by the rank in one line. Counted per process, as the
    profile did before, the same job passed. Two jobs at once (their time is start-up)."""
    job = script(ALL_REDUCE_ONCE)
    envs = [under_profile(profile, TBCOLL_HIERARCHY="0", APPLE_PROFILE_STATE=tmp_path / "c"),
            under_profile(profile, TBCOLL_HIERARCHY="0", APPLE_PROFILE_COUNT="process")]
    with ThreadPoolExecutor(2) as pool:
        per_host, per_process = pool.map(lambda env: lab_tbrun(
            rdma_lab, job, np=4, per_host=2, timeout=300, env=env), envs)
    out = per_process.stdout + per_process.stderr
    assert per_process.returncode == 0, out
    assert sorted(re.findall(r"^\[(\d)\] sum 4.0$", per_process.stdout, re.M)) == list("0123"), out
    out = per_host.stdout + per_host.stderr
    assert per_host.returncode != 0, out
    refused = re.findall(r"apple-profile: refused device context number 2 on rxe0 of host "
                         r"\w+-(node\d) \(held: pid \d+: 1; at most 1\): Apple's driver "
                         r"deadlocks with several contexts on one device", out)
    assert refused and set(refused) <= {"node0", "node1"}, out
    errors = [line for line in out.splitlines() if "CommError: " in line]
    assert errors, out
    assert "cannot open RDMA device rxe0: Device or resource busy (Apple's driver allows one " \
           "context per device on a host" in errors[0], errors[0]


def test_two_hosts_of_two_ranks_keep_apples_limits_per_host(rdma_lab, profile, script,
                                                           tmp_path):
    """2 hosts x 2 ranks, backend rdma, under the profile: the two-level group opens rdma among
    the hosts' leaders alone (open_group), and every collective comes out right; per (device,
    host) the profile counted at most one context, 2 queue pairs (the one other host's) and
    one memory region, whatever the ranks per host."""
    state = tmp_path / "counts"
    p = lab_tbrun(rdma_lab, script(TWO_HOSTS_OF_TWO), np=4, per_host=2, timeout=300,
                  env=under_profile(profile, APPLE_PROFILE_STATE=state))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert sorted(re.findall(r"^\[(\d)\] right (\d)$", p.stdout, re.M)) == \
        [(str(r), str(r)) for r in range(4)], p.stdout
    assert profile_counts(rdma_lab, state) == {"node0.rxe0": [1, 2, 1],
                                               "node1.rxe0": [1, 2, 1]}


def test_set_up_refusals_are_one_line_and_rtr_is_never_tried_again(rdma_lab, profile, script):
    """Two jobs at once (their time is start-up). GID index 0 of rxe0 is link-local (fe80::):
    the profile refuses RTR from it, as Apple's driver does (errno 22); each rank says so once
    and stops, since a retry could wedge a Mac's port. And RC is refused, naming UC."""
    hello = script(HELLO)
    envs = [under_profile(profile, TBCOLL_RDMA_GID_INDEX="0"),
            under_profile(profile, TBCOLL_RDMA_QP="rc")]
    with ThreadPoolExecutor(2) as pool:
        rtr, rc = pool.map(lambda env: lab_tbrun(rdma_lab, hello, np=2, timeout=200,
                                                 env=env), envs)
    assert rtr.returncode != 0 and rc.returncode != 0
    out = rtr.stdout + rtr.stderr
    refused = re.findall(r"apple-profile: RTR refused on rxe0 \(failed RTR number (\d+)", out)
    assert refused and set(refused) == {"1"}, out  # at most one per rank, each its first
    errors = [line for line in out.splitlines() if "CommError: " in line]
    assert errors, out
    assert "to RTR (ready to receive): Invalid argument (errno 22)" in errors[0], errors[0]
    assert "GID (index 0 of rxe0) is IPv4-mapped" in errors[0], errors[0]
    assert "not tried again" in errors[0], errors[0]
    assert "cannot create a RC queue pair on rxe0: Invalid argument (Apple's driver takes UC " \
           "queue pairs only: TBCOLL_RDMA_QP=uc)" in rc.stdout + rc.stderr, rc.stdout + rc.stderr


def test_doctor_under_the_profile_passes_rxe0(rdma_lab, profile):
    """tbrun doctor opens the library the backend would (TBCOLL_RDMA_LIBRARY): the profile's
    16 functions are all it needs, and the port it reports is ACTIVE with its IPv4-mapped GID
    and MTU 1024, as a Mac's."""
    p = rdma_lab.run(["tbrun", "doctor"], timeout=240, env=under_profile(profile))
    assert f"rdma on localhost: {profile[0]}: rxe0" in p.stdout, p.stdout + p.stderr
    assert f"ok    rdma rxe0 port 1 on localhost: ACTIVE, GID 1 ::ffff:{rdma_lab.address} on " \
           f"{rdma_lab.netdev}, MTU 1024" in p.stdout, p.stdout + p.stderr
