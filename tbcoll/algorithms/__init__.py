"""Collective algorithms written once over the P2P interface of tbcoll.transports.base.

MODULES says where each lives: a module offers a function named after each collective it runs
(ring, mesh and rd the four data collectives, rd also barrier; mesh, pairwise, bruck and tree
the all-to-all and rooted ones). Which collective may run which algorithm is its descriptor's
(tbcoll.collectives). "native" is the transport's own (transports.base.Native). Buffers are 1-D
contiguous numpy arrays; ranks are the communicator's. No module here imports a transport.

COLLECTIVES is the collectives' names in the order of their codes (calls' signatures, the call
gate, TBCOLL_CHECK): the built-ins here, then those registered (tbcoll.register_collective
appends, in registration order, which must be the same on every rank).
"""

from tbcoll.algorithms import bruck, mesh, pairwise, rd, ring, tree

MODULES = {"ring": ring, "mesh": mesh, "rd": rd, "pairwise": pairwise, "bruck": bruck,
           "tree": tree}
FAMILIES = {name: MODULES[name] for name in ("ring", "mesh", "rd")}  # tuned by bench.model

BUILT_IN = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
            "gather", "scatter", "reduce")
COLLECTIVES: list[str] = list(BUILT_IN)  # grows by registration (see the module docstring)
NAMES = (*MODULES, "native")  # every algorithm's name
ALGORITHM_CODES = {name: code for code, name in enumerate(NAMES)}  # as tbcoll.gate records


def function(collective: str, algorithm: str):  # noqa: ANN201 (the algorithm's own signature)
    """The function that runs collective with algorithm (not "native")."""
    return getattr(MODULES[algorithm], collective)
