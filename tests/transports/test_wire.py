"""One wire description (tbcoll/include/wire.h, tbcoll/transports/shm/shm.h) that the C extensions
export and Python checks at import: the same everywhere as built, and an extension built from other
headers than Python's tables fails to import with a message naming what differs."""

import subprocess
import sys

import numpy as np
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
    "a signature field's width": (
        "import tbcoll.core.calls as c; c.FIELDS['bytes'] = (0, 33)",
        "tbcoll.transports.tcp.transport",
        ["tbcoll.transports.tcp._sockets", "call", "('bytes', 0, 34)"]),
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


# (what grows past its field, the message's words): the ninth algorithm or the seventeenth
# collective wrote into the next field before the fields were widened; now past the widths
NAMES_PAST_THEIR_FIELD = {
    "algorithm": ("a.NAMES = (*a.NAMES, *(f'x{i}' for i in range(33 - len(a.NAMES))))",
                  "algorithm field has 5 bits, too few for 32"),
    "collective": ("a.COLLECTIVES = (*a.COLLECTIVES, *(f'c{i}' for i in "
                   "range(64 - len(a.COLLECTIVES))))",
                   "collective field has 6 bits, too few for 64"),
}


@pytest.mark.parametrize("field", sorted(NAMES_PAST_THEIR_FIELD))
def test_more_names_than_their_signature_field_holds_fail_the_import(field):
    grow, words = NAMES_PAST_THEIR_FIELD[field]
    p = imported_after(f"import tbcoll.core.names as a; {grow}", "tbcoll.core.calls")
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("tbcoll.core.calls.SignatureFieldsFull: "), p.stderr
    assert words in last, last
    one_less = grow.replace("33 -", "32 -").replace("64 -", "63 -")
    p = imported_after(f"import tbcoll.core.names as a; {one_less}", "tbcoll.core.calls")
    assert p.returncode == 0, p.stderr


def test_each_signature_field_keeps_its_value_at_the_widths():
    from tbcoll.core.calls import FIELDS, fields_in, render, signature
    from tbcoll.core.names import NAMES

    assert FIELDS["algorithm"][1] >= 5 and FIELDS["collective"][1] >= 6
    word = signature("broadcast", np.dtype(np.float64), None, (1 << 34) + 24, 4094, NAMES[-1])
    assert render(word) == f"broadcast(float64, 24 B, root=4094, algorithm={NAMES[-1]})"
    other = signature("broadcast", np.dtype(np.float64), None, 24, 4094, NAMES[0])
    assert fields_in(word ^ other) == ["algorithm"]
    pairs = signature("all_reduce", np.dtype([("value", "f8"), ("index", "i8")]), "sum", 32)
    assert render(pairs).startswith("all_reduce(a dtype of its own (structured or unnamed), 32 B")
