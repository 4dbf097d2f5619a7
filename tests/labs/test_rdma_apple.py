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
    p = lab_tbrun(rdma_lab, "-np", 3, "--timeout", "600", "-m", "pytest", "-q",
                  "-p", "no:cacheprovider", "-k", THREE_RANKS_SUBSET,
                  "tests/spmd/test_collectives.py", "tests/spmd/test_descriptors.py",
                  "--case-dtypes", "float32", timeout=650, env=under_profile(profile))
    assert_suite_passed(p, 13)


def test_a_killed_rank_is_named_under_the_apple_profile(rdma_lab, profile, tmp_path):
    killed_rank_is_named(rdma_lab, tmp_path, "native", 2, under_profile(profile))


def test_set_up_refusals_are_one_line_and_rtr_is_never_tried_again(rdma_lab, profile, script):
    """Two jobs at once (their time is start-up). GID index 0 of rxe0 is link-local (fe80::):
    the profile refuses RTR from it, as Apple's driver does (errno 22); each rank says so once
    and stops, since a retry could wedge a Mac's port. And RC is refused, naming UC."""
    hello = script(HELLO)
    envs = [under_profile(profile, TBCOLL_RDMA_GID_INDEX="0"),
            under_profile(profile, TBCOLL_RDMA_QP="rc")]
    with ThreadPoolExecutor(2) as pool:
        rtr, rc = pool.map(lambda env: lab_tbrun(rdma_lab, "-np", 2, hello, timeout=200,
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
