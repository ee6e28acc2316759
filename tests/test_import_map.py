"""No import loop in the product: every module can be understood (and changed) after the modules it
imports, never together with them. Read from the source by ``tests.import_map``, imports inside
functions included."""

from __future__ import annotations

import io
from pathlib import Path

from tests import import_map

PRODUCT = Path(import_map.__file__).resolve().parent.parent / import_map.PACKAGE

def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


def test_the_product_has_no_import_loop():
    loops = import_map.loops(import_map.build(PRODUCT))
    assert loops == []


def test_the_map_reads_the_definition_and_the_worker_one_way():
    graph = import_map.build(PRODUCT)
    # The DSL's local run sits above everything it needs; nothing it needs reaches back to it.
    assert graph.has_edge("orchestrator.dsl", "orchestrator.localrun")
    assert graph.has_edge("orchestrator.localrun", "orchestrator.validation")
    assert not any(graph.has_edge(module, "orchestrator.dsl")
                   for module in ("orchestrator.localrun", "orchestrator.validation", "orchestrator.executor",
                                  "orchestrator.definition", "orchestrator.taskcontext"))
    assert graph.has_edge("orchestrator.worker.role", "orchestrator.worker.pool")
    assert not graph.has_edge("orchestrator.worker.pool", "orchestrator.worker.role")


def test_a_loop_through_an_import_inside_a_function_is_found_and_the_command_fails(tmp_path):
    package = write_package(tmp_path, {
        "a.py": "from pkg import b\n",
        "b.py": "def later():\n    from pkg.sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "import pkg.a\n",
        "d.py": "from pkg import a\n",
    })
    graph = import_map.build(package)
    assert import_map.loops(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    out = io.StringIO()
    import_map.report(graph, out=out)
    assert "import loops: 1\n  pkg.a <-> pkg.b <-> pkg.sub.c\n" in out.getvalue()
    assert import_map.main(["--root", str(package)]) == 1


def test_the_command_succeeds_without_a_loop(tmp_path):
    package = write_package(tmp_path, {"a.py": "from pkg import b\n", "b.py": "import json\n"})
    assert import_map.loops(import_map.build(package)) == []
    assert import_map.main(["--root", str(package)]) == 0
