"""Hostfiles in every form tbcoll reads, and every way they can be wrong."""

import json
import re

import pytest

from tbcoll.core.errors import HostfileError
from tbcoll.job.topology import Hostfile, Layout

from ..conftest import REPO


def write(tmp_path, text, name="hosts"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_examples_parse():
    mpi = Hostfile.from_file(REPO / "hostfiles" / "mpi.txt")
    assert [(h.name, h.slots) for h in mpi.hosts] == [
        ("mac1.local", 2), ("mac2.local", 2), ("mac3.local", 1), ("mac4.local", 1)]
    mesh = Hostfile.from_file(REPO / "hostfiles" / "mesh4.json")
    assert mesh.backend == "jaccl" and mesh.envs == ("MLX_METAL_FAST_SYNCH=1",)
    assert mesh.hosts[1].ips == ("10.0.1.2",) and mesh.hosts[1].rdma[0] == "rdma_en2"
    assert mesh.is_full_mesh()
    ring = Hostfile.from_file(REPO / "hostfiles" / "ring4.json")
    assert not ring.is_full_mesh() and ring.slots == 4
    links = Hostfile.from_file(REPO / "hostfiles" / "links3.json")
    assert links.is_full_mesh() and links.hosts[2].links == ("192.168.0.6", "192.168.0.10", None)
    paths = Hostfile.from_file(REPO / "hostfiles" / "paths2.json").layout(2).paths(1, 0)
    assert [(p.name, p.remote) for p in paths] == [
        ("cable 1", "192.168.0.1"), ("cable 2", "192.168.0.5"), ("management", "10.0.1.1")]


def test_placement_by_slot_and_by_node():
    hosts = Hostfile.from_list("a:2,b:1,c:3")
    assert hosts.placement(6) == [0, 0, 1, 2, 2, 2]
    assert hosts.placement(6, "node") == [0, 1, 2, 0, 2, 2]
    assert hosts.placement(2) == [0, 0]
    with pytest.raises(HostfileError, match="7 ranks asked for but the hosts have 6 slots"):
        hosts.placement(7)
    with pytest.raises(HostfileError, match="--map-by 'core': use slot or node"):
        hosts.placement(2, "core")


def test_rdma_lists_of_several_cables_and_ipv6_names(tmp_path):
    path = write(tmp_path, json.dumps([
        {"ssh": "a", "rdma": [None, ["rdma_en2", "rdma_en5"]]},
        {"ssh": "b", "rdma": ["rdma_en2", None]}]))
    assert Hostfile.from_file(path).hosts[0].rdma[1] == ("rdma_en2", "rdma_en5")
    assert Hostfile.from_list("fe80::1,b:2").hosts[0].name == "fe80::1"


@pytest.mark.parametrize("text, message", [
    ("a slots=2\nb slots=two\n", "hosts:2: 'slots=two': expected a whole number of slots"),
    ("a slots=0\n", "hosts:1: 'slots=0': expected a whole number of slots from 1 to"),
    ("a:x\n", "hosts:1: 'a:x': expected a whole number"),
    ("a cores=4\n", "hosts:1: 'cores=4' is not slots=N"),
    ("a\n# comment\nb\na slots=3\n", "hosts:4: host 'a' appears twice (first on line 1)"),
    ("# only a comment\n\n", "hosts: no hosts"),
    ("bad/name\n", "hosts:1: 'bad/name' is not a host name"),
])
def test_text_errors_name_the_line(tmp_path, text, message):
    with pytest.raises(HostfileError) as info:
        Hostfile.from_file(write(tmp_path, text))
    assert f"{tmp_path}/{message}" in str(info.value)  # the file, the line, the problem


@pytest.mark.parametrize("data, message", [
    ('{"hosts": [}', ":1: not valid JSON"),
    ('{"nodes": []}', 'expected a list of hosts, or an object with "hosts"'),
    ('[{"ips": ["1.2.3.4"]}]', 'host 0 must be an object with "ssh": "name"'),
    ('[{"ssh": "a", "ips": "1.2.3.4"}]', "host 0 ('a'): \"ips\" must be a list of addresses"),
    ('[{"ssh": "a", "rdma": [null]}, {"ssh": "b", "rdma": ["x"]}]',
     "host 0 ('a'): \"rdma\" has 1 entries but there are 2 hosts"),
    ('[{"ssh": "a", "rdma": ["x", "y"]}, {"ssh": "b"}]',
     "host 0 ('a'): rdma[0] is the host itself and should be null"),
    ('[{"ssh": "a", "rdma": [null, 7]}, {"ssh": "b"}]',
     "host 0 ('a'): rdma[1] must be a device name, a list of names or null"),
    ('[{"ssh": "a"}, {"ssh": "a"}]', "host 1 repeats \"ssh\": 'a'"),
    ('{"hosts": [{"ssh": "a"}], "envs": ["NOEQUALS"]}', '"envs" a list of "NAME=VALUE"'),
    ("[]", "no hosts"),
])
def test_json_errors_name_the_host(tmp_path, data, message):
    with pytest.raises(HostfileError) as info:
        Hostfile.from_file(write(tmp_path, data, "hosts.json"))
    assert str(info.value).startswith(str(tmp_path / "hosts.json"))
    assert message in str(info.value)


def test_json_slots_give_a_host_several_ranks(tmp_path):
    path = write(tmp_path, json.dumps({"hosts": [
        {"ssh": "a", "ips": ["10.0.0.1"], "slots": 3}, {"ssh": "b"},
        {"ssh": "c", "ips": ["10.0.0.3"], "slots": 2}]}), "hosts.json")
    hosts = Hostfile.from_file(path)
    assert [h.slots for h in hosts.hosts] == [3, 1, 2] and hosts.slots == 6
    assert hosts.placement(6) == [0, 0, 0, 1, 2, 2]
    assert hosts.placement(5, "node") == [0, 1, 2, 0, 2]
    assert [h.ranks for h in hosts.layout(4).hosts] == [(0, 1, 2), (3,)]


@pytest.mark.parametrize("slots", ["0", "-1", "2.0", '"2"', "true", "null", "[2]", "1048577"])
def test_json_slots_errors_name_the_file_and_host(tmp_path, slots):
    path = write(tmp_path, f'[{{"ssh": "a"}}, {{"ssh": "b", "slots": {slots}}}]', "hosts.json")
    with pytest.raises(HostfileError) as info:
        Hostfile.from_file(path)
    assert str(info.value) == (f"{path}: host 1 ('b'): \"slots\" must be a whole number from 1 "
                               f"to 1048576 (the ranks this host takes), got {slots}")


def test_list_and_missing_file_errors(tmp_path):
    with pytest.raises(HostfileError, match="-H a,b,a: host 'a' appears twice; use a:N"):
        Hostfile.from_list("a,b,a")
    with pytest.raises(HostfileError, match="-H a,,b: '' is not a host name"):
        Hostfile.from_list("a,,b")
    with pytest.raises(HostfileError, match="cannot read the hostfile"):
        Hostfile.from_file(tmp_path / "missing")


def test_a_byte_order_mark_is_not_part_of_the_first_host(tmp_path):
    """Windows editors (Notepad) start UTF-8 files with a byte-order mark."""
    text = tmp_path / "hosts"
    text.write_bytes(b"\xef\xbb\xbflocalhost slots=2\nmac2.local:1\n")
    assert [(h.name, h.slots) for h in Hostfile.from_file(text).hosts] == [
        ("localhost", 2), ("mac2.local", 1)]
    mlx = tmp_path / "hosts.json"
    mlx.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"ssh": "mac1", "ips": ["10.0.0.1"]}]).encode())
    assert [h.name for h in Hostfile.from_file(mlx).hosts] == ["mac1"]


def test_links_and_the_layout_ranks_read(tmp_path):
    path = write(tmp_path, json.dumps([
        {"ssh": "root@a", "ips": ["10.0.0.1"], "links": [None, "192.168.7.1", "192.168.8.1"]},
        {"ssh": "b", "links": ["192.168.7.2", None, None]},
        {"ssh": "c", "ips": ["10.0.0.3"]}]))
    layout = Hostfile.from_file(path).layout(3)
    as_json = {"hosts": [
        {"name": "root@a", "ranks": [0], "addr": "10.0.0.1",
         "links": [None, "192.168.7.1", "192.168.8.1"]},
        {"name": "b", "ranks": [1], "addr": "b", "links": ["192.168.7.2", None, None]},
        {"name": "c", "ranks": [2], "addr": "10.0.0.3"}]}
    assert json.loads(layout.to_json()) == as_json  # TBCOLL_HOSTFILE, as the ranks read it
    assert Layout.from_json(layout.to_json()) == layout
    assert layout.node_of(2) == 2 and layout.node_of(3) is None
    with pytest.raises(ValueError, match="not a resolved topology"):
        Layout.from_json('{"hosts": [{"ranks": [0]}]}')
    # hosts without ranks drop out, and so do their columns of links
    assert Hostfile.from_file(path).layout(2).hosts[0].links == (None, "192.168.7.1")


@pytest.mark.parametrize("links, message", [
    ([None], "\"links\" must list, for each of the 2 hosts"),
    (["10.0.0.1", None], "links[0] is the host itself and should be null"),
    ([None, 5], "links[1] must be this host's address on the cable to host 1, a list of its "
                "addresses on several cables to it (preferred first), or null; got 5"),
    ([None, []], "links[1] must be this host's address"),
    ([None, ["10.1.0.1", 7]], "links[1] must be"),
    ([None, ["10.1.0.1", "10.1.0.1"]], "links[1] lists an address twice"),
])
def test_link_errors_name_the_host(tmp_path, links, message):
    """Each entry's mistakes name the file, the host and the entry."""
    path = write(tmp_path, json.dumps([{"ssh": "a", "links": links}, {"ssh": "b"}]))
    with pytest.raises(HostfileError, match=re.escape(f"{path}: host 0 ('a'): {message}")):
        Hostfile.from_file(path)


def test_several_cables_between_a_pair_are_paths_in_order(tmp_path):
    """A "links" entry may list a host's addresses on several cables to a peer, preferred
    first; a string is one cable; the hosts' "ips" are the last path; the resolved JSON
    carries the lists (and a single-path hostfile's JSON is as it was)."""
    path = write(tmp_path, json.dumps([
        {"ssh": "a", "ips": ["10.0.0.1"], "links": [None, ["192.168.1.1", "192.168.2.1"],
                                                    "192.168.3.1"]},
        {"ssh": "b", "ips": ["10.0.0.2"], "links": [["192.168.1.2", "192.168.2.2"], None, None]},
        {"ssh": "c", "ips": ["10.0.0.3"], "links": ["192.168.3.2", None, None]}]))
    hostfile = Hostfile.from_file(path)
    assert hostfile.hosts[0].links == (None, ("192.168.1.1", "192.168.2.1"), "192.168.3.1")
    layout = hostfile.layout(3)
    assert [(p.name, p.local, p.remote) for p in layout.paths(1, 0)] == [
        ("cable 1", "192.168.1.2", "192.168.1.1"), ("cable 2", "192.168.2.2", "192.168.2.1"),
        ("management", "10.0.0.2", "10.0.0.1")]
    assert [p.name for p in layout.paths(0, 2)] == ["cable 1", "management"]
    assert [(p.kind, p.local, p.remote) for p in layout.paths(1, 2)] == [
        ("management", "10.0.0.2", "10.0.0.3")]  # no cable: the management network alone
    assert layout.paths(1, 1) == ()
    as_json = json.loads(layout.to_json())
    assert as_json["hosts"][0]["links"] == [None, ["192.168.1.1", "192.168.2.1"], "192.168.3.1"]
    assert Layout.from_json(layout.to_json()) == layout
    # one end of a cable left out: the path is there, with that end None
    one_end = write(tmp_path, json.dumps([
        {"ssh": "a", "ips": ["10.0.0.1"], "links": [None, ["192.168.1.1", "192.168.2.1"]]},
        {"ssh": "b", "ips": ["10.0.0.2"]}]), "one_end")
    assert [(p.local, p.remote) for p in Hostfile.from_file(one_end).layout(2).paths(1, 0)] == [
        (None, "192.168.1.1"), (None, "192.168.2.1"), ("10.0.0.2", "10.0.0.1")]


def test_a_single_path_hostfile_resolves_byte_for_byte_as_before():
    """TBCOLL_HOSTFILE of links3.json (one cable a pair), as the ranks read it before paths."""
    layout = Hostfile.from_file(REPO / "hostfiles" / "links3.json").layout(3)
    assert layout.to_json() == (
        '{"hosts":[{"name":"mac1.local","ranks":[0],"addr":"10.0.1.1","links":[null,'
        '"192.168.0.1","192.168.0.5"]},{"name":"mac2.local","ranks":[1],"addr":"10.0.1.2",'
        '"links":["192.168.0.2",null,"192.168.0.9"]},{"name":"mac3.local","ranks":[2],'
        '"addr":"10.0.1.3","links":["192.168.0.6","192.168.0.10",null]}]}')


def test_the_two_ends_of_a_pair_list_as_many_cables(tmp_path):
    path = write(tmp_path, json.dumps([
        {"ssh": "a", "links": [None, ["192.168.1.1", "192.168.2.1"]]},
        {"ssh": "b", "links": ["192.168.1.2", None]}]))
    with pytest.raises(HostfileError, match=re.escape(
            f"{path}: host 0 ('a'): links[1] lists 2 address(es) but host 1 ('b')'s links[0] "
            "lists 1; the k-th address of each is an end of their k-th cable")):
        Hostfile.from_file(path)


def test_among_keeps_each_pairs_paths():
    """A shrunk communicator's layout (Layout.among): the survivors' hosts keep their paths to
    each other, renumbered with the hosts; a host with no survivor leaves with its cables."""
    layout = Layout.from_json(json.dumps({"hosts": [
        {"name": "a", "ranks": [0, 1], "addr": "10.0.0.1",
         "links": [None, ["192.168.1.1", "192.168.2.1"], "192.168.3.1"]},
        {"name": "b", "ranks": [2], "addr": "10.0.0.2",
         "links": [["192.168.1.2", "192.168.2.2"], None, ["192.168.4.2", "192.168.5.2"]]},
        {"name": "c", "ranks": [3], "addr": "10.0.0.3",
         "links": ["192.168.3.2", ["192.168.4.3", "192.168.5.3"], None]}]}))
    shrunk = layout.among([1, 3])  # host b has no survivor
    assert [h.ranks for h in shrunk.hosts] == [(0,), (1,)]
    assert shrunk.paths(0, 1) == layout.paths(0, 2)
    assert [p.remote for p in shrunk.paths(1, 0)] == ["192.168.3.1", "10.0.0.1"]
    kept = layout.among([0, 2, 3])
    assert kept.paths(1, 2) == layout.paths(1, 2) and kept.paths(2, 0) == layout.paths(2, 0)
    assert [p.name for p in kept.paths(2, 1)] == ["cable 1", "cable 2", "management"]
