"""tbrun doctor and tbrun hostfile: on this machine for real, and on Macs from what macOS
would report (system_profiler, networksetup, rdma_ctl, ifconfig), since CI has no Mac."""

import json
import os

import pytest
from tbcoll.launch.cluster import thunderbolt
from tbcoll.launch.cluster.doctor import checks
from tbcoll.launch.cluster.write_hostfile import hostfile_from_facts

from tbcoll.topology import Host, Hostfile

from .conftest import REPO, tbrun

# Three Macs cabled as a full mesh: cable (i, j) joins one port of each; port k is enK.
CABLES = {(0, 1): (1, 1), (0, 2): (2, 1), (1, 2): (2, 2)}  # (i, j): (i's port, j's port)


def mac_facts(i: int, *, rdma="RDMA enabled", bridge="status: inactive",
              addresses=True, cables=CABLES) -> dict:
    buses = []
    for port in (1, 2):
        peer = next((f"mac{j}-port{pj}" for (a, j), (pa, pj) in cables.items()
                     if a == i and pa == port), None)
        peer = peer or next((f"mac{a}-port{pa}" for (a, j), (pa, pj) in cables.items()
                             if j == i and pj == port), None)
        bus = {"domain_uuid_key": f"mac{i}-port{port}", "device_name_key": f"Mac {i}",
               "receptacle_1_tag": {"receptacle_id_key": str(port)}}
        if peer:
            bus["_items"] = [{"domain_uuid_key": peer}]
        buses.append(bus)
    hardware = "".join(f"Hardware Port: Thunderbolt {p}\nDevice: en{p}\n\n" for p in (1, 2))
    return {"host": f"mac{i}", "os": "darwin", "machine": "arm64", "python": "3.12.1",
            "packages": {"tbcoll": "0.1.0", "mlx": "0.32.4", "mpi4py": "4.1.2",
                         "numpy": "2.4.6"},
            "reach": {}, "reached_at": f"10.0.0.{i + 1}", "mlx_backends": ["jaccl", "ring"],
            "thunderbolt_profile": {"SPThunderboltDataType": buses}, "hardware_ports": hardware,
            "rdma_ctl": rdma, "bridge0": bridge,
            "ipv4": {f"en{p}": f"192.168.{i}.{p}" if addresses else "" for p in (1, 2)}}


def test_cables_are_found_from_both_ends():
    ports = [thunderbolt.ports(f["thunderbolt_profile"], f["hardware_ports"])
             for f in map(mac_facts, range(3))]
    cables = thunderbolt.cables(ports)
    assert cables[0, 1] == [("en1", "en1")] and cables[1, 0] == [("en1", "en1")]
    assert cables[2, 1] == [("en2", "en2")]
    assert thunderbolt.shape(3, cables) == "full mesh"
    assert thunderbolt.rdma_matrix(3, cables)[0] == [None, "rdma_en1", "rdma_en2"]
    del cables[0, 2], cables[2, 0]
    assert thunderbolt.shape(3, cables) == "incomplete"  # a line 0-1-2, not a ring
    four_in_a_ring = {(0, 1): [], (1, 2): [], (2, 3): [], (3, 0): []}
    assert thunderbolt.shape(4, four_in_a_ring) == "ring"


def test_json_hostfile_for_macs_in_a_mesh_reads_back():
    text = hostfile_from_facts(["mac0", "mac1", "mac2"], [mac_facts(i) for i in range(3)], None)
    data = json.loads(text)
    assert data["backend"] == "jaccl"
    assert data["hosts"][1] == {"ssh": "mac1", "ips": ["10.0.0.2"],
                                "rdma": ["rdma_en1", None, "rdma_en2"],
                                "links": ["192.168.1.1", None, "192.168.1.2"]}
    hostfile = Hostfile.from_json(text, "written")
    assert hostfile.is_full_mesh()
    assert hostfile.layout(3).hosts[2].links == ("192.168.2.1", "192.168.2.2", None)


def test_doctor_passes_a_well_set_up_mac_cluster():
    hosts = [Host(f"mac{i}") for i in range(3)]
    found = checks(hosts, [mac_facts(i) for i in range(3)], "python3")
    assert [c for c in found if c.status != "ok"] == []
    assert any(c.what == "cabling" and c.detail.startswith("full mesh") for c in found)
    assert sum(c.what.startswith("rdma_ctl") for c in found) == 3


def test_doctor_names_each_problem_and_its_fix():
    facts = [mac_facts(0), mac_facts(1, rdma="RDMA disabled", bridge="status: active"),
             mac_facts(2, addresses=False)]
    facts[2]["packages"]["mlx"] = "0.30.0"
    found = checks([Host(f"mac{i}") for i in range(3)], facts, "python3")
    failed = {c.what: c for c in found if c.status == "FAIL"}
    assert "rdma_ctl enable" in failed["rdma_ctl on mac1"].fix
    assert "ifconfig bridge0 down" in failed["bridge0 on mac1"].fix
    assert "ifconfig en1 inet" in failed["en1 on mac2"].fix
    assert "mlx 0.30.0" in failed["versions on mac2"].detail
    assert len(failed) == 5  # and en2 on mac2


def test_doctor_wants_jaccl_where_the_hostfile_names_rdma_devices():
    hostfile = Hostfile.from_file(REPO / "hostfiles" / "links3.json")
    facts = [mac_facts(i) for i in range(3)]
    for fact in facts:  # every cable's far end answers
        fact["reach"] = {a: "ok" for host in hostfile.hosts for a in host.links if a}
    facts[1]["mlx_backends"] = ["ring"]
    found = checks(hostfile.hosts, facts, "python3")
    failed = [c for c in found if c.status == "FAIL"]
    assert [c.what for c in failed] == ["mlx jaccl on mac2.local"]
    assert "MLX has: ring" in failed[0].detail


def test_doctor_says_when_the_cabling_is_neither_mesh_nor_ring():
    cables = {(0, 1): (1, 1)}
    found = checks([Host(f"mac{i}") for i in range(3)],
                   [mac_facts(i, cables=cables) for i in range(3)], "python3")
    cabling = next(c for c in found if c.what == "cabling")
    assert cabling.status == "FAIL" and "no cable: mac0-mac2, mac1-mac2" in cabling.detail


def test_doctor_here_skips_what_needs_macos():
    p = tbrun("doctor", timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok    versions: python" in p.stdout
    assert "skipped: macOS only" in p.stdout
    assert "FAIL" not in p.stdout


def test_doctor_fails_on_a_host_it_cannot_reach():
    p = tbrun("doctor", "-H", "localhost,no-such-host.invalid", "--connect-timeout", 2,
              timeout=60)
    assert p.returncode == 1
    assert "FAIL  ssh no-such-host.invalid:" in p.stdout and "ssh-copy-id" in p.stdout


@pytest.mark.parametrize("args, expected, slots", [
    (["--slots", "1", "a", "b"], "a slots=1\nb slots=1\n", 2),
    (["localhost"], f"localhost slots={os.cpu_count()}\n", os.cpu_count()),  # its cores
    (["--slots", "4", "mac1.local"], "mac1.local slots=4\n", 4),
])
def test_text_hostfile_reads_back(args, expected, slots, tmp_path):
    out = tmp_path / "hosts.txt"
    p = tbrun("hostfile", *args, "-o", out, timeout=30)
    assert p.returncode == 0, p.stderr
    assert out.read_text() == expected
    assert Hostfile.from_file(out).slots == slots


def test_json_hostfile_of_this_machine_has_an_address():
    p = tbrun("hostfile", "--json", "localhost", timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"hosts": [{"ssh": "localhost", "ips": ["127.0.0.1"]}]}


def test_doctor_does_not_vouch_for_the_cabling_of_hosts_it_cannot_see(tmp_path):
    hostfile = tmp_path / "mesh.json"
    hostfile.write_text(json.dumps({"hosts": [
        {"ssh": f"mac{i}.invalid", "ips": [f"10.0.0.{i}"],
         "rdma": [None if j == i else f"rdma_en{j}" for j in range(2)]} for i in range(2)]}))
    p = tbrun("doctor", "--hostfile", hostfile, "--connect-timeout", 2, timeout=60)
    assert p.returncode == 1
    assert "ok    cabling" not in p.stdout
    assert "skip  cabling: skipped: cannot see mac0.invalid, mac1.invalid" in p.stdout
