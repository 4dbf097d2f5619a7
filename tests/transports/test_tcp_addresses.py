"""Which addresses a tcp rank listens on and connects to, from the resolved topology."""

import json
import socket

import pytest

from tbcoll.job.env import LaunchInfo
from tbcoll.job.topology import Layout
from tbcoll.transports.socket_mesh import listen_hosts, peer_paths


def info(node_rank, hosts, store="127.0.0.1"):
    return LaunchInfo(rank=0, size=sum(len(h["ranks"]) for h in hosts), local_rank=0,
                      local_size=1, node_rank=node_rank, backend="tcp", store=(store, 1),
                      token="t", topology=Layout.from_json(json.dumps({"hosts": hosts})),
                      timeout=1.0)


MESH = [{"name": "a", "ranks": [0], "addr": "10.0.0.1", "links": [None, "192.168.0.1"]},
        {"name": "b", "ranks": [1, 2], "addr": "10.0.0.2", "links": ["192.168.0.2", None]}]


def test_one_host_listens_on_loopback():
    assert listen_hosts(info(0, [{"name": "localhost", "ranks": [0, 1]}])) == ["127.0.0.1"]


def test_a_host_listens_on_its_address_and_its_cable_ends():
    assert listen_hosts(info(1, MESH)) == ["10.0.0.2", "192.168.0.2"]
    several = [{**MESH[0], "links": [None, ["192.168.0.1", "192.168.9.1"]]},
               {**MESH[1], "links": [["192.168.0.2", "192.168.9.2"], None]}]
    assert listen_hosts(info(1, several)) == ["10.0.0.2", "192.168.0.2", "192.168.9.2"]


def test_peers_are_reached_over_the_cable_between_their_hosts():
    route = peer_paths(info(0, MESH))
    # b's end of the a-b cable first, then the management network
    assert [p.remote for p in route(1)] == [p.remote for p in route(2)] == [
        "192.168.0.2", "10.0.0.2"]
    no_links = [{k: v for k, v in h.items() if k != "links"} for h in MESH]
    assert [p.remote for p in peer_paths(info(0, no_links))(2)] == ["10.0.0.2"]
    assert route(7) is None


def test_a_name_that_is_loopback_on_its_own_host_is_replaced():
    """Across hosts, a host whose name resolves to 127.0.1.1 on itself must not listen there."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: picks a route, sends nothing
            here = s.getsockname()[0]
    except OSError:
        pytest.skip("this machine has no route off loopback")
    hosts = [{"name": "localhost", "ranks": [0], "addr": "localhost"},
             {"name": "b", "ranks": [1], "addr": "10.0.0.2"}]
    assert listen_hosts(info(0, hosts, store=here)) == [here]
