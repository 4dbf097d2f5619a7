"""The variables and files tbrun gives MLX's backends, as mlx.launch does: ring on any
machine, jaccl (RDMA over Thunderbolt) checked here by what it would produce."""

import json
import re

import pytest
from tbcoll.launch.mlxvars import choose_backend, jaccl_variables, ring_variables

from tbcoll.core.errors import LaunchError
from tbcoll.job.topology import Hostfile

from ..conftest import REPO, tbrun

MESH = REPO / "hostfiles" / "mesh4.json"
RING = REPO / "hostfiles" / "ring4.json"


def test_ring_hostfile_lists_each_rank_address():
    ring = ring_variables([("127.0.0.1", 5000), ("10.0.0.2", 5001)])
    assert ring.backend == "ring" and ring.env == {}
    assert json.loads(ring.files["MLX_HOSTFILE"]) == [["127.0.0.1:5000"], ["10.0.0.2:5001"]]
    assert ring.for_rank(1) == {"MLX_RANK": "1"}


def test_jaccl_for_a_full_mesh():
    mesh = Hostfile.from_file(MESH)
    assert choose_backend(mesh) == "jaccl"
    jaccl = jaccl_variables(mesh, 4, "jaccl")
    assert jaccl.env == {"MLX_JACCL_COORDINATOR": "10.0.1.1:32323"}
    devices = json.loads(jaccl.files["MLX_IBV_DEVICES"])
    assert devices[0] == [None, "rdma_en2", "rdma_en3", "rdma_en4"]
    assert all(devices[i][i] is None for i in range(4))
    assert jaccl.for_rank(3)["MLX_RANK"] == "3"


def test_jaccl_ring_for_macs_cabled_in_a_ring():
    ring = Hostfile.from_file(RING)
    assert choose_backend(ring) == "jaccl-ring"
    variables = jaccl_variables(ring, 4, "jaccl-ring")
    assert variables.env["MLX_JACCL_RING"] == "1"
    assert json.loads(variables.files["MLX_IBV_DEVICES"])[1] == ["rdma_en2", None, "rdma_en3", None]


def test_no_rdma_means_the_ring_backend():
    assert choose_backend(None) == "ring"
    assert choose_backend(Hostfile.from_list("a,b")) == "ring"


@pytest.mark.parametrize("hosts, backend, message", [
    ([{"ssh": "a", "ips": ["1.1.1.1"], "rdma": [None, "x"]},
      {"ssh": "b", "rdma": [None, None]}], "jaccl", "no RDMA device from 'b' to 'a'"),
    ([{"ssh": "a", "rdma": [None, "x"]}, {"ssh": "b", "rdma": ["y", None]}], "jaccl",
     "host 0 ('a') needs \"ips\""),
    ([{"ssh": "a", "ips": ["1.1.1.1"]}, {"ssh": "b"}], "jaccl", "lists no \"rdma\" devices"),
])
def test_jaccl_errors_say_what_is_missing(hosts, backend, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        jaccl_variables(Hostfile.from_json(json.dumps(hosts), "h.json"), 2, backend)


def test_an_unknown_backend_in_the_hostfile_is_refused():
    hostfile = Hostfile.from_json(json.dumps({"backend": "nccl", "hosts": [{"ssh": "a"}]}), "h")
    with pytest.raises(LaunchError, match="\"backend\": 'nccl' is not one of ring, jaccl"):
        choose_backend(hostfile)


def test_dry_run_sends_jaccl_files_to_each_host():
    p = tbrun("--backend", "mlx", "--hostfile", MESH, "--dry-run", "true", timeout=30)
    assert p.returncode == 0, p.stderr
    setups = [json.loads(line.split("(on stdin) ", 1)[1]) for line in p.stdout.splitlines()
              if "(on stdin)" in line]
    assert len(setups) == 4
    for rank, setup in enumerate(setups):
        assert setup["env"]["MLX_RANK"] == str(rank)
        assert setup["env"]["MLX_JACCL_COORDINATOR"] == "10.0.1.1:32323"
        assert setup["env"]["MLX_METAL_FAST_SYNCH"] == "1"  # the hostfile's "envs"
        assert json.loads(setup["files"]["MLX_IBV_DEVICES"])[rank][rank] is None
