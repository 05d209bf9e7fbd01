"""The package's import structure: no cycles, and no module imports a higher layer.

The layers are the table under "## Layers" in docs/ARCHITECTURE.md, read from there so the
document and the check cannot disagree. Imports are parsed with ``ast`` from every module of
p2pnode/ (those inside functions too: a lazy import is a dependency all the same), so this
checks the real tree, not a list kept beside it.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "p2pnode"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # an attribute of a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "p2pnode":
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "p2pnode":
                continue
            for alias in node.names:  # ``from p2pnode.x import y``: y may be a module
                add(f"{source}.{alias.name}")
    return found


def layers() -> list[tuple[str, list[str]]]:
    """(layer, module prefixes) from the table under "## Layers", lowest first."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], re.findall(r"`(p2pnode[\w.]*)`", cells[2])))
    assert rows, "docs/ARCHITECTURE.md has no layer table under '## Layers'"
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "layers are numbered 1, 2, ... from the bottom"
    return [(r[1], r[2]) for r in rows]


def unit_of(module: str, prefixes: dict[str, int]) -> str:
    """The longest layer entry that ``module`` falls under (itself, or a package above it)."""
    best = ""
    for prefix in prefixes:
        # ``p2pnode`` names the package's own __init__ only: every other module is listed
        below = module.startswith(prefix + ".") and prefix != "p2pnode"
        if (module == prefix or below) and len(prefix) > len(best):
            best = prefix
    return best


def graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    known = modules()
    table = layers()
    prefixes = {p: i for i, (_, entries) in enumerate(table) for p in entries}
    return {name: imports(name, path, known) for name, path in known.items()}, prefixes


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer() -> None:
    edges, prefixes = graph()
    missing = sorted(m for m in edges if not unit_of(m, prefixes))
    assert not missing, f"modules in no layer of docs/ARCHITECTURE.md: {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    edges, prefixes = graph()
    table = layers()
    upward = []
    for module, targets in sorted(edges.items()):
        own = prefixes[unit_of(module, prefixes)]
        for target in sorted(targets):
            theirs = prefixes[unit_of(target, prefixes)]
            if theirs > own:
                upward.append(f"{module} ({table[own][0]}) imports {target} ({table[theirs][0]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    edges, prefixes = graph()
    found = cycles(edges)
    # between layer entries too: two packages that import each other through different modules
    units: dict[str, set[str]] = defaultdict(set)
    for module, targets in edges.items():
        for target in targets:
            a, b = unit_of(module, prefixes), unit_of(target, prefixes)
            if a != b:
                units[a].add(b)
    found += cycles(units)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_sees_cycles_and_upward_imports() -> None:
    """The checks themselves, on a made-up graph: a cycle and a layer skipped upward are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    prefixes = {"p2pnode": 0, "p2pnode.daemon": 1, "p2pnode.daemon.node": 2}
    assert unit_of("p2pnode.daemon.node", prefixes) == "p2pnode.daemon.node"
    assert unit_of("p2pnode.daemon.http", prefixes) == "p2pnode.daemon"
    assert unit_of("p2pnode.wire.codec", prefixes) == ""  # in no layer: test_every_module_has_a_layer says so
    # the real tree's graph is read: the daemon's node imports its HTTP API
    edges, _ = graph()
    assert "p2pnode.daemon.http" in edges["p2pnode.daemon.node"]


def side_of(module: str) -> str:
    """"worker" for what runs in the worker process (worker/ and a mode's ``worker_*`` modules),
    "daemon" for a mode's other modules (its daemon side and what both sides read), else ""."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] == "worker":
        return "worker"
    if len(parts) == 3 and parts[1] in MODE_FOLDERS:
        return "worker" if parts[2].startswith("worker_") else "daemon"
    return ""


#: the modes' folders (docs/ARCHITECTURE.md, "Modes")
MODE_FOLDERS = ("gossip", "sync", "ps")


def torch_imports(path: Path) -> bool:
    return any(isinstance(node, (ast.Import, ast.ImportFrom))
               and any(name.split(".")[0] == "torch"
                       for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                    else [node.module or ""]))
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_a_modes_worker_side_is_named_so() -> None:
    """The rule of docs/ARCHITECTURE.md, "Where a mode's code lives": in a mode's folder, what
    the worker process runs is named ``worker_*.py``, and only the worker side imports it or
    torch; the daemon side stays torch-free."""
    edges, _ = graph()
    known = modules()
    wrong = []
    for module, targets in sorted(edges.items()):
        if side_of(module) == "daemon" and torch_imports(known[module]):
            wrong.append(f"{module} imports torch: a module the worker runs is named worker_*.py")
        for target in sorted(targets):
            if side_of(target) == "worker" and target.split(".")[1] in MODE_FOLDERS and side_of(module) != "worker":
                wrong.append(f"{module} imports {target}: only the worker side imports a mode's worker_* module")
    assert not wrong, "\n".join(wrong)
    assert side_of("p2pnode.sync.worker_powersgd") == "worker" and side_of("p2pnode.sync.reducer") == "daemon"
