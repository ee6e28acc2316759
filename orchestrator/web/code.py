"""A workflow's code, read-only: the text of the Python module that defines it, escaped, with line
numbers. The file is read, never imported or executed: the web process never imports a module
because a page named it, and the module's name (written by sync) is checked and looked up on
the import path as a file.

Sync stores each workflow's graph (its versions), not the source text: the page says which file
it shows (the module as it is on disk now, its digest and time), which graph version a picked run
used, and whether the file changed after the last sync, so nobody takes today's file for the
code an old run ran.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.shortcuts import get_object_or_404

from orchestrator import access
from orchestrator.limits import MAX_ID
from orchestrator.models import Run, Workflow
from orchestrator.web.errors import InvalidInput, query_int
from orchestrator.web.kit import page, viewer_required

MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MOST_BYTES = 1_000_000  # a module larger than this is shown up to here


@dataclass
class Source:
    module: str
    path: Path
    text: str
    size: int  # bytes of the whole file
    sha256: str
    modified: datetime

    @property
    def shown_path(self) -> str:
        """The file's path under its import root (the server's folders are not shown)."""
        return "/".join(self.module.split(".")) + ("/__init__.py" if self.path.name == "__init__.py" else ".py")

    @property
    def lines(self) -> list[tuple[int, str]]:
        return list(enumerate(self.text.splitlines(), start=1))

    @property
    def cut(self) -> bool:
        return self.size > MOST_BYTES


def module_file(module: str) -> Path | None:
    """The .py file of ``module`` on the import path, found without importing anything."""
    if not MODULE_RE.match(module):
        return None
    loaded = sys.modules.get(module)
    candidates = []
    if loaded is not None and getattr(loaded, "__file__", None):
        candidates.append(Path(loaded.__file__))
    parts = module.split(".")
    for entry in sys.path:
        base = Path(entry or ".")
        candidates += [base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")]
    return next((path for path in candidates if path.suffix == ".py" and path.is_file()), None)


def read_source(module: str) -> Source | None:
    path = module_file(module)
    if path is None:
        return None
    data = path.read_bytes()
    return Source(module=module, path=path, text=data[:MOST_BYTES].decode("utf-8", errors="replace"), size=len(data),
                  sha256=hashlib.sha256(data).hexdigest(),
                  modified=datetime.fromtimestamp(path.stat().st_mtime, tz=UTC))


def code_context(wf: Workflow, run: Run | None) -> dict:
    source = read_source(wf.module) if wf.module else None
    return {
        "wf": wf,
        "run": run,
        "source": source,
        "changed_since_sync": bool(source and wf.synced_at and source.modified > wf.synced_at),
        "run_version_is_current": bool(run and run.version_id == wf.current_version_id),
    }


@viewer_required
def workflow_code(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.select_related("current_version")),
                           name=name)
    run_id = query_int(request, "run", None, 1, MAX_ID)
    run = None
    if run_id is not None:
        run = Run.objects.filter(pk=run_id).select_related("version").defer("version__spec").first()
        if run is None or run.workflow_id != wf.pk:
            raise InvalidInput("run", f"run #{run_id} is not a run of {wf.name}")
    return page(request, "orchestrator/web/code.html", code_context(wf, run))
