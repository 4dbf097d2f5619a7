"""Hostfiles: which hosts a job runs on, how many ranks each takes, how ranks reach each other.

Read three forms, as mpirun and mlx.launch users write them:
- MPI text: one host a line, `host`, `host slots=N` or `host:N`; `#` starts a comment;
- a list on the command line, `-H a:2,b:2`;
- MLX's JSON hostfile, as mlx.distributed_config writes it: a list of hosts (or an object
  with "hosts", and optionally "backend" and "envs"), each {"ssh": name, "ips": [...],
  "rdma": [...]}, where rdma[j] is the RDMA device (a name, or a list of names for several
  cables) that reaches host j, null for the host itself and for hosts with no cable to it
  (a ring). tbcoll adds two optional keys: "slots", the ranks the host takes (1 if left
  out, as MLX runs one a host), and "links": links[j] is this host's address on the cable to
  host j (each Thunderbolt cable its own subnet), null where there is none, or a list of its
  addresses on several cables to host j, preferred first; tcp then connects each pair of
  hosts over their first cable that answers, and over the hosts' "ips" (the management
  network) last: Layout.paths.
Every error names the file and line (or the host) and says what was expected.
"""

from __future__ import annotations

import json
import os
import re
import socket

from tbcoll.core.errors import HostfileError
from tbcoll.core.records import record

Rdma = str | tuple[str, ...] | None
Link = str | tuple[str, ...] | None  # a host's address(es) on the cable(s) to another host
CABLE, MANAGEMENT = "cable", "management"  # the kinds of Path
MAX_RANKS = 1 << 20  # more ranks (or slots on a host) than any job here could start
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit, which takes "²"
_NAME = re.compile(r"[A-Za-z0-9_.:\-\[\]@]+\Z")


@record
class Host:
    name: str  # what ssh connects to
    slots: int = 1  # ranks this host takes
    ips: tuple[str, ...] = ()  # where the other hosts reach it
    rdma: tuple[Rdma, ...] = ()  # rdma[j]: the device that reaches host j (None: itself)
    links: tuple[Link, ...] = ()  # links[j]: this host's address(es) on the cable(s) to host j

    @property
    def address(self) -> str:
        """Where the other hosts reach this one when no cable says otherwise."""
        return self.ips[0] if self.ips else self.name.rpartition("@")[2]


@record
class Hostfile:
    hosts: tuple[Host, ...]
    source: str  # where it came from, for messages
    backend: str = ""
    envs: tuple[str, ...] = ()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Hostfile:
        try:
            # utf-8-sig: a byte-order mark (Windows editors write one) is no part of a name
            with open(path, encoding="utf-8-sig") as f:
                text = f.read()
        except OSError as e:
            raise HostfileError(f"{path}: cannot read the hostfile ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise HostfileError(f"{path}: not a text hostfile (byte {e.start} is not UTF-8 "
                                "text)") from None
        if text.lstrip()[:1] in ("{", "["):
            return cls.from_json(text, str(path))
        return cls.from_text(text, str(path))

    @classmethod
    def from_text(cls, text: str, source: str) -> Hostfile:
        hosts: list[Host] = []
        first_line: dict[str, int] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{source}:{number}"
            words = line.split()
            name, slots = _name_and_count(words[0], where)
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if key in ("slots", "max_slots", "max-slots") and sep:
                    if key == "slots":
                        slots = _count(value, f"{where}: {word!r}")
                    continue
                raise HostfileError(f"{where}: {word!r} is not slots=N (a line is `host`, "
                                    "`host slots=N` or `host:N`)")
            if name in first_line:
                raise HostfileError(f"{where}: host {name!r} appears twice (first on line "
                                    f"{first_line[name]}); give it slots=N once instead")
            first_line[name] = number
            hosts.append(Host(name, slots))
        return cls(_nonempty(hosts, source), source)

    @classmethod
    def from_list(cls, spec: str) -> Hostfile:
        """-H a:2,b:2 (a host without :N takes one rank)."""
        hosts = []
        for item in spec.split(","):
            name, slots = _name_and_count(item.strip(), f"-H {spec}")
            if any(h.name == name for h in hosts):
                raise HostfileError(f"-H {spec}: host {name!r} appears twice; use {name}:N")
            hosts.append(Host(name, slots))
        return cls(_nonempty(hosts, f"-H {spec}"), f"-H {spec}")

    @classmethod
    def from_json(cls, text: str, source: str) -> Hostfile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HostfileError(f"{source}:{e.lineno}: not valid JSON ({e.msg})") from None
        backend, envs = "", ()
        if isinstance(data, dict):
            if not isinstance(data.get("hosts"), list):
                raise HostfileError(f"{source}: expected a list of hosts, or an object with "
                                    "\"hosts\": [...]")
            backend = data.get("backend", "")
            envs = data.get("envs", [])
            if not isinstance(backend, str) or not (isinstance(envs, list) and all(
                    isinstance(e, str) and "=" in e for e in envs)):
                raise HostfileError(f"{source}: \"backend\" must be a string and \"envs\" a "
                                    "list of \"NAME=VALUE\" strings")
            data = data["hosts"]
        if not isinstance(data, list):
            raise HostfileError(f"{source}: expected a list of hosts")
        count = len(data)
        hosts = [_json_host(entry, i, count, source) for i, entry in enumerate(data)]
        names = [h.name for h in hosts]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise HostfileError(f"{source}: host {i} repeats \"ssh\": {name!r}")
        _check_cable_ends(hosts, source)
        return cls(_nonempty(hosts, source), source, backend, tuple(envs))

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    def placement(self, nprocs: int, map_by: str = "slot") -> list[int]:
        """The host index of each rank: by slot fills each host before the next (mpirun's
        default), by node deals ranks round-robin over the hosts."""
        if nprocs > self.slots:
            raise HostfileError(f"{self.source}: {nprocs} ranks asked for but the hosts have "
                                f"{self.slots} slots in all; lower -np or add slots")
        order: list[int] = []  # built up to nprocs only: slots may be many more
        if map_by == "slot":
            for i, h in enumerate(self.hosts):
                order += [i] * min(h.slots, nprocs - len(order))
        elif map_by == "node":
            round_ = 0
            while len(order) < nprocs:
                order += [i for i, h in enumerate(self.hosts) if round_ < h.slots]
                round_ += 1
        else:
            raise HostfileError(f"--map-by {map_by!r}: use slot or node")
        return order[:nprocs]

    def layout(self, nprocs: int, map_by: str = "slot") -> Layout:
        """The resolved topology the ranks read (TBCOLL_HOSTFILE): the hosts that take ranks,
        in hostfile order, each with its ranks, its address and its per-pair link addresses."""
        placement = self.placement(nprocs, map_by)
        used = [i for i in range(len(self.hosts)) if i in placement]
        return Layout(tuple(
            JobHost(self.hosts[i].name, tuple(r for r, h in enumerate(placement) if h == i),
                    self.hosts[i].address,
                    tuple(self.hosts[i].links[j] for j in used) if self.hosts[i].links else ())
            for i in used))

    def is_full_mesh(self) -> bool:
        """Whether every pair of hosts has an RDMA device between them (cabled as a mesh)."""
        n = len(self.hosts)
        return n > 1 and all(len(h.rdma) == n and all(
            (dev is None) == (j == i) for j, dev in enumerate(h.rdma))
            for i, h in enumerate(self.hosts))


@record
class JobHost:
    """A host of a job as its ranks see it."""

    name: str
    ranks: tuple[int, ...]
    addr: str | None = None  # where the other hosts reach it (None: one host, no address)
    links: tuple[Link, ...] = ()  # links[j]: its address(es) on the cable(s) to the job's host j


@record
class Path:
    """One way from a host to another: a cable (number: its place among the pair's, from 1)
    or the management network (number 0); local: this host's address on it (listen there),
    remote: the other's (connect there); either None where the hostfile leaves it out."""

    kind: str  # CABLE or MANAGEMENT
    number: int
    local: str | None
    remote: str | None

    @property
    def name(self) -> str:
        """How messages name it: "cable 2" or "management"."""
        return f"{CABLE} {self.number}" if self.kind == CABLE else MANAGEMENT


@record
class Layout:
    """The resolved topology of a job (TBCOLL_HOSTFILE): the hosts that run ranks, in order.

    As JSON: {"hosts": [{"name": "mac1", "ranks": [0, 1], "addr": "10.0.1.1",
                         "links": [null, "192.168.0.1"]}, ...]}
    """

    hosts: tuple[JobHost, ...]

    @classmethod
    def of_hosts(cls, hosts: tuple[Host, ...] | list[Host]) -> Layout:
        """Every host of a hostfile, with no ranks: the paths between them (tbrun doctor)."""
        return cls(tuple(JobHost(h.name, (), h.address, h.links) for h in hosts))

    @classmethod
    def local(cls, nprocs: int) -> Layout:
        """Every rank on this machine (no hosts were given)."""
        return cls((JobHost("localhost", tuple(range(nprocs))),))

    @classmethod
    def from_json(cls, text: str) -> Layout:
        """ValueError (a json.JSONDecodeError, KeyError or TypeError inside) if it is none."""
        try:
            return cls(tuple(
                JobHost(h["name"], tuple(h["ranks"]), h.get("addr"),
                        tuple(_link(a) for a in h.get("links", ())))
                for h in json.loads(text)["hosts"]))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a resolved topology ({type(e).__name__}: {e})") from None

    def to_json(self) -> str:
        hosts = []
        for host in self.hosts:
            entry = {"name": host.name, "ranks": list(host.ranks)}
            if host.addr is not None:
                entry["addr"] = host.addr
            if host.links:
                entry["links"] = [list(a) if isinstance(a, tuple) else a for a in host.links]
            hosts.append(entry)
        return json.dumps({"hosts": hosts}, separators=(",", ":"))

    @property
    def single_host(self) -> bool:
        return len(self.hosts) <= 1

    @property
    def shares_hosts(self) -> bool:
        """The job spans several hosts, and some host runs more than one of its ranks (its
        tcp or rdma world then has two levels: tbcoll.hierarchy)."""
        return len(self.hosts) > 1 and any(len(host.ranks) > 1 for host in self.hosts)

    def node_of(self, rank: int) -> int | None:
        """The index of the host that runs rank."""
        return next((i for i, host in enumerate(self.hosts) if rank in host.ranks), None)

    def paths(self, i: int, j: int) -> tuple[Path, ...]:
        """The paths from host i to host j, preferred first: their cables in the order of the
        hostfile's "links" (an address either end leaves out is None there), then the
        management network (the hosts' addresses), if both have one. No path between a host and
        itself. The one source of where ranks of two hosts listen and connect."""
        if i == j:
            return ()
        here, there = self.hosts[i], self.hosts[j]
        mine, theirs = _addresses(here.links, j), _addresses(there.links, i)
        cables = tuple(
            Path(CABLE, k + 1, mine[k] if k < len(mine) else None,
                 theirs[k] if k < len(theirs) else None)
            for k in range(max(len(mine), len(theirs))))
        if here.addr is None or there.addr is None:
            return cables
        return (*cables, Path(MANAGEMENT, 0, here.addr, there.addr))

    def among(self, ranks: list[int]) -> Layout:
        """The layout of a job of these ranks alone (a shrunk communicator's survivors), rank
        ranks[i] renumbered i: hosts left with none dropped, and their cables with them."""
        kept = [i for i, host in enumerate(self.hosts) if set(host.ranks) & set(ranks)]
        return Layout(tuple(
            host._replace(ranks=tuple(sorted(ranks.index(r) for r in host.ranks if r in ranks)),
                          links=tuple(host.links[j] for j in kept if j < len(host.links)))
            for host in (self.hosts[i] for i in kept)))


def route_source(host: str) -> str:
    """This machine's address on the route to host, a name or an address (a UDP connect picks
    the route and sends nothing). OSError if host does not resolve or is unreachable."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]


def _addresses(links: tuple[Link, ...], j: int) -> tuple[str, ...]:
    """A host's addresses on its cables to host j, preferred first (none: no cable known)."""
    link = links[j] if j < len(links) else None
    return () if link is None else (link,) if isinstance(link, str) else tuple(link)


def _link(entry: object) -> Link:
    """A "links" entry of the resolved JSON: a list (several cables) becomes a tuple."""
    return tuple(entry) if isinstance(entry, list) else entry  # type: ignore[return-value]


def _nonempty(hosts: list[Host], source: str) -> tuple[Host, ...]:
    if not hosts:
        raise HostfileError(f"{source}: no hosts")
    return tuple(hosts)


def _count(text: str, where: str) -> int:
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_RANKS:
        raise HostfileError(f"{where}: expected a whole number of slots from 1 to {MAX_RANKS}, "
                            f"got {text!r}")
    return int(text)


def _name_and_count(word: str, where: str) -> tuple[str, int]:
    """'host' or 'host:N' (an IPv6 address, with several colons, is a name alone)."""
    if word.count(":") == 1:
        name, _, count = word.partition(":")
        slots = _count(count, f"{where}: {word!r}")
    else:
        name, slots = word, 1
    if not name or not _NAME.match(name):
        raise HostfileError(f"{where}: {name!r} is not a host name")
    return name, slots


def _json_host(entry: object, i: int, count: int, source: str) -> Host:
    if not isinstance(entry, dict) or not isinstance(entry.get("ssh"), str) or not entry["ssh"]:
        raise HostfileError(f"{source}: host {i} must be an object with \"ssh\": \"name\"")
    where = f"{source}: host {i} ({entry['ssh']!r})"
    ips = entry.get("ips", [])
    if not isinstance(ips, list) or not all(isinstance(ip, str) and ip for ip in ips):
        raise HostfileError(f"{where}: \"ips\" must be a list of addresses")
    rdma = entry.get("rdma", [])
    if not isinstance(rdma, list):
        raise HostfileError(f"{where}: \"rdma\" must be a list, one entry per host")
    if rdma and len(rdma) != count:
        raise HostfileError(f"{where}: \"rdma\" has {len(rdma)} entries but there are {count} "
                            "hosts; entry j names the device that reaches host j")
    devices: list[Rdma] = []
    for j, dev in enumerate(rdma):
        if dev is None or isinstance(dev, str):
            devices.append(dev)
        elif isinstance(dev, list) and dev and all(isinstance(d, str) for d in dev):
            devices.append(tuple(dev))
        else:
            raise HostfileError(f"{where}: rdma[{j}] must be a device name, a list of names "
                                "or null")
        if j == i and dev is not None:
            raise HostfileError(f"{where}: rdma[{i}] is the host itself and should be null")
    return Host(entry["ssh"], _json_slots(entry, where), tuple(ips), tuple(devices),
                _json_links(entry, i, count, where))


def _json_links(entry: dict, i: int, count: int, where: str) -> tuple[Link, ...]:
    """The host's "links": per host, its address on the cable to it, a list of its addresses
    on several cables to it (preferred first), or null."""
    links = entry.get("links", [])
    if not isinstance(links, list) or (links and len(links) != count):
        raise HostfileError(f"{where}: \"links\" must list, for each of the {count} hosts, this "
                            "host's address on the cable to it (a list of addresses for "
                            "several cables), or null")
    for j, link in enumerate(links):
        if link is None or (isinstance(link, str) and link):
            continue
        if not (isinstance(link, list) and link and all(isinstance(a, str) and a for a in link)):
            raise HostfileError(f"{where}: links[{j}] must be this host's address on the cable "
                                f"to host {j}, a list of its addresses on several cables to it "
                                f"(preferred first), or null; got {json.dumps(link)}")
        if len(set(link)) != len(link):
            raise HostfileError(f"{where}: links[{j}] lists an address twice: {json.dumps(link)}"
                                "; each cable has an address of its own")
    if links and links[i] is not None:
        raise HostfileError(f"{where}: links[{i}] is the host itself and should be null")
    return tuple(_link(a) for a in links)


def _check_cable_ends(hosts: list[Host], source: str) -> None:
    """Where both hosts of a pair give their addresses on the cables between them, they give
    as many: the k-th address of each is an end of the pair's k-th cable."""
    for i, host in enumerate(hosts):
        for j in range(i + 1, len(hosts)):
            mine, theirs = _addresses(host.links, j), _addresses(hosts[j].links, i)
            if mine and theirs and len(mine) != len(theirs):
                raise HostfileError(
                    f"{source}: host {i} ({host.name!r}): links[{j}] lists {len(mine)} "
                    f"address(es) but host {j} ({hosts[j].name!r})'s links[{i}] lists "
                    f"{len(theirs)}; the k-th address of each is an end of their k-th cable")


def _json_slots(entry: dict, where: str) -> int:
    """The host's "slots": one rank when left out, as MLX's hostfiles mean."""
    slots = entry.get("slots", 1)
    # bool is an int in Python, and json reads true as True: refused, as 2.0 and "2" are
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_RANKS:
        raise HostfileError(f"{where}: \"slots\" must be a whole number from 1 to {MAX_RANKS} "
                            f"(the ranks this host takes), got {json.dumps(slots)}")
    return slots
