"""The import map of the product package, for a maintainer comparing two versions of the tree.

    .venv/bin/python -m tests.import_map            # summary: files, floors, loops, imports back up
    .venv/bin/python -m tests.import_map --floors   # also each floor's modules
    .venv/bin/python -m tests.import_map --edges    # also every import between product modules

Reads `orchestrator/` (migrations, tests and templates aside) with `ast`, nothing is imported. An
import is an edge from one module to another module of the package, whether it sits at the top of
the file or inside a function (a function-level import is still a dependency, listed with a "lazy"
mark, and it makes a loop like any other). A module's floor is 0 when it imports no other product
module, else one more than the highest floor it imports; the modules of an import loop share a
floor. An import "runs back up" when it goes from a module to one on the same or a higher floor,
which only an import loop allows.

The command exits with status 1 when there is an import loop (``tests/test_import_map.py`` runs
the same check in the suite).
"""

import argparse
import ast
import sys
from pathlib import Path

import networkx as nx

PACKAGE = "orchestrator"
SKIP = ("migrations",)


def module_name(root, path):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_files(root):
    for path in sorted(root.rglob("*.py")):
        if any(part in SKIP for part in path.relative_to(root).parts):
            continue
        yield path


def resolve(name, modules):
    """The product module an imported name lives in (the longest known prefix), or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path, current, modules, is_package):
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    lazy_nodes.add(id(inner))
    found = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current if is_package else current.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names] or [stem]
        for target in targets:
            hit = resolve(target, modules)
            if hit and hit != current:
                lazy = id(node) in lazy_nodes
                found[hit] = found.get(hit, True) and lazy
    return found


def build(root):
    paths = {module_name(root, p): p for p in product_files(root)}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for name, path in paths.items():
        for target, lazy in imports_of(path, name, paths, path.name == "__init__.py").items():
            graph.add_edge(name, target, lazy=lazy)
    return graph


def floors(graph):
    condensed = nx.condensation(graph)
    floor_of_component = {}
    for component in reversed(list(nx.topological_sort(condensed))):
        below = [floor_of_component[s] for s in condensed.successors(component)]
        floor_of_component[component] = 1 + max(below) if below else 0
    mapping = condensed.graph["mapping"]
    return {node: floor_of_component[mapping[node]] for node in graph}


def loops(graph) -> list[list[str]]:
    """Each import loop: the modules that reach one another through imports, sorted."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def report(graph, show_floors=False, show_edges=False, out=sys.stdout) -> list[list[str]]:
    floor = floors(graph)
    found = loops(graph)
    back_up = sorted((a, b) for a, b in graph.edges if floor[b] >= floor[a])
    lazy = sum(1 for *_, data in graph.edges(data=True) if data["lazy"])
    print(f"files: {graph.number_of_nodes()}", file=out)
    print(f"imports between product modules: {graph.number_of_edges()} ({lazy} inside functions)", file=out)
    print(f"floors: {max(floor.values()) + 1}", file=out)
    print(f"import loops: {len(found)}", file=out)
    for loop in found:
        print(f"  {' <-> '.join(loop)}", file=out)
    print(f"imports that run back up: {len(back_up)}", file=out)
    for a, b in back_up:
        mark = " (lazy)" if graph.edges[a, b]["lazy"] else ""
        print(f"  {a} (floor {floor[a]}) -> {b} (floor {floor[b]}){mark}", file=out)
    if show_floors:
        for level in range(max(floor.values()) + 1):
            names = sorted(n for n in graph if floor[n] == level)
            print(f"floor {level}: {', '.join(names)}", file=out)
    if show_edges:
        for a, b, data in sorted(graph.edges(data=True)):
            print(f"  {a} -> {b}{' (lazy)' if data['lazy'] else ''}", file=out)
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floors", action="store_true", help="list each floor's modules")
    parser.add_argument("--edges", action="store_true", help="list every import between product modules")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent / PACKAGE))
    args = parser.parse_args(argv)
    found = report(build(Path(args.root)), show_floors=args.floors, show_edges=args.edges)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
