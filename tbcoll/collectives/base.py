"""What a collective's descriptor is (tbcoll.collectives holds them, one file each): the
Collective base class a descriptor fills in, the Call it makes of a public call, the Context
through which it sees its communicator, the registry (register: the gate's numbering of every
kind of call, KINDS, and each collective's algorithms and default rules), and the checks and
buffer helpers the descriptors, the Communicator and the routes share.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any
from weakref import WeakMethod

import numpy as np

from tbcoll.algorithms import function
from tbcoll.collectives import tuning
from tbcoll.core.arrays import is_mlx, to_numpy
from tbcoll.core.calls import FIELDS, signature
from tbcoll.core.dtypes import DTYPE_CODES
from tbcoll.core.errors import TbcollError
from tbcoll.core.names import ALGORITHMS, BUILT_IN, COLLECTIVES, KIND_CODES, KINDS, NAMES


class Context:
    """What a registry entry may use of the communicator a call was made on: its rank and
    size, its transport's native collectives (None: none) and the endpoint the algorithms run
    on, whether its one-call paths take mlx arrays, the algorithm a call runs (choose, from
    the algorithm of each collective whose choice does not depend on the size: fixed) and
    a call made inside another (run: scatter's header). The Communicator makes it (its
    _run held weakly: a context is kept by the communicator) and closes it."""

    __slots__ = ("rank", "size", "native", "coll", "takes_mlx", "fixed", "backend", "closed",
                 "agreed", "_table", "_run")

    def __init__(self, group: Any, backend: str, run: Callable[[Call], Any]) -> None:
        self.rank, self.size, self.backend = group.rank, group.size, backend
        self.native, self.coll = group.native, group.coll
        self.takes_mlx = group.native is not None and group.native.takes_mlx
        self._table, self._run = group.tuning, WeakMethod(run)
        self.fixed: dict[str, str | None] = dict.fromkeys(COLLECTIVES)
        self.closed = False
        self.agreed = False  # the ranks' registries were compared (Communicator.collective)

    def fix(self, overrides: dict[str, str]) -> None:
        """The algorithm of each collective where it does not depend on the size: TBCOLL_ALGO's
        (overrides, checked here), else the table's where it is one at every size."""
        for collective, algorithm in overrides.items():
            self.check_algorithm(collective, algorithm, "TBCOLL_ALGO")
        self.fixed.update({name: overrides.get(name) or tuning.fixed(self._table, name,
                                                                     self.size)
                           for name in COLLECTIVES})

    def close(self) -> None:
        """Every call from now on raises (choose)."""
        self.closed = True
        self.fixed.update(dict.fromkeys(COLLECTIVES))

    def run(self, call: Call) -> Any:
        return self._run()(call)

    def choose(self, collective: str, nbytes: int, algorithm: str | None) -> str:
        """The algorithm a call runs: algorithm=, else TBCOLL_ALGO, else the table."""
        if self.closed:
            raise TbcollError(f"{collective} on a closed communicator")
        if algorithm is not None:
            self.check_algorithm(collective, algorithm, "algorithm")
            return algorithm
        return self.fixed.get(collective) or tuning.choose(self._table, collective, nbytes,
                                                           self.size)

    def check_algorithm(self, collective: str, algorithm: str, where: str) -> None:
        allowed = ALGORITHMS[collective]
        if algorithm not in allowed:
            raise ValueError(f"{where}={algorithm!r} is not an algorithm of {collective}; "
                             f"use one of {', '.join(allowed)}")
        if algorithm == "native" and not self.has_native(collective):
            raise ValueError(f"{where}='native': the {self.backend} transport has no native "
                             f"{collective}; use one of {', '.join(allowed[:-1])}")

    def has_native(self, collective: str) -> bool:
        return self.native is not None and collective in self.native.offers


class Call:
    """One collective call as this rank made it, its arguments checked."""

    __slots__ = ("kind", "x", "array", "out", "op", "root", "algorithm", "restore", "state")

    def __init__(self, kind: Collective, x: Any, array: np.ndarray | None, out: Any, op: str | None,
                 root: int, algorithm: str, restore: Callable[[np.ndarray], Any],
                 state: Any = None) -> None:
        self.kind, self.x, self.array, self.out, self.op = kind, x, array, out, op
        self.root, self.algorithm, self.restore, self.state = root, algorithm, restore, state


def unchanged(result: np.ndarray) -> np.ndarray:
    """The restore of an input that was a numpy array already."""
    return result


# ids of the dtype objects of tbcoll.core.dtypes, which live as long as the process: a lookup by
# id costs a fraction of hashing a dtype (~0.15 us), on the latency-critical path
KNOWN_DTYPES = frozenset(id(dtype) for dtype in DTYPE_CODES)

DESCRIPTORS: dict[str, Collective] = {}  # by name, in registration order (register)


def as_numpy(x: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """tbcoll.core.arrays.to_numpy, with a numpy array of a known dtype taken as it is at once."""
    if type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES:
        return x, unchanged
    return to_numpy(x)


def plain_out(out: Any, shape: tuple, dtype: np.dtype) -> bool:
    """out is a numpy array a result of this shape and dtype can go into (a quick test; the
    full one, with its error messages, is `output`)."""
    return (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.carray)  # C-contiguous, aligned and writeable


def output(x: Any, out: Any, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    """out, checked (None stays None: the path that runs makes the result)."""
    if out is None:
        return None
    if is_mlx(x):
        raise TypeError("out= is not supported for mlx arrays (they are immutable); "
                        "use the returned array")
    if plain_out(out, shape, dtype):
        return out
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; "
                         f"expected shape {tuple(shape)} and dtype {dtype}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writeable")
    return out


def result_of(call: Call, shape: tuple, dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype) if call.out is None else call.out


def flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array."""
    return array if array.ndim == 1 else array.reshape(-1)


def check_rank(rank: Any, size: int, what: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not (
            0 <= rank < size):
        raise ValueError(f"{what}={rank!r} is not a rank of this communicator (0..{size - 1})")


def gathered_shape(array: np.ndarray, size: int) -> tuple[int, ...]:
    """size copies of array along axis 0 (a 0-d array gives (size,))."""
    return (size * array.shape[0], *array.shape[1:]) if array.ndim else (size,)


class Collective:
    """A collective's descriptor, everything about it in one place (its file in
    tbcoll/collectives/): the name; its argument checks and result shape (`call`, `prepare`,
    `finish`); the algorithms it may run (names of tbcoll.core.names.NAMES; "native" where a
    transport does it itself) and, for each, its implementation over P2P (`implementation`:
    the reference every transport can run); its default tuning rules (tbcoll.collectives.tuning: a
    transport's table may say otherwise); its benchmark descriptor (`bench`, nccl-tests'
    shape, tbcoll.collectives.bench; None: not benchmarked); and its test parameters (`cases`:
    each rank's inputs and expected results, which tests/spmd runs on every transport). The
    defaults suit a collective of one input array and one result."""

    name = ""
    code = -1  # the collective's KIND_CODES code, as the call gate records it (register)
    algorithms: tuple[str, ...] = ()
    rules: list[tuning.Rule] = []
    bench: Any = None

    def implementation(self, algorithm: str) -> Callable:
        """The function over P2P that runs this collective with algorithm (not "native"):
        by default the algorithm module's function of the collective's name."""
        return function(self.name, algorithm)

    def cases(self, rank: int, size: int) -> Iterable[Any]:
        """The test parameters (tbcoll.collectives.cases.Case) for this rank of size ranks."""
        return ()

    def plain(self, x: Any, arg: Any, out: Any, size: int) -> bool:
        """x (a numpy array of a known dtype), arg (op or root) and out (None, or a numpy array
        the result can go into) need no conversion and no check says more of them: a
        transport's one-call path may take the call as it is (tbcoll.comm.routes). arg is op for
        the reductions, root for broadcast, None for the others. False: the entry's `call`
        checks and describes it."""
        return False

    def signature(self, call: Call) -> int:
        array = call.array
        return signature(self.name, None if array is None else array.dtype, call.op,
                         0 if array is None else array.nbytes, call.root, call.algorithm)

    def described(self, call: Call) -> np.ndarray | None:
        """What TBCOLL_CHECK compares (dtype and shape)."""
        return call.array

    def run_direct(self, ctx: Context, path: Callable, call: Call) -> Any:
        """The transport's one-call path for an x that is not a numpy array (the dispatch
        calls it itself for those): an mlx array unconverted where the transport takes them,
        else its numpy view, into out where one was given (a numpy scalar's)."""
        if ctx.takes_mlx and (result := path(call.x, call.op, call.root,
                                                      None)) is not None:
            return result
        result = path(call.array, call.op, call.root, call.out)
        return None if result is None else call.restore(result)

    def alone(self, ctx: Context, call: Call) -> Any:
        """A world of one: prepare's buffers hold the answer (prepare knows size 1)."""
        self.prepare(ctx, call)
        return self.finish(ctx, call)

    def prepare(self, ctx: Context, call: Call) -> None:
        """Make the buffers native and algorithm need (call.state). A call it makes of its own
        (ctx.run) comes before this call in the communicator's sequence."""

    def finish(self, ctx: Context, call: Call) -> Any:
        return call.restore(call.state)


def register(descriptor: Collective) -> Collective:
    """Add a collective: its name gets the next code (in the calls' signatures, the call gate,
    TBCOLL_CHECK), so every rank must register the same descriptors in the same order, before
    it calls any of them (check_registries compares them at the first call). Registering the
    same descriptor again changes nothing."""
    name = descriptor.name
    if (known := DESCRIPTORS.get(name)) is not None:
        if known is descriptor or (type(known).__module__, type(known).__qualname__) == (
                type(descriptor).__module__, type(descriptor).__qualname__):
            return known
        raise ValueError(f"a collective named {name!r} is registered already")
    if not name.isidentifier() or name.startswith("_") or (name in KINDS
                                                           and name not in BUILT_IN):
        raise ValueError(f"collective name {name!r} must be an identifier, not one of the "
                         f"communicator's calls ({', '.join(KINDS)})")
    if unknown := [a for a in descriptor.algorithms if a not in NAMES]:
        raise ValueError(f"collective {name!r}: algorithms {unknown} are not algorithm names "
                         f"({', '.join(NAMES)})")
    if not descriptor.rules or descriptor.rules[-1][:2] != (None, None):
        raise ValueError(f"collective {name!r}: its rules must end with a catch-all rule "
                         "(None, None, algorithm)")
    if name not in BUILT_IN:
        _, bits = FIELDS["collective"]
        if len(COLLECTIVES) + 1 >= 1 << bits:
            raise ValueError(f"no room for collective {name!r}: the calls' signature numbers "
                             f"{(1 << bits) - 1} collectives ({bits} bits), all taken")
        COLLECTIVES.append(name)
        KINDS.append(name)
        KIND_CODES[name] = len(KINDS) - 1
    descriptor.code = KIND_CODES[name]
    ALGORITHMS[name] = tuple(descriptor.algorithms)
    tuning.DEFAULTS[name] = list(descriptor.rules)
    DESCRIPTORS[name] = descriptor
    for hook in ON_REGISTER:
        hook(name)
    return descriptor


ON_REGISTER: list[Callable[[str], None]] = []  # told each new collective's name (the Communicator)


def registry_digest() -> int:
    """The registered collectives' names in order, as a number that ranks can compare."""
    return zlib.crc32(",".join(COLLECTIVES[len(BUILT_IN):]).encode())


def registered_mismatch() -> str:
    """The error for ranks whose registries differ."""
    mine = ", ".join(COLLECTIVES[len(BUILT_IN):]) or "none"
    return (f"the ranks registered different collectives, or in another order (this rank: "
            f"{mine}); register the same descriptors in the same order on every rank, "
            "before calling any of them")
