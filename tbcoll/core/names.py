"""The names every layer numbers alike: the collectives, the algorithms, and every kind of
call the gate records. A name's code is its index here, in Python and in the call signature
(tbcoll.core.calls) alike; tbcoll.algorithms holds the code behind each algorithm's name,
"native" is the transport's own (tbcoll.core.protocols.Native).

The built-in collectives come first; a registered one (tbcoll.register_collective, through
tbcoll.collectives.base.register) is appended to COLLECTIVES and KINDS, so the ranks must
register in the same order. Which algorithms may run which collective (ALGORITHMS) is each
descriptor's, filled in as they are registered."""

BUILT_IN = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
            "gather", "scatter", "reduce")
COLLECTIVES: list[str] = list(BUILT_IN)  # then the registered ones, in their order
ALGORITHMS: dict[str, tuple[str, ...]] = {}  # each collective's algorithms (its descriptor's)
NAMES = ("ring", "mesh", "rd", "pairwise", "bruck", "tree", "native")  # every algorithm's name
ALGORITHM_CODES = {name: code for code, name in enumerate(NAMES)}  # as tbcoll.core.gate records
# the collectives a transport's C lane may take, in the order of its kinds (bit k of a lane's
# bind; shm's _atomics exports its names as LANE_KINDS, checked as it is imported)
LANE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# every kind of call, as the call gate numbers them: the built-in collectives' codes are theirs
# above; the registered collectives come after the calls that are not collectives
KINDS: list[str] = [*BUILT_IN, "send", "recv", "split", "empty", "isend", "irecv"]
KIND_CODES = {name: code for code, name in enumerate(KINDS)}
