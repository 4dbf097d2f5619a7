"""The folders are the layers (../shared/DESIGN.md): each module imports only from the layers
below its own and from its own part of its layer, and no imports go round in a cycle. Read
from the source with ast, every import statement included (those inside functions too; not those
under `if TYPE_CHECKING:` or `if __name__ == "__main__":`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# bottom first: (layer, the modules in it by name prefix); a module is in the last layer of
# the longest prefix it matches
LAYERS = (
    ("core", ("tbcoll.core",)),
    ("job", ("tbcoll.job",)),
    ("observability", ("tbcoll.observability",)),
    ("shared transport parts", ("tbcoll.transports.stream", "tbcoll.transports.socket_mesh")),
    ("failover's reconnection over the socket mesh", ("tbcoll.transports.reconnect",)),
    ("tcp, the stream engine over sockets that rdma and mlx build on", ("tbcoll.transports.tcp",)),
    ("transports", ("tbcoll.transports",)),
    ("algorithms", ("tbcoll.algorithms",)),
    ("collectives", ("tbcoll.collectives",)),
    ("communicator", ("tbcoll.comm",)),
    ("two levels, a Group made of communicators", ("tbcoll.hierarchy",)),
    ("the library's front", ("tbcoll", "tbcoll.bootstrap", "tbcoll.testing", "tbcoll.bench")),
    ("tbrun", ("tbcoll.launch",)),
)
# layers whose parts may import each other (the front: init imports the Communicator)
OPEN = ("the library's front",)
# parts that import no other part of tbcoll at all: tensor parallelism takes a communicator
APART = ("tbcoll.tp",)
# what tbrun may import of the library: the launch contract, the names, the dumps' keys and
# traces; never a transport or a communicator
TBRUN_MAY_IMPORT = ("tbcoll.core", "tbcoll.job", "tbcoll.observability", "tbcoll.launch",
                    "tbcoll")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "launchers":
        parts[0:1] = ["tbcoll", "launch"]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    paths = [*(REPO / "tbcoll").rglob("*.py"), *(REPO / "launchers").rglob("*.py")]
    return {_module_name(p): p for p in paths if "__pycache__" not in p.parts}


SOURCES = _sources()


def _not_imported(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block (annotations) or `if __name__ == "__main__":` (the module
    run as a script, not imported)."""
    return isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.unparse(node.test)
                                         or "__main__" in ast.unparse(node.test))


def _imports(path: Path) -> set[str]:
    """The tbcoll modules path imports (from X import y: X.y where that is a module, else X)."""
    found: set[str] = set()
    skip: set[int] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if _not_imported(node):
            skip.update(id(child) for child in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in SOURCES else node.module)
    return {name for name in found if name.split(".")[0] == "tbcoll" and name in SOURCES}


GRAPH = {name: _imports(path) for name, path in SOURCES.items()}


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the part of the layer it belongs to)."""
    best = (-1, -1, "")
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if len(prefix) >= best[1]:
                    best = (index, len(prefix), prefix)
    index, _, prefix = best
    if prefix == "tbcoll.transports" and module != prefix:  # each transport is a part
        prefix = ".".join(module.split(".")[:3])
    return index, prefix


def test_every_module_is_in_a_layer():
    orphans = [m for m in SOURCES if _layer(m)[0] < 0 and not m.startswith(APART)]
    assert not orphans, f"modules in no layer of LAYERS: {orphans}"


def test_no_module_imports_up_a_layer_or_across_into_another_part():
    wrong = []
    for module, imported in sorted(GRAPH.items()):
        if module.startswith(APART):
            wrong += [f"{module} -> {m}" for m in imported if not m.startswith(APART)]
            continue
        mine, part = _layer(module)
        for target in sorted(imported):
            theirs, their_part = _layer(target)
            across = their_part != part and LAYERS[mine][0] not in OPEN
            if theirs > mine or (theirs == mine and across):
                wrong.append(f"{module} ({LAYERS[mine][0]}) -> {target} ({LAYERS[theirs][0]})")
    assert not wrong, "imports that run up a layer or across:\n" + "\n".join(wrong)


def test_tbrun_imports_no_transport_and_no_communicator():
    wrong = [f"{module} -> {target}" for module, imported in GRAPH.items()
             if module.startswith("tbcoll.launch") for target in imported
             if not any(target == p or target.startswith(p + ".") for p in TBRUN_MAY_IMPORT)]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module,target", [("tbcoll.core.calls", "tbcoll.algorithms"),
                                           ("tbcoll.transports.mpi.transport",
                                            "tbcoll.transports.shm.flags")])
def test_the_rule_sees_a_wrong_import(module, target):
    """The check itself: an import up a layer, and one across into another transport."""
    mine, part = _layer(module)
    theirs, their_part = _layer(target)
    assert theirs > mine or (theirs == mine and their_part != part)


def test_no_source_file_is_over_600_lines():
    """A file a newcomer reads at one sitting: past 600 lines it holds more than one job."""
    files = [p for folder in ("tbcoll", "launchers") for pattern in ("*.py", "*.c", "*.h")
             for p in (REPO / folder).rglob(pattern)]
    long = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text().splitlines())) > 600}
    assert files and not long, f"over 600 lines: {long}"
