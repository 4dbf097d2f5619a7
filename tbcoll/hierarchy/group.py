"""The two-level Group (tbcoll.core.protocols.Group), and how a job's world opens one."""

from __future__ import annotations

from tbcoll.comm.communicator import Communicator
from tbcoll.core.protocols import Group
from tbcoll.hierarchy.hosts import Hosts
from tbcoll.hierarchy.native import TwoLevelNative, failure_notice
from tbcoll.hierarchy.p2p import TwoLevelP2P
from tbcoll.job.env import LaunchInfo
from tbcoll.transports.shm.transport import ShmGroup, open_host
from tbcoll.transports.stream import StreamEndpoint
from tbcoll.transports.tcp.transport import TcpGroup, TcpTransport, connect


class TwoLevelGroup:
    """A group whose ranks run on several hosts, some with several ranks: the host's ranks
    share a shm group; ranks on different hosts reach each other over one tcp transport
    (a connection per pair of ranks on different hosts, none inside a host), which also
    carries the rails (rank k of every host; rail 0, the leaders, runs the network step of
    the collectives unless the world's leaders have an rdma group of their own)."""

    tuning = "hosts"
    allocate = None  # comm.empty: plain arrays
    world_peers = True  # each level's failures name world ranks (TwoLevelP2P, the steps')
    # a revocation reaches each level's waits (revoke), not the outer call gate
    revocation = None

    def __init__(self, hosts: Hosts, world: tuple[int, ...], local: ShmGroup,
                 network: TcpTransport, context: int, owns_network: bool,
                 rails: bool, leaders: Group | None = None) -> None:
        """world: the world rank of each group rank (the network's ranks); context: the
        network's first context of this group (it takes 2 + 2 a rail); rails: whether large
        all_reduces may take the rails (tcp); leaders: the leaders' own Group (rdma, on
        leaders only), else rail 0 over the network."""
        self._hosts, self._world, self._network = hosts, world, network
        self._context, self._owns, self._take_rails = context, owns_network, rails
        self.rank, self.size, self.local_rank = hosts.rank, len(world), hosts.local_rank
        timeout = network.timeout
        # the host's endpoints are this group's own, apart from those its local communicator's
        # calls use (each endpoint carries the call its messages belong to)
        self.p2p = TwoLevelP2P(hosts, world, local.endpoint(2),
                               StreamEndpoint(network, context, list(world)), timeout)
        local_coll, network_coll = local.endpoint(3), StreamEndpoint(network, context + 1,
                                                                     list(world))
        self.coll = TwoLevelP2P(hosts, world, local_coll, network_coll, timeout)
        self._coll_endpoints = (local_coll, network_coll)
        self._local_group = local
        self._local = Communicator(local, "shm", hosts.local_rank, hosts.node,
                                   self._worlds(hosts.here))
        self._rails = self._open_rails(leaders)
        self._groups = [local, *(group for group, _ in self._rails.values())]
        leading = self._rails.get(0, (None, None))[1] if len(hosts.by_host) > 1 else None
        rail = self._rails.get(hosts.local_rank, (None, None))[1] \
            if rails and hosts.even else None
        self.native = TwoLevelNative(hosts, self._local, leading, rail, self._failed)

    def _worlds(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self._world[r] for r in ranks)

    def _open_rails(self, leaders: Group | None) -> dict[int, tuple[Group, Communicator]]:
        """This rank's rails, each (its Group, its Communicator): rail 0 where it leads its
        host, its own where the rails are taken. Every rail's contexts are taken on every
        rank, so that the next split agrees on its own."""
        hosts, rails = self._hosts, {}
        for k in range(hosts.rails):
            members = hosts.rail(k)
            context = self._context + 2 + 2 * k
            self._network.new_group(context, hosts.rank in members)
            if hosts.rank not in members:
                continue
            if k == 0 and leaders is not None:
                group, backend = leaders, "rdma"
            elif k == 0 or (self._take_rails and hosts.even):
                group = TcpGroup(self._network, context, list(self._worlds(members)), False)
                backend = "tcp"
            else:
                continue
            rails[k] = group, Communicator(group, backend, 0, hosts.node, self._worlds(members))
        return rails

    def begin_call(self, seq: int, signature: int) -> None:
        """For tbcoll's algorithms over this group's point-to-point: both levels' messages
        carry the call (the native collectives' steps are their own communicators' calls)."""
        for endpoint in self._coll_endpoints:
            endpoint.begin_call(seq, signature)

    def end_call(self) -> None:
        pass  # each level compares the calls as its messages arrive

    def revoke(self, notice: str) -> None:
        for group in self._groups:
            group.revoke(notice)
        with self._network.turns:
            self._network.revoke(self._context, self._world, notice)

    def _failed(self, error: BaseException) -> None:
        """A two-level step raised error: no rank may wait for the steps that follow."""
        self.revoke(failure_notice(self._world[self.rank], error))

    def context_hint(self) -> int:
        return self._network.next_context

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> TwoLevelGroup | None:
        hosts = self._hosts
        here = [hosts.local_index(m) for m in members if hosts.nodes[m] == hosts.node]
        local = self._local_group.split(color, key, here, context)
        self._network.new_group(context, color is not None)
        # the rails of every sub-group lie below these contexts (no rank knows the others')
        self._network.new_group(context + 2 * hosts.rails, False)
        if color is None:
            return None
        return TwoLevelGroup(hosts.sub(members), self._worlds(tuple(members)), local,
                             self._network, context, False, self._take_rails)

    def describe_links(self) -> list[str]:
        hosts = self._hosts
        lines = [f"  two levels: ranks {list(hosts.here)} share this host's memory (shm); "
                 f"{len(hosts.by_host)} hosts, leaders {list(hosts.rail(0))}"
                 + (f", {hosts.rails} rails" if self._take_rails and hosts.even else "")]
        lines += [f"  to rank {r}: {self._network.describe_path(self._world[r])}"
                  for r in range(self.size) if hosts.nodes[r] != hosts.node]
        return lines

    def close(self) -> None:
        for _, comm in self._rails.values():
            comm.close()
        self._local.close()
        if self._owns:
            self._network.close()


def open_world(backend: str, info: LaunchInfo, prefix: str) -> tuple[TwoLevelGroup, int, int]:
    """The world of a job over several hosts some of which run several ranks: a shm segment
    per host, a tcp connection per pair of ranks on different hosts, and on rdma a group of
    the leaders over the hosts' devices (one context a device a host)."""
    hosts = Hosts(tuple(info.topology.node_of(r) for r in range(info.size)), info.rank)
    others = frozenset(r for r in range(info.size) if hosts.nodes[r] != hosts.node)
    local = open_host(info, f"{prefix}/host{hosts.node}", list(hosts.here))
    opened = [local]
    try:
        network = connect(info, f"{prefix}/network", others)
        opened.append(network)
        leaders = None
        if backend == "rdma" and hosts.local_rank == 0:
            from tbcoll.transports.rdma.transport import open_group
            leaders = open_group(info, f"{prefix}/leaders", list(hosts.rail(0)))
        group = TwoLevelGroup(hosts, tuple(range(info.size)), local, network, 0, True,
                              backend == "tcp", leaders)
    except BaseException:
        for part in reversed(opened):
            part.close()
        raise
    return group, hosts.local_rank, hosts.node
