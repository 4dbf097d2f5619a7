"""Collective algorithms written once over the P2P interface of tbcoll.core.protocols.

tbcoll.core.names lists which algorithm can run which collective; MODULES says where each
lives: a module offers a function named after each collective it runs (ring, mesh and
rd the four data collectives, rd also barrier; mesh, pairwise, bruck and tree the all-to-all
and rooted ones). "native" is the transport's own (tbcoll.core.protocols.Native). Buffers are
1-D contiguous numpy arrays; ranks are the communicator's. No module here imports a transport.
"""

from tbcoll.algorithms import bruck, mesh, pairwise, rd, ring, tree
from tbcoll.core.names import NAMES

MODULES = {"ring": ring, "mesh": mesh, "rd": rd, "pairwise": pairwise, "bruck": bruck,
           "tree": tree}
FAMILIES = {name: MODULES[name] for name in ("ring", "mesh", "rd")}  # tuned by bench.model

if tuple(MODULES) != NAMES[:-1]:
    raise ImportError(f"tbcoll.core.names.NAMES {NAMES} must list every module here "
                      f"{tuple(MODULES)}")


def function(collective: str, algorithm: str):  # noqa: ANN201 (the algorithm's own signature)
    """The function that runs collective with algorithm (not "native")."""
    return getattr(MODULES[algorithm], collective)
