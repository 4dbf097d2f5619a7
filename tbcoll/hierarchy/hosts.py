"""Where a group's ranks run: which share a host, who leads each host, the rails."""

from __future__ import annotations


class Hosts:
    """nodes[r]: the job's index of group rank r's host; rank: this rank in the group."""

    def __init__(self, nodes: tuple[int, ...], rank: int) -> None:
        self.nodes, self.rank = nodes, rank
        self.node = nodes[rank]
        # each host's group ranks, ascending, hosts in the order of their lowest rank
        self.by_host = {node: tuple(r for r, n in enumerate(nodes) if n == node)
                        for node in dict.fromkeys(nodes)}
        self.here = self.by_host[self.node]  # the group ranks on this rank's host
        self.local_rank = self.here.index(rank)
        self.host_sizes = tuple(len(ranks) for ranks in self.by_host.values())
        # how many ranks the fullest host runs: rail k is the k-th rank of every host
        self.rails = max(self.host_sizes)
        self.even = len(set(self.host_sizes)) == 1
        # the group ranks host by host: the order of a gather through the leaders, and where
        # this host's ranks start in it
        self.host_major = tuple(r for ranks in self.by_host.values() for r in ranks)
        self.host_start = self.host_major.index(self.here[0])

    def local_index(self, rank: int) -> int:
        return self.by_host[self.nodes[rank]].index(rank)

    def rail(self, k: int) -> tuple[int, ...]:
        """The k-th rank of each host that has one, in host order; rail 0: the leaders."""
        return tuple(ranks[k] for ranks in self.by_host.values() if k < len(ranks))

    def host_of_leader(self, rank: int) -> int:
        """The index among the leaders of the host that runs rank."""
        return list(self.by_host).index(self.nodes[rank])

    def sub(self, members: list[int]) -> Hosts | None:
        """The hosts of the sub-group of members (in new rank order), or None where this rank
        is not one of them."""
        if self.rank not in members:
            return None
        return Hosts(tuple(self.nodes[m] for m in members), members.index(self.rank))
