"""Collective algorithms written once over the P2P interface of tbcoll.transports.base.

ALGORITHMS is the one list of which algorithm can run which collective; MODULES says where
each lives: a module offers a function named after each collective it runs (ring, mesh and
rd the four data collectives, rd also barrier; mesh, pairwise, bruck and tree the all-to-all
and rooted ones). "native" is the transport's own (transports.base.Native). Buffers are 1-D
contiguous numpy arrays; ranks are the communicator's. No module here imports a transport.
"""

from tbcoll.algorithms import bruck, mesh, pairwise, rd, ring, tree

MODULES = {"ring": ring, "mesh": mesh, "rd": rd, "pairwise": pairwise, "bruck": bruck,
           "tree": tree}
FAMILIES = {name: MODULES[name] for name in ("ring", "mesh", "rd")}  # tuned by bench.model

_DATA = ("ring", "mesh", "rd", "native")
_ROOTED = ("tree", "mesh", "native")
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": _DATA, "all_gather": _DATA, "reduce_scatter": _DATA, "broadcast": _DATA,
    "barrier": ("rd", "native"),
    "all_to_all": ("pairwise", "bruck", "mesh", "native"),
    "gather": _ROOTED, "scatter": _ROOTED, "reduce": _ROOTED,
}
COLLECTIVES = tuple(ALGORITHMS)
NAMES = (*MODULES, "native")  # every algorithm's name
ALGORITHM_CODES = {name: code for code, name in enumerate(NAMES)}  # as tbcoll.gate records


def function(collective: str, algorithm: str):  # noqa: ANN201 (the algorithm's own signature)
    """The function that runs collective with algorithm (not "native")."""
    return getattr(MODULES[algorithm], collective)
