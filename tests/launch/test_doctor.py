"""tbrun doctor and tbrun hostfile: on this machine for real, and on Macs from what macOS
would report (system_profiler, networksetup, rdma_ctl, ifconfig), since CI has no Mac."""

import errno
import json
import os

import pytest
from tbcoll.launch.cluster import thunderbolt
from tbcoll.launch.cluster.doctor import checks
from tbcoll.launch.cluster.write_hostfile import hostfile_from_facts

from tbcoll.job.topology import Host, Hostfile

from ..conftest import REPO, tbrun

# Three Macs cabled as a full mesh: cable (i, j) joins one port of each; port k is enK.
CABLES = {(0, 1): (1, 1), (0, 2): (2, 1), (1, 2): (2, 2)}  # (i, j): (i's port, j's port)


def mac_facts(i: int, *, rdma="RDMA enabled", bridge="status: inactive",
              addresses=True, cables=CABLES, gbps=80) -> dict:
    buses = []
    for port in (1, 2):
        peer = next((f"mac{j}-port{pj}" for (a, j), (pa, pj) in cables.items()
                     if a == i and pa == port), None)
        peer = peer or next((f"mac{a}-port{pa}" for (a, j), (pa, pj) in cables.items()
                             if j == i and pj == port), None)
        bus = {"domain_uuid_key": f"mac{i}-port{port}", "device_name_key": f"Mac {i}",
               "receptacle_1_tag": {"receptacle_id_key": str(port),
                                    "current_speed_key": f"Up to {gbps} Gb/s"}}
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
            "ipv4": {f"en{p}": f"192.168.{i}.{p}" if addresses else "" for p in (1, 2)},
            "rdma": {"library": "librdma.dylib", "error": None, "devices": [
                rdma_device(f"rdma_en{p}", f"en{p}", f"192.168.{i}.{p}" if addresses else None,
                            index=1) for p in (1, 2)]}}


def rdma_device(name: str, netdev: str, ipv4: str | None, index: int = 1,
                state: str = "ACTIVE") -> dict:
    """A device as verbs.rdma_facts reports it: one port, a link-local GID at index 0 and,
    once its interface has an IPv4 address, the address's mapped GID at index."""
    gids = [{"index": 0, "gid": "fe80::1", "ipv4": None}]
    if ipv4:
        gids.append({"index": index, "gid": f"::ffff:{ipv4}", "ipv4": ipv4})
    return {"name": name, "ports": [{"port": 1, "state": state, "active_mtu": 1024,
                                     "gids": gids, "netdev": netdev}]}


def linux_facts(devices: list[dict] | None, library: str | None = "libibverbs.so.1") -> dict:
    return {"host": "box", "os": "linux", "machine": "x86_64", "python": "3.11.2",
            "packages": {"tbcoll": "0.1.0", "mlx": None, "mpi4py": None, "numpy": "2.4.6"},
            "reach": {}, "mlx_backends": [],
            "rdma": {"library": library, "devices": devices or [],
                     "error": None if devices else "ibv_get_device_list: Function not "
                     "implemented"}}


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
    # --slots: several ranks a host, which the cables carry together
    written = Hostfile.from_json(hostfile_from_facts(
        ["mac0", "mac1", "mac2"], [mac_facts(i) for i in range(3)], None, slots=2), "written")
    assert [h.slots for h in written.hosts] == [2, 2, 2] and written.is_full_mesh()


def test_doctor_passes_a_well_set_up_mac_cluster():
    hosts = [Host(f"mac{i}") for i in range(3)]
    found = checks(hosts, [mac_facts(i) for i in range(3)], "python3")
    assert [c for c in found if c.status != "ok"] == []
    assert any(c.what == "cabling" and c.detail.startswith("full mesh") for c in found)
    assert sum(c.what.startswith("rdma_ctl") for c in found) == 3


def test_doctor_shows_the_two_levels_of_hosts_with_several_ranks():
    facts = [mac_facts(i) for i in range(3)]
    one = next(c for c in checks([Host(f"mac{i}") for i in range(3)], facts, "python3")
               if c.what == "levels")
    assert one.detail == "one level: 3 host(s), one rank each"
    hosts = [Host("mac0", 2), Host("mac1", 2), Host("mac2", 1)]
    two = next(c for c in checks(hosts, facts, "python3") if c.what == "levels")
    assert two.status == "ok" and "two levels: ranks per host mac0 (2), mac1 (2), mac2 (1)" \
        in two.detail and "tcp: 8 connections" in two.detail, two.detail


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
    gid = failed["rdma rdma_en1 port 1 on mac2"]
    assert "no IPv4-mapped GID at GID index 1" in gid.detail and "ifconfig en1 inet" in gid.fix
    assert len(failed) == 7  # and en2 on mac2, twice


def test_doctor_wants_jaccl_where_the_hostfile_names_rdma_devices():
    hostfile = Hostfile.from_file(REPO / "hostfiles" / "links3.json")
    facts = [mac_facts(i) for i in range(3)]
    for fact in facts:  # every cable's far end answers, on the devices the hostfile names
        fact["reach"] = {a: "ok" for host in hostfile.hosts for a in host.links if a}
        fact["rdma"]["devices"] = [rdma_device(f"rdma_en{p}", f"en{p}", f"192.168.9.{p}")
                                   for p in (2, 3)]
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
    if not os.path.isdir("/sys/class/infiniband"):  # this kernel has no RDMA: one clear line
        assert "skip  rdma on localhost: no RDMA" in p.stdout
        assert "only --backend rdma and jaccl need it" in p.stdout


def test_doctor_without_rdma_fails_only_where_the_hostfile_asks_for_it():
    found = checks([Host("box")], [linux_facts(None)], "python3")
    line = next(c for c in found if c.what == "rdma on box")
    assert line.status == "skip" and "Function not implemented" in line.detail
    found = checks([Host("box")], [linux_facts(None, library=None)], "python3")
    assert "the verbs library does not load" in next(c for c in found
                                                     if c.what == "rdma on box").detail
    hosts = [Host("box", rdma=(None, "rxe0")), Host("box2", rdma=("rxe0", None))]
    found = checks(hosts, [linux_facts(None), linux_facts(None)], "python3")
    failed = [c for c in found if c.status == "FAIL" and c.what.startswith("rdma on")]
    assert len(failed) == 2 and "apt-get install" not in failed[0].fix  # a device is missing
    assert "rdma link add rxe0 type rxe" in failed[0].fix


def test_doctor_names_a_down_port_and_the_interface_without_an_address():
    devices = [rdma_device("rxe0", "veth0", None), rdma_device("rxe1", "veth1", "10.0.0.1",
                                                                 state="DOWN")]
    found = {c.what: c for c in checks([Host("box")], [linux_facts(devices)], "python3")}
    assert found["rdma on box"].status == "ok"
    no_gid = found["rdma rxe0 port 1 on box"]
    assert no_gid.status == "FAIL" and "veth0 has no IPv4 address" in no_gid.detail
    assert "ip addr add ADDRESS/PREFIX dev veth0" in no_gid.fix
    down = found["rdma rxe1 port 1 on box"]
    assert down.status == "FAIL" and "DOWN" in down.detail and "ip link set veth1 up" in down.fix


def test_doctor_names_rdma_ctl_for_a_mac_port_that_is_not_active():
    facts = [mac_facts(0), mac_facts(1)]
    facts[1]["rdma"]["devices"][0]["ports"][0]["state"] = "DOWN"
    found = {c.what: c for c in checks([Host("mac0"), Host("mac1")], facts, "python3")}
    down = found["rdma rdma_en1 port 1 on mac1"]
    assert down.status == "FAIL" and down.detail == "port DOWN"
    assert "Thunderbolt cable on en1" in down.fix and "rdma_ctl enable" in down.fix
    assert found["rdma rdma_en2 port 1 on mac1"].status == "ok"


def test_doctor_looks_at_the_library_the_rdma_backend_would_open():
    p = tbrun("doctor", timeout=60, env={**os.environ, "TBCOLL_RDMA_LIBRARY": "/nonexistent/v.so"})
    line = next((x for x in p.stdout.splitlines() if "rdma on localhost" in x), p.stdout)
    assert "the verbs library does not load (/nonexistent/v.so" in line, line


def test_doctor_finds_each_device_the_hostfile_names_and_flags_two_cables():
    hosts = [Host("mac0", rdma=(None, ("rdma_en1", "rdma_en2"), "rdma_en9")),
             Host("mac1", rdma=("rdma_en1", None, "rdma_en2")),
             Host("mac2", rdma=("rdma_en1", "rdma_en2", None))]
    found = {c.what: c for c in checks(hosts, [mac_facts(i) for i in range(3)], "python3")}
    missing = found["rdma rdma_en9 on mac0"]
    assert missing.status == "FAIL" and "named for mac2" in missing.detail
    assert "mac0 has: rdma_en1, rdma_en2" in missing.detail
    assert found["rdma rdma_en1 port 1 on mac1"].status == "ok"
    double = found["cables mac0-mac1"]
    assert double.status == "FAIL" and "rdma_en1, rdma_en2" in double.detail


def test_doctor_flags_two_thunderbolt_cables_between_two_macs():
    cables = {(0, 1): (1, 2), (1, 0): (1, 2)}  # mac0 port 1 - mac1 port 2, mac1 1 - mac0 2
    found = checks([Host("mac0"), Host("mac1")], [mac_facts(i, cables=cables) for i in (0, 1)],
                   "python3")
    double = next(c for c in found if c.what == "cables mac0-mac1")
    assert double.status == "FAIL" and "one device per pair" in double.fix
    # the hostfile written for them lists both cables' addresses, a path each (Layout.paths)
    text = hostfile_from_facts(["mac0", "mac1"], [mac_facts(i, cables=cables) for i in (0, 1)],
                               None)
    # in the same order at both ends (Layout.paths pairs the k-th of each), though mac1's
    # ports are the other way round
    assert json.loads(text)["hosts"][0]["links"] == [None, ["192.168.0.1", "192.168.0.2"]]
    paths = Hostfile.from_json(text, "written").layout(2).paths(0, 1)
    assert [(p.name, p.local, p.remote) for p in paths] == [
        ("cable 1", "192.168.0.1", "192.168.1.2"), ("cable 2", "192.168.0.2", "192.168.1.1"),
        ("management", "10.0.0.1", "10.0.0.2")]


def test_doctor_tells_thunderbolt_4_from_5():
    found = {c.what: c for c in checks([Host("mac0"), Host("mac1")],
                                       [mac_facts(0, gbps=40), mac_facts(1)], "python3")}
    slow = found["thunderbolt en1 on mac0"]
    assert slow.status == "FAIL" and "Thunderbolt 4" in slow.detail
    assert found["thunderbolt en1 on mac1"].detail == "Thunderbolt 5 link (80 Gb/s)"


def test_doctor_in_the_rdma_lab_passes_rxe0(rdma_lab, tmp_path):
    """Two names of the lab's one host, each naming a device: rxe0 passes, rxe9 is named as
    missing (one doctor run: a start under emulation costs ~10 s)."""
    hostfile = tmp_path / "two.json"
    hostfile.write_text(json.dumps({"hosts": [
        {"ssh": "localhost", "ips": ["127.0.0.1"], "rdma": [None, "rxe0"]},
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": ["rxe9", None]}]}))
    p = rdma_lab.run(["tbrun", "doctor", "--hostfile", hostfile], timeout=240)
    assert p.returncode == 1
    assert f"ok    rdma rxe0 port 1 on localhost: ACTIVE, GID 1 ::ffff:{rdma_lab.address} on " \
           f"{rdma_lab.netdev}" in p.stdout, p.stdout + p.stderr
    assert "ok    rdma on localhost: libibverbs.so.1: rxe0" in p.stdout
    assert "FAIL  rdma rxe9 on 127.0.0.1: not found (named for localhost); 127.0.0.1 has: " \
           "rxe0" in p.stdout, p.stdout + p.stderr


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


@pytest.mark.parametrize("failure", [os.strerror(errno.EHOSTUNREACH), "timed out"])
def test_doctor_names_macos_privacy_and_firewall_when_a_mac_peer_is_silently_blocked(failure):
    """macOS's Local Network privacy and its Application Firewall block a connection between
    Macs with no word beyond EHOSTUNREACH or a timeout: the fix says where to allow it."""
    hostfile = Hostfile.from_file(REPO / "hostfiles" / "links3.json")
    facts = [mac_facts(i) for i in range(3)]
    for fact in facts:
        fact["reach"] = {a: "ok" for host in hostfile.hosts for a in host.links if a}
    address = hostfile.hosts[1].links[0]  # mac0 reaches mac1 there
    facts[0]["reach"][address] = failure
    failed = [c for c in checks(hostfile.hosts, facts, "python3") if c.status == "FAIL"]
    link = next(c for c in failed if c.what.startswith("link ") and address in c.detail)
    assert "Local Network" in link.fix and "socketfilterfw" in link.fix, link
    facts[0]["reach"][address] = "Connection reset by peer"  # not what a block gives
    failed = [c for c in checks(hostfile.hosts, facts, "python3") if c.status == "FAIL"]
    link = next(c for c in failed if c.what.startswith("link ") and address in c.detail)
    assert "Local Network" not in link.fix


def test_doctor_lists_each_pairs_paths_and_checks_every_cable():
    """Two cables between mac0 and mac1 (a "links" list each) and the management network:
    doctor lists the three paths in the order a job tries them and checks each cable."""
    hostfile = Hostfile.from_json(json.dumps([
        {"ssh": "mac0", "ips": ["10.0.0.1"], "links": [None, ["192.168.1.1", "192.168.2.1"]]},
        {"ssh": "mac1", "ips": ["10.0.0.2"], "links": [["192.168.1.2", "192.168.2.2"], None]}]),
        "two.json")
    facts = [mac_facts(i) for i in range(2)]
    facts[0]["reach"] = {"192.168.1.2": "ok", "192.168.2.2": os.strerror(errno.EHOSTUNREACH)}
    facts[1]["reach"] = {"192.168.1.1": "ok", "192.168.2.1": "ok"}
    found = {c.what: c for c in checks(hostfile.hosts, facts, "python3")}
    assert found["paths mac0 <-> mac1"].detail == (
        "cable 1 (192.168.1.1 - 192.168.1.2), then cable 2 (192.168.2.1 - 192.168.2.2), then "
        "management (10.0.0.1 - 10.0.0.2)")
    assert found["link mac0 -> mac1 (cable 1)"].status == "ok"
    assert found["link mac1 -> mac0 (cable 2)"].status == "ok"
    down = found["link mac0 -> mac1 (cable 2)"]
    assert down.status == "FAIL" and "192.168.2.2" in down.detail
