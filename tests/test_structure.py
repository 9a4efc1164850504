"""The package's structure: no import cycle among its modules (every import counted, module level or not)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"sharebert": REPO / "sharebert", "sharebert.export": REPO / "export", "sharebert.deploy": REPO / "deploy"}


def _modules() -> dict[str, Path]:
    mods = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``; ``from . import x`` of a submodule counts as that submodule."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = node.module
                if node.level:  # relative: up level - 1 packages from this module's package
                    parts = base.split(".")[: len(base.split(".")) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                found = subs if len(subs) == len(node.names) else [target, *subs]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            graph[name].update(f for f in found if f in mods and f != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph()
    assert "sharebert.training.finetune" in graph and "sharebert.deploy.runtime" in graph
    assert "sharebert.training.encoded" in graph["sharebert.training.finetune"]
    assert cycles(graph) == []
