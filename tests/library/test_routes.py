"""One Route per (communicator, collective) (tbcoll.comm.routes): a call declines downward once. A
plain shm all_reduce of any size is one C call from Python (sys.setprofile's 'c_call' events);
a call past what the lane takes (tcp's past 1 MiB) goes to the general path without entering
the lane to be refused; and no module of tbcoll reads the Communicator's private attributes."""

import ast
from pathlib import Path

import pytest

import tbcoll

from ..conftest import tagged_lines, tbrun

ENTERS_C_ONCE = """
import sys
import numpy as np
import tbcoll

comm = tbcoll.init()
r, p = comm.rank, comm.size
SIZES = (8, 1 << 20, 16 << 20)


def c_calls(call):
    '''call's result and the C functions Python called in it (a C function calling another
    is not seen: what counts is how often Python enters C).'''
    seen = []
    # (less the engine's words, which it publishes for C after Python used it: tcp's)
    sys.setprofile(lambda frame, event, arg: seen.append(getattr(arg, "__qualname__", "?"))
                   if event == "c_call" and frame.f_code.co_name != "publish_words" else None)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, seen[:-1]  # (less sys.setprofile itself)


for nbytes in SIZES:
    x = np.full(nbytes // 8, r + 1.0)
    want = p * (p + 1) / 2
    # (a peer later than C's wait has Python wait, or finish the call: then again)
    for _ in range(20 if comm.backend == "shm" or nbytes <= 1 << 20 else 1):
        y, seen = c_calls(lambda: comm.all_reduce(x))
        assert y.shape == x.shape and (y == want).all(), nbytes
        if comm.all_reduce(np.array(len(seen)), "max") == 1:
            break
    print("C", nbytes, len(seen), seen[:3], flush=True)


class Recording:
    '''The lane, recording each call made of it and whether it took the call.'''
    def __init__(self, lane):
        self.lane, self.calls = lane, []

    def __getattr__(self, name):
        method = getattr(self.lane, name)
        if name != "all_reduce":
            return method

        def all_reduce(x, op, out):
            result = method(x, op, out)
            self.calls.append((x.nbytes, result is not None))
            return result
        return all_reduce


comm._routes.lane = lane = Recording(comm._routes.lane)
comm._bind()
for nbytes in SIZES:
    x = np.full(nbytes // 8, r + 1.0)
    assert (comm.all_reduce(x) == p * (p + 1) / 2).all(), nbytes
print("LANE", lane.calls, flush=True)
if comm.backend == "shm":  # comm.empty's buffers: past a slot they are copied once, in Python
    x, out = comm.empty(1 << 18), comm.empty(1 << 18)  # 2 MiB each
    x[:] = r + 1.0
    calls = len(lane.calls)
    assert (comm.all_reduce(x, out=out) == p * (p + 1) / 2).all()
    assert (comm.all_reduce(np.full(1 << 10, r + 1.0)) == p * (p + 1) / 2).all()
    print("EMPTY", comm._all_reduce.__self__.largest, lane.calls[calls:], flush=True)
"""


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_call_enters_c_once_and_never_the_lane_to_be_refused(script, backend):
    """shm: an 8 B, 1 MiB or 16 MiB all_reduce is one C call from Python, its route's, which
    runs the lane (the 1 MiB and 16 MiB ones entered C 8 times before: the lane, which refused
    them, then the gate's enter, begin, count, the rounds, record, end, leave). tcp: up to the
    lane's 1 MiB one C call too; past it the general path (the gate, the exchanges), never
    the lane first (which took 16 MiB's to refuse it before). Once comm.empty has made shm
    buffers, their calls past a slot are the Python path's (one copy): the routes know it."""
    p = tbrun("--backend", backend, "-np", 2, "--comm-timeout", 30, script(ENTERS_C_ONCE),
              timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for lines in tagged_lines(p.stdout).values():
        counts = {int(line.split()[1]): int(line.split()[2]) for line in lines
                  if line.startswith("C ")}
        lane = next(line for line in lines if line.startswith("LANE"))
        if backend == "shm":
            assert counts == {8: 1, 1 << 20: 1, 16 << 20: 1}, lines
            assert lane == "LANE [(8, True), (1048576, True), (16777216, True)]", lines
            # the route, made again, sends the 2 MiB call of comm.empty's buffers past the lane
            assert "EMPTY 1048576 [(8192, True)]" in lines, lines
        else:
            # 1 MiB: the lane, whose exchange the engine finishes past C's wait (tcp_finish);
            # 16 MiB: the general path (the gate, the halves' exchanges): bounded
            assert counts[8] == 1 and counts[1 << 20] <= 100 and counts[16 << 20] <= 100, lines
            assert lane == "LANE [(8, True), (1048576, True)]", lines  # never 16 MiB's


# names that hold a Communicator outside its own module (tbcoll/comm/communicator.py)
PRIVATE_READERS = {"comm", "communicator"}


def private_reads(tree: ast.AST) -> list[str]:
    """Reads of a Communicator's private attributes: comm._x, communicator._x, self._comm._x."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in PRIVATE_READERS) or (
                isinstance(owner, ast.Attribute) and owner.attr == "_comm"):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_module_reads_the_communicators_private_attributes():
    """What a module needs of a Communicator (its gate, its world ranks, its lane) is handed to
    it (tbcoll.comm.routes.Routes, tbcoll.comm.ownership.track, tbcoll.observability.dumps'
    on_failure), never read off it: routes.py read seven of its private attributes, dumps.py
    and ownership.py its gate."""
    package = Path(tbcoll.__file__).parent
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "comm/communicator.py":
            continue
        if found := private_reads(ast.parse(path.read_text(), str(path))):
            offenders[str(path.relative_to(package))] = found
    assert offenders == {}
    assert private_reads(ast.parse("comm._gate\nself._comm._lane\ncomm.rank")) == [
        "comm._gate (line 1)", "self._comm._lane (line 2)"]


@pytest.mark.parametrize("kind", ["C", "Python"])
def test_a_routes_call_takes_its_first_step_only_where_it_may(kind):
    """tbcoll.comm._route.Call, and its Python twin where it is not built: the first step for
    a call whose arguments at `nones` are None and whose x is at most `largest` bytes, given
    the arguments at `picks`; the general path, given every argument as it came, for any other
    call and where the first step returns None."""
    import numpy as np

    from tbcoll.comm import routes

    if kind == "C" and routes.Call is None:
        pytest.skip("tbcoll.comm._route is not built")
    make = routes.Call if kind == "C" else routes.PyCall
    firsts = []

    def first(x, op, out):
        firsts.append(op)
        return None if op == "none" else "first"

    def general(*args):
        return ("general", len(args))

    run = make(first=first, general=general, nargs=4, picks=(0, 1, 3), nones=(2,),
               largest=64).run
    small, large = np.ones(8), np.ones(9)
    assert run(small, "sum", None, None) == "first"
    assert run(large, "sum", None, None) == ("general", 4)  # past largest: first not entered
    assert run(small, "sum", "ring", None) == ("general", 4)  # algorithm= given
    assert run(small, "none", None, None) == ("general", 4)  # first declined
    assert run([1.0], "sum", None, None) == ("general", 4)  # no nbytes: not the lane's
    assert firsts == ["sum", "none"]
    every = make(first=first, general=general, nargs=4, picks=(0, 1, 3), nones=(2,),
                 largest=-1)
    assert every.largest is None and every.run(large, "max", None, None) == "first"
    if kind == "C":
        with pytest.raises(TypeError):
            routes.Call(first, general, 4, (0,), (), -1)  # keywords only
        with pytest.raises(ValueError):
            routes.Call(first=first, general=general, nargs=4, picks=(4,), nones=(), largest=-1)


def test_the_public_methods_and_general_paths_take_the_routes_arguments_in_its_order():
    """C forwards a public method's arguments to the general path by position: both must name
    them as routes.ARGUMENTS does, in its order (a swapped pair would take each other's)."""
    import inspect

    from tbcoll.comm import routes
    from tbcoll.comm.communicator import Communicator

    for name, (names, picked, nones) in routes.ARGUMENTS.items():
        for method in (name, f"_general_{name}"):
            parameters = tuple(inspect.signature(getattr(Communicator, method)).parameters)[1:]
            assert parameters == names, (method, parameters, names)
        assert set(picked) | set(nones) <= set(names) and not set(picked) & set(nones)
