"""A communicator's call gate (tbcoll.core.gate: tbcoll/core/_gate.c and include/gate.h): its lock,
its calls in progress, its count and its flight recorder, in C (and its Python twin, alike); the
shm lane drives the same struct from C; a dump's call in progress is the gate's, whichever
path the call took, with the user's line read off the thread that runs it."""

import ctypes
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tbcoll.collectives import ALL_REDUCE, BROADCAST
from tbcoll.core import gate as gates
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.errors import CommRevokedError, TbcollError
from tbcoll.core.names import ALGORITHM_CODES, KIND_CODES

from ..conftest import tagged_lines, tbrun

F32 = np.dtype(np.float32)
RING = ALGORITHM_CODES["ring"]


@pytest.fixture(params=["C", "Python"])
def gate_type(request):
    if request.param == "C":
        if gates.Gate is gates.PyGate:
            pytest.fail("tbcoll.core._gate was not built (make)")
        return gates.Gate
    return gates.PyGate


def call(gate, kind=ALL_REDUCE.code, dtype=F32, op="sum", root=-1, nbytes=8,
         algorithm=gates.NATIVE, timed=0):
    """A whole call through the gate, as the one-call paths make it: its seq."""
    slot = gate.enter(kind, dtype, op, root, nbytes, algorithm, timed)
    assert slot >= 0
    gate.done(slot)
    gate.leave(slot)
    return gate.completed


def test_the_recorder_wraps_and_keeps_the_last_calls_in_order(gate_type):
    gate = gate_type(4)
    for k in range(10):
        call(gate, nbytes=k, timed=k % 2)
    calls = gate.calls()
    assert [c[0] for c in calls] == [7, 8, 9, 10]
    seq, kind, dtype, op, root, nbytes, algorithm, start, end = calls[-1]
    assert (kind, dtype, op, root, nbytes, algorithm) == (
        ALL_REDUCE.code, DTYPE_CODES[F32], OP_CODES["sum"], -1, 9, gates.NATIVE)
    assert 0 < start <= end  # timed: perf_counter()'s clock
    assert calls[-2][7:] == (0.0, 0.0)  # not timed
    assert gate.last() == calls[-1]
    assert gate_type(0).calls() == [] and call(gate_type(0)) == 1  # off: counted, not kept


def test_a_second_call_is_refused_and_a_forked_child_is_told_why(gate_type):
    gate = gate_type(8)
    slot = gate.enter(BROADCAST.code, None, None, 1, 0, -1, 0)
    assert slot >= 0 and gate.held
    assert gate.enter(ALL_REDUCE.code, F32, "sum", -1, 8, gates.NATIVE, 0) == -1
    assert gate.enter_move(KIND_CODES["send"], F32, 1, 0, 8) == -1
    gate.leave(slot)
    assert not gate.held and gate.current() is None
    gate.fork(TbcollError, "not the rank")
    with pytest.raises(TbcollError, match="not the rank"):
        gate.enter(ALL_REDUCE.code, F32, "sum", -1, 8, gates.NATIVE, 0)
    assert gate.forked


def test_a_revoked_gate_refuses_every_call_with_the_first_revocation(gate_type):
    gate = gate_type(8)
    assert not gate.revoked
    gate.revoke(CommRevokedError, "rank 0 was interrupted in all_reduce")
    gate.revoke(CommRevokedError, "a second revocation")
    assert gate.revoked and not gate.held
    for enter in (lambda: gate.enter(ALL_REDUCE.code, F32, "sum", -1, 8, gates.NATIVE, 0),
                  lambda: gate.enter_move(KIND_CODES["recv"], F32, 1, 0, 8)):
        with pytest.raises(CommRevokedError, match="^rank 0 was interrupted in all_reduce$"):
            enter()
    gate.fork(TbcollError, "not the rank")  # a forked child's reason comes first
    with pytest.raises(TbcollError, match="not the rank"):
        gate.enter(ALL_REDUCE.code, F32, "sum", -1, 8, gates.NATIVE, 0)


def test_the_call_in_progress_is_the_innermost_and_its_codes_come_from_the_registries(
        gate_type):
    gate = gate_type(8)
    outer = gate.enter(KIND_CODES["split"], None, None, -1, -1, -1, 0)
    inner = gate.begin(KIND_CODES["all_gather"], np.dtype(np.int64), None, -1, 32, RING)
    now = dict(zip(gates.CURRENT, gate.current(), strict=True))
    assert now["kind"] == KIND_CODES["all_gather"] and now["dtype"] == DTYPE_CODES[
        np.dtype(np.int64)] and now["algorithm"] == RING and now["seq"] == 0 and now["start"]
    assert gate.count(inner) == 1 and gate.current()[0] == 1
    gate.record(inner)
    gate.end(inner)
    assert gate.current()[1] == KIND_CODES["split"]
    gate.leave(outer)
    move = gate.enter_move(KIND_CODES["recv"], np.dtype("float32"), 3, 7, 12)  # (equal, not
    now = dict(zip(gates.CURRENT, gate.current(), strict=True))              # the same)
    assert (now["dtype"], now["peer"], now["tag"], now["op"], now["root"]) == (
        DTYPE_CODES[F32], 3, 7, -1, -1)
    gate.leave(move)
    unknown = gate.enter(ALL_REDUCE.code, np.dtype(np.complex64), "xor", -1, 8, -1, 0)
    assert gate.current()[2:4] == (-1, -1)  # not the registries': none
    gate.leave(unknown)


def _capsule(version: int, size: int, name: bytes = b"tbcoll.lane.v1"):
    """A capsule as a transport built from another tbcoll/include/lane.h would hand out: its
    struct's version and size as given, the rest zero (never read: refused first)."""
    make = ctypes.pythonapi.PyCapsule_New
    make.restype, make.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_void_p,
                                                     ctypes.c_void_p]
    struct = (ctypes.c_uint32 * 64)(version, size)
    named = ctypes.create_string_buffer(name)
    capsule = make(ctypes.addressof(struct), ctypes.addressof(named), None)
    return capsule, (struct, named)  # (kept alive as long as the capsule is used)


def test_the_lane_interface_is_versioned_and_binds_only_a_gate():
    """A transport's lane offers tbcoll/include/lane.h's struct in a "tbcoll.lane.v1" capsule;
    the gate's extension runs the whole call around it (LaneCall) and refuses a struct of
    another version or size (a transport built from another lane.h) or another capsule,
    saying what to do; bind takes nothing but a Gate. Without the gate's extension the shm
    backend refuses, saying why."""
    from tbcoll.core import _gate
    from tbcoll.core.gate import lane_call
    from tbcoll.transports.shm import _atomics, native

    lane = _atomics.Lane(segment=bytearray(1 << 16), flags=64, size=2, rank=0,
                         sets=[4096, 8192], slot_bytes=256, budget=0.01, resume=None, pids=0)
    lane.calls(single_pass=128, all_reduce=native._ALL_REDUCE, all_gather=native._ALL_GATHER,
               reduce_scatter=native._REDUCE_SCATTER, broadcast_call=native._broadcast_call)
    calls = lane_call(lane)
    assert calls.kinds == 0b11111  # the four collectives, send and recv
    with pytest.raises(TypeError, match="Gate"):
        calls.bind(gate=gates.PyGate(4), codes=(0,) * 7, names=("a",) * 4, enabled=0,
                   max_tag=1, comm_error=TbcollError, namer=None)
    arrays = {"ndarray": np.ndarray, "dtypes": tuple(DTYPE_CODES), "ops": {"sum": 0},
              "empty": np.empty}
    for version, size, says in [(2, _gate.LANE_SIZE, "offers lane interface version 2 "),
                                (1, _gate.LANE_SIZE - 8, f"version 1 ({_gate.LANE_SIZE - 8} "
                                                         "bytes)")]:
        capsule, kept = _capsule(version, size)
        with pytest.raises(ImportError, match=re.escape(says)) as refused:
            _gate.LaneCall(capsule, **arrays)
        assert str(refused.value).endswith("reinstall tbcoll (make, or pip install -e .)")
    capsule, kept = _capsule(1, _gate.LANE_SIZE, b"tbcoll.lane.v0")
    with pytest.raises(TypeError, match='a capsule named "tbcoll.lane.v0"'):
        _gate.LaneCall(capsule, **arrays)
    missing = subprocess.run([sys.executable, "-c", (
        "from tbcoll.transports.shm import native; native.LaneCall = None\n"
        "native.available()")],
        capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and (
        "TbcollError: the shm backend needs tbcoll's call gate extension (tbcoll.core._gate), "
        "which was not built: reinstall tbcoll (make)") in missing.stderr, missing.stderr


def _shm_lane(slot_bytes: int = 256, single_pass: int = 128):
    """A shm Lane of 2 ranks over a private buffer (never run: its admission is asked)."""
    from tbcoll.transports.shm import _atomics, native

    lane = _atomics.Lane(segment=bytearray(1 << 16), flags=64, size=2, rank=0,
                         sets=[4096, 8192], slot_bytes=slot_bytes, budget=0.01, resume=None,
                         pids=0)
    lane.calls(single_pass=single_pass, all_reduce=native._ALL_REDUCE,
               all_gather=native._ALL_GATHER, reduce_scatter=native._REDUCE_SCATTER,
               broadcast_call=native._broadcast_call)
    return lane


def test_one_admission_predicate_for_c_and_python():
    """Whether a call may take a lane is said in one C function (tbcoll/admits.c, with the
    lane's limits in one_call.c): LaneCall asks it before each call, and Python asks the same
    one (LaneCall.admits for a bound lane, tbcoll.core.gate.plain for a direct path without a
    lane), not a copy of its own."""
    from tbcoll.comm.routes import ROUTED
    from tbcoll.core.gate import lane_call, plain

    ar, ag, rs, bc = range(4)
    f4 = np.ones(2, np.float32)  # 8 B
    cases = [  # (kind, x, arg, out, admitted by its arguments)
        (ar, f4, "sum", None, True),
        (ar, f4, "xor", None, False),
        (ar, f4, "sum", np.empty(2, np.float64), False),
        (ar, f4, "sum", np.empty(3, np.float32), False),
        (ar, np.ones(4, np.float32)[::2], "sum", None, False),
        (ar, f4[:0], "sum", None, False),
        (ar, f4.astype(np.complex64), "sum", None, False),
        (ar, [1.0, 2.0], "sum", None, False),
        (ag, f4, None, np.empty(4, np.float32), True),
        (ag, f4, None, np.empty(3, np.float32), False),
        (rs, np.ones(3, np.float32), "max", None, False),
        (rs, np.ones(4, np.int64), "max", np.empty(2, np.int64), True),
        (bc, f4, 1, None, True),
        (bc, f4, 2, None, False),
        (bc, f4, True, None, False),
        (bc, f4, -1, f4, False),
    ]
    calls = lane_call(lane := _shm_lane())
    assert not calls.admits(ar, f4, "sum", None)  # not bound: no kind enabled
    calls.bind(gate=gates.Gate(4), codes=(0,) * 7, names=tuple(e.name for e in ROUTED),
               enabled=0b11111, max_tag=7, comm_error=TbcollError, namer=None)
    for kind, x, arg, out, admitted in cases:
        assert calls.admits(kind, x, arg, out) is admitted, (kind, x, arg, out)
        assert plain(kind, x, arg, out, 2) is admitted, (kind, x, arg, out)
    big = np.ones(64, np.float32)  # 256 B: past single_pass (all_reduce's), a slot for the others
    # shm's lane takes every size (its rounds past one): its limits, and the route's, say so
    assert calls.admits(ar, big, "sum", None) and calls.limit(ar) is None
    lane.takes(ar, 128)  # as once comm.empty's buffers exist: no further than the Python path
    lane.takes(ag, 256)
    assert plain(ar, big, "sum", None, 2) and not calls.admits(ar, big, "sum", None)
    assert calls.admits(ag, big, None, None) and not calls.admits(ag, np.ones(65, np.float32),
                                                                    None, None)
    assert (calls.limit(ar), calls.limit(ag)) == (128, 256)
    calls.limit(ar, 4)  # the table's largest: less than the lane's
    assert not calls.admits(ar, f4, "sum", None) and calls.admits(ar, f4[:1], "sum", None)
    assert calls.limit(ar) == 4


IN_PROGRESS = """
import itertools, json, os, threading, time, numpy as np, tbcoll
from tbcoll.observability.dumps import snapshot
comm = tbcoll.init()
x = np.ones(2, np.float32)
comm.all_reduce(x)
steps = itertools.count()

def show(shown):
    print(json.dumps(snapshot("asked")["communicators"][0]["current"]), flush=True)
    open(shown, "w").close()

def later():
    # rank 0's dump, taken half a second into its next call; rank 1 joins that call only
    # once the dump is taken (a file in the job's folder says so), not after a guessed time
    shown = f"shown-{next(steps)}"
    if comm.rank == 0:
        threading.Timer(0.5, show, (shown,)).start()
    else:
        while not os.path.exists(shown):
            time.sleep(0.01)

later(); comm.all_reduce(x)  # the lane
later(); comm.all_reduce(x, algorithm="native")  # the dispatch's one-call path
later(); comm.broadcast(x, root=1, algorithm="ring")  # the general path
if comm.rank == 0:
    later(); comm.recv(np.empty(3, np.int16), 1, tag=5)  # recv
else:
    later(); comm.send(np.ones(3, np.int16), 0, tag=5)
print(json.dumps(comm._gate.calls()))
"""


def test_a_dump_names_the_call_in_progress_from_the_gate_on_every_path(script, tmp_path):
    path = script(IN_PROGRESS)
    source = path.read_text().splitlines()

    def site(comment):
        return f"job.py:{next(n for n, line in enumerate(source, 1) if comment in line)}"

    p = tbrun("-np", 2, "--backend", "shm", path, timeout=90, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)[0]
    lane, dispatch, general, recv = (json.loads(line) for line in lines[:4])
    common = {"state": "running", "dtype": "float32", "bytes": 8, "peer": None, "tag": None}
    assert lane == {**common, "collective": "all_reduce", "seq": 2, "op": "sum", "root": None,
                    "algorithm": "native", "start": None, "site": site("# the lane")}, lane
    assert dispatch["start"] > 0 and dispatch == {
        **common, "collective": "all_reduce", "seq": 3, "op": "sum", "root": None,
        "algorithm": "native", "start": dispatch["start"],
        "site": site("# the dispatch's")}, dispatch
    assert general["start"] > 0 and general == {
        **common, "collective": "broadcast", "seq": 4, "op": None, "root": 1,
        "algorithm": "ring", "start": general["start"], "site": site("# the general")}, general
    assert recv == {"collective": "recv", "seq": None, "state": "running", "dtype": "int16",
                    "bytes": 6, "peer": 1, "tag": 5, "op": None, "root": None,
                    "algorithm": None, "start": None, "site": site("# recv")}, recv
    calls = json.loads(lines[4])  # the send and recv are not numbered, nor recorded
    assert [c[0] for c in calls] == [1, 2, 3, 4]
    assert [c[6] for c in calls] == [gates.NATIVE] * 3 + [ALGORITHM_CODES["ring"]]
