"""The package's import graph has no cycle, between modules or between subpackages (agent.artifacts <->
agent.transport was one). Function-level imports count (they are dependencies too, only later); imports under
`if TYPE_CHECKING:` do not (they name a type and never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "hwtests")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module: str, is_pkg: bool) -> set[str]:
    """Every module `module` may import: module-level and function-level statements alike, except those under
    `if TYPE_CHECKING:` (annotations only; never executed)."""
    found: set[str] = set()
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - node.level + 1]
                target = ".".join(prefix + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps = _imports(tree, mod, path.name == "__init__.py")
        # importing a.b.c imports a and a.b first; an edge to a package's __init__ counts too
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package __init__ that re-exports its submodules is not a cycle with them: drop init -> own child edges."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}


def test_the_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    graph = _without_package_inits(import_graph())
    assert len(graph) > 50  # the walk saw the package
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between first-level units: agent.<subpackage or module>."""
    out: dict[str, set[str]] = {}

    def unit(m: str) -> str:
        return ".".join(m.split(".")[:2])

    for mod, deps in graph.items():
        out.setdefault(unit(mod), set()).update(unit(d) for d in deps if unit(d) != unit(mod))
    return out


def test_no_import_cycle_between_subpackages():
    graph = _packages(_without_package_inits(import_graph()))
    assert {"agent.artifacts", "agent.transport", "agent.hardware", "agent.targets"} <= set(graph)
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles between subpackages: " + "; ".join(" <-> ".join(c) for c in cycles)
