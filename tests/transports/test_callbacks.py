"""Every call from C into Python is declared in one table (tbcoll/include/callbacks.h), which each
extension exports and tbcoll.core.callbacks checks against Python's declaration at import; each
callable handed to C is checked against it once, at set-up; set-up calls take keywords only.
A swapped pair of arguments, on either side, fails loudly instead of passing the wrong values."""

import subprocess
import sys
import threading
import time
import types

import pytest

from tbcoll.core import callbacks
from tbcoll.core.gate import lane_call
from tbcoll.core.wire_check import WireMismatch
from tbcoll.transports.shm import native
from tbcoll.transports.shm.flags import atomics
from tbcoll.transports.shm.native import Layout, ShmNative
from tbcoll.transports.shm.segment import Segment
from tbcoll.transports.tcp import transport as tcp

try:
    from tbcoll.transports.rdma import _verbs
except ImportError:
    _verbs = None

try:
    from tbcoll.core import _gate
except ImportError:
    _gate = None

BUILT = {name: (module, parts) for name, module, parts in
         [("_gate", _gate, ("one_call",)),  # the whole call around a lane, compiled once
          ("_atomics", atomics, ("shm",)),
          ("_sockets", tcp._sockets, ("tcp",)),
          ("_verbs", _verbs, ("rdma",))] if module is not None}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_extension_exports_the_table_python_declares(name):
    module, parts = BUILT[name]
    exported = {entry[0]: (entry[1], tuple(entry[2].split())) for entry in module.CALLBACKS}
    assert exported == {n: callbacks.CALLBACKS[n] for part in parts
                        for n in callbacks.PARTS[part]}
    callbacks.check_callbacks(module, parts)


def _fake(changed):
    """A module whose CALLBACKS is _atomics's with `changed` applied to its entries."""
    module = types.ModuleType("tbcoll.transports.shm._fake")
    module.CALLBACKS = tuple(changed(list(atomics.CALLBACKS)))
    return module


def _with(entries, name, entry):
    return [entry if e[0] == name else e for e in entries]


@pytest.mark.parametrize("changed, says", [
    (lambda es: _with(es, "resume", ("resume", "iKK", "stage signature seq")),
     "resume: C ('iKK', ('stage', 'signature', 'seq')), Python ('iKK', ('stage', 'seq', "
     "'signature'))"),
    (lambda es: _with(es, "broadcast_call", ("broadcast_call", "in", "dtype root")),
     "broadcast_call: C ('in', ('dtype', 'root')), Python ('ii',"),
    (lambda es: [e for e in es if e[0] != "look"], "look: C none, Python ('n', ('dest',))"),
    (lambda es: es + [("spare", "i", "n")], "spare: C ('i', ('n',)), Python none"),
])
def test_a_c_table_that_differs_is_refused_naming_both_sides(changed, says):
    with pytest.raises(WireMismatch) as raised:
        callbacks.check_callbacks(_fake(changed), ("shm",))
    message = str(raised.value)
    assert says in message and "tbcoll.transports.shm._fake" in message and "Reinstall" in message


def test_a_python_declaration_that_differs_is_refused():
    declared = dict(callbacks.CALLBACKS, take=("O", ("block",)),
                    empty=("OOO", ("shape", "dtype")))
    if _gate is None:
        pytest.skip("tbcoll.core._gate is not built")
    with pytest.raises(WireMismatch) as raised:
        callbacks.check_callbacks(_gate, ("one_call",), declared)
    message = str(raised.value)
    assert "take: C ('O', ('blocking',)), Python ('O', ('block',))" in message
    assert "empty: C ('OO', ('shape', 'dtype')), Python ('OOO', ('shape', 'dtype'))" in message
    with pytest.raises(WireMismatch, match=r"empty: format 'OOO' passes 3 arguments"):
        callbacks.check_callbacks(types.SimpleNamespace(
            __name__="x", CALLBACKS=(("empty", "OOO", "shape dtype"),)), ("one_call",),
            dict(callbacks.CALLBACKS, empty=("OOO", ("shape", "dtype"))))


def test_an_extension_built_from_another_table_fails_to_import():
    """The check runs where the extension is imported (as wire_check's)."""
    script = ("import tbcoll.core.callbacks as c\n"
              "c.CALLBACKS['look'] = ('n', ('peer',))\n"
              "import tbcoll.transports.shm.flags\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert ("WireMismatch: tbcoll.transports.shm._atomics was built with other calls into "
            "Python than tbcoll.core.callbacks declares") in done.stderr
    assert "look: C ('n', ('dest',)), Python ('n', ('peer',))" in done.stderr


def test_a_callable_whose_parameters_differ_is_refused_at_set_up():
    def resume(stage, signature, seq):
        pass

    def look(dest, extra):
        pass

    def mesh_held(kind, src, dst, dtype, op, call, result=None, more=0):
        pass

    with pytest.raises(TypeError, match=r"resume\('stage', 'seq', 'signature'\).*takes "
                                         r"\('stage', 'signature', 'seq'\)"):
        callbacks.checked("resume", resume)
    with pytest.raises(TypeError, match="look"):
        callbacks.checked("look", look)  # needs more than C passes
    with pytest.raises(TypeError, match="functools.wraps"):
        callbacks.checked("look", lambda *args: None)  # a wrapper that hides what it calls
    assert callbacks.checked("mesh_held", mesh_held) is mesh_held  # extra ones have defaults
    acquire = threading.Lock().acquire
    assert callbacks.checked("take", acquire) is acquire  # a builtin says nothing: as it is


@pytest.fixture
def segment():
    seg = Segment.create(f"/tbc-cb-{time.monotonic_ns() % 10**9}", Layout(2).total)
    yield seg
    seg.unlink()
    seg.close()


def test_the_shm_lane_refuses_a_swapped_callable_and_positional_set_up(segment, monkeypatch,
                                                                       tmp_path):
    """Where the shm native hands its callables to C, a broadcast_call whose parameters are
    swapped is refused; the lane's set-up takes every argument by keyword, and names the one
    missing."""
    def swapped(root, dtype):
        return 0

    monkeypatch.setattr("tbcoll.transports.shm.native._broadcast_call", swapped)
    with pytest.raises(TypeError, match=r"swapped is called from C as broadcast_call\('dtype', "
                                        r"'root'\).*takes \('root', 'dtype'\)"):
        ShmNative(segment, 0, 2, 10.0, str(tmp_path / "p"))
    with pytest.raises(TypeError, match="Lane needs its argument segment="):
        atomics.Lane(segment.buffer, 0, 2, 0, [4096, 8192], 256, 0.01, None, 0)
    with pytest.raises(TypeError, match="Lane needs its argument pids="):
        atomics.Lane(segment=segment.buffer, flags=0, size=2, rank=0, sets=[4096, 8192],
                     slot_bytes=256, budget=0.01, resume=None)
    lane = atomics.Lane(segment=segment.buffer, flags=64, size=2, rank=0, sets=[4096, 8192],
                        slot_bytes=256, budget=0.01, resume=None, pids=0)
    with pytest.raises(TypeError, match="calls needs its argument single_pass="):
        lane.calls(1, None, None, None, None)
    lane.calls(single_pass=128, all_reduce=native._ALL_REDUCE, all_gather=native._ALL_GATHER,
               reduce_scatter=native._REDUCE_SCATTER, broadcast_call=native._broadcast_call)
    with pytest.raises(TypeError, match="bind needs its argument gate="):
        lane_call(lane).bind(None, (), (), 0, 0, None, None)
