"""The README's map of the modules ("How it is built", "Modules by role") names every module of
orchestrator/, and nothing that is not there.

The rule, per module: a module directly in orchestrator/ is named by its file name (`runs.py`);
a module of a package by its path in orchestrator/ (`web/kit.py`), or in a row that names its
package folder (`worker/`) and then its file name (`role.py`). Package `__init__.py` files and
the migrations are not listed: a package is its folder."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ROOT / "orchestrator"
README = ROOT / "README.md"


def modules() -> list[str]:
    return sorted(str(path.relative_to(PRODUCT)) for path in PRODUCT.rglob("*.py")
                  if path.name != "__init__.py" and "migrations" not in path.parts)


def table_rows() -> list[str]:
    text = README.read_text()
    start = text.index("**Modules by role.**")
    end = text.index("\n\n", text.index("\n|", start) + 1)
    return [line for line in text[start:end].splitlines() if line.startswith("|")]


def named(module: str, rows: list[str]) -> bool:
    folder, _, name = module.rpartition("/")
    for row in rows:
        cells = re.findall(r"`([^`]+)`", row)
        if module in cells:
            return True
        if folder and name in cells and f"{folder}/" in cells:
            # The file name comes after its package's folder in the row.
            if cells.index(f"{folder}/") < len(cells) - 1 - cells[::-1].index(name):
                return True
    return False


def test_every_module_of_the_package_is_in_the_readmes_map():
    rows = table_rows()
    missing = [module for module in modules() if not named(module, rows)]
    assert missing == [], f"README.md's 'Modules by role' table does not name: {', '.join(missing)}"


def test_the_readmes_map_names_no_module_that_does_not_exist():
    rows = table_rows()
    known = set(modules())
    folders = {str(path.relative_to(PRODUCT)) + "/" for path in PRODUCT.rglob("*") if path.is_dir()}
    stale = []
    for row in rows:
        module_cell = row.split("|")[2]  # | role | module | owns | ...
        folder = ""
        for cell in re.findall(r"`([^`]+)`", module_cell):
            if cell.endswith("/"):
                folder = cell
                if cell not in folders:
                    stale.append(cell)
            elif cell.endswith(".py") and cell not in known and f"{folder}{cell}" not in known:
                stale.append(cell)
    assert stale == []
