"""The names every layer numbers alike: the collectives, the algorithms that may run each, and
every kind of call the gate records. A name's code is its index here, in Python and in the
call signature (tbcoll.core.calls) alike; tbcoll.algorithms holds the code behind each
algorithm's name, "native" is the transport's own (tbcoll.core.protocols.Native)."""

_DATA = ("ring", "mesh", "rd", "native")
_ROOTED = ("tree", "mesh", "native")
ALGORITHMS: dict[str, tuple[str, ...]] = {  # which algorithm can run which collective
    "all_reduce": _DATA, "all_gather": _DATA, "reduce_scatter": _DATA, "broadcast": _DATA,
    "barrier": ("rd", "native"),
    "all_to_all": ("pairwise", "bruck", "mesh", "native"),
    "gather": _ROOTED, "scatter": _ROOTED, "reduce": _ROOTED,
}
COLLECTIVES = tuple(ALGORITHMS)
NAMES = ("ring", "mesh", "rd", "pairwise", "bruck", "tree", "native")  # every algorithm's name
ALGORITHM_CODES = {name: code for code, name in enumerate(NAMES)}  # as tbcoll.core.gate records
# the collectives a transport's C lane may take, in the order of its kinds (bit k of a lane's
# bind; shm's _atomics exports its names as LANE_KINDS, checked as it is imported)
LANE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# every kind of call, as the call gate numbers them (the collectives' codes are theirs above)
KINDS = (*COLLECTIVES, "send", "recv", "split", "empty", "isend", "irecv")
KIND_CODES = {name: code for code, name in enumerate(KINDS)}
