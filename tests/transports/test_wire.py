"""One wire description (tbcoll/include/wire.h, tbcoll/transports/shm/shm.h) that the C extensions
export and Python checks at import: the same everywhere as built, and an extension built from other
headers than Python's tables fails to import with a message naming what differs."""

import subprocess
import sys

import pytest

from tbcoll.core import wire_check
from tbcoll.transports.shm.flags import atomics
from tbcoll.transports.tcp import transport as tcp

from ..conftest import REPO

try:
    from tbcoll.transports.rdma import _verbs
except ImportError:
    _verbs = None

BUILT = {name: module for name, module in
         [("_atomics", atomics), ("_sockets", tcp._sockets), ("_verbs", _verbs)]
         if module is not None}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_extension_exports_the_wire_python_writes(name):
    wire = BUILT[name].WIRE
    assert wire == wire_check.python_wire()
    assert wire["header"][-1][1] + wire["header"][-1][2] == 32  # the engine's 32-byte header
    assert [name for name, _ in wire["dtypes"]][:4] == ["float16", "bfloat16", "float32",
                                                         "float64"]


def test_the_shm_extension_exports_its_layout_and_the_lanes_kinds():
    if atomics is None:
        pytest.skip("tbcoll.transports.shm._atomics is not built")
    assert atomics.LANE_KINDS == ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    assert atomics.NOT_IN_HEAP == (-1, 0)
    assert atomics.RING_OVERWRITTEN == -3


def imported_after(change: str, module: str) -> subprocess.CompletedProcess:
    """Import `module` in a fresh interpreter after `change` (Python) has made one side of the
    wire differ from the other, as a stale build or an edit of one side would."""
    return subprocess.run([sys.executable, "-c", f"{change}\nimport {module}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


# (what is changed, the module whose import checks it, what the message must name)
MISMATCHES = {
    "dtype order": (
        "import tbcoll.core.dtypes as d; items = list(d.DTYPES.items()); "
        "items[2], items[3] = items[3], items[2]; d.DTYPES.clear(); d.DTYPES.update(items)",
        "tbcoll.transports.shm.flags",
        ["tbcoll.transports.shm._atomics", "dtypes", "'float64', 8), ('float32', 4)"]),
    "op order": (
        "import tbcoll.core.dtypes as d; d.OPS.pop('max'); d.OPS['max'] = None",
        "tbcoll.transports.tcp.transport",
        ["tbcoll.transports.tcp._sockets", "ops", "'min', 'max'"]),
    # wire.h's framing is read by Python (wire_check.read_wire): what can differ is a build
    # of another wire.h than the installed one, as here
    "header field": (
        "from tbcoll.transports.tcp import _sockets as m; "
        "m.WIRE['header'] = (('context', 0, 4), ('tag', 4, 8), *m.WIRE['header'][2:])",
        "tbcoll.transports.tcp.transport",
        ["tbcoll.transports.tcp._sockets", "header", "('tag', 4, 8)"]),
    "descriptor field": (
        "from tbcoll.transports.shm import _atomics as m; "
        "m.WIRE['descriptor'] = m.WIRE['descriptor'][::-1]",
        "tbcoll.transports.shm.flags",
        ["tbcoll.transports.shm._atomics", "descriptor", "C (('pull', 16, 8)"]),
    "announce context": (
        "from tbcoll.transports.shm import _atomics as m; m.WIRE['contexts']['announce'] = 1 << 30",
        "tbcoll.transports.shm.flags", ["contexts", "'announce': 1073741824"]),
    "the lane's kinds": (
        "from tbcoll.transports.shm import _atomics as a; a.LANE_KINDS = a.LANE_KINDS[::-1]",
        "tbcoll.transports.shm.flags", ["LANE_KINDS", "tbcoll.core.names", "C ('broadcast',"]),
    "NOT_IN_HEAP": (
        "from tbcoll.transports.shm import _atomics as a; a.NOT_IN_HEAP = (0, -1)",
        "tbcoll.transports.shm.native",
        ["tbcoll.transports.shm._atomics", "NOT_IN_HEAP: C (0, -1), Python (-1, 0)"]),
    "a ring's overwritten code": (
        "from tbcoll.transports.shm import _atomics as a; a.RING_OVERWRITTEN = -4",
        "tbcoll.transports.shm.native", ["RING_OVERWRITTEN: C -4, Python -3"]),
    "an old build without WIRE": (
        "from tbcoll.transports.tcp import _sockets; del _sockets.WIRE",
        "tbcoll.transports.tcp.transport", ["tbcoll.transports.tcp._sockets", "dtypes: C None"]),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_mismatch_fails_the_import_naming_what_differs(case):
    change, module, named = MISMATCHES[case]
    needs = {"tbcoll.transports.tcp.transport": "_sockets"}.get(module, "_atomics")
    if needs not in BUILT:
        pytest.skip(f"tbcoll's {needs} extension is not built")
    p = imported_after(change, module)
    assert p.returncode != 0, p.stdout + p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("tbcoll.core.wire_check.WireMismatch: "), p.stderr
    assert "Reinstall tbcoll" in last
    for words in named:
        assert words in last, last


def test_the_rdma_extension_is_checked_as_it_is_imported():
    if _verbs is None:
        pytest.skip("tbcoll.transports.rdma._verbs is not built (no infiniband/verbs.h)")
    p = imported_after("from tbcoll.transports.rdma import _verbs; _verbs.WIRE['ops'] = ('sum',)",
                       "tbcoll.transports.rdma.transport")
    assert "WireMismatch: tbcoll.transports.rdma._verbs" in p.stderr
    assert "ops: C ('sum',)" in p.stderr


def test_unchanged_everything_imports():
    p = imported_after("pass", "tbcoll.comm.communicator, tbcoll.transports.shm.transport, "
                              "tbcoll.transports.rdma.transport")
    assert p.returncode == 0, p.stderr
