"""Results too large for a row: kept in the log storage, read back wherever a result is read.

A task's return value is stored as JSON in its task run's row (``TaskRun.result``) up to
``ORCHESTRATOR_MAX_RESULT_BYTES``. A larger one, up to ``ORCHESTRATOR_MAX_STORED_RESULT_BYTES``,
is written through the log storage (``ORCHESTRATOR_LOG_STORAGE``, as big logs are) under a name
made of ids, next to the attempt's log (``runs/<run>/<task run>-<attempt>.result.json``), and the
row keeps a small marker instead::

    {"$stored_result": {"name": "runs/7/42-1.result.json", "bytes": 1048576}}

The file is written by the process that ran the task (a worker's child, its in-process host or a
local run), after the value was masked (``secrets.Access.mask_reply``): it holds what the row
would have held. Every reader of the value goes through ``load``: a child's ``ctx.upstream``, a
mapped task's list of instance results (each element may be a marker), ``wf.test``, the results
tab, ``django.tasks``' ``get_result``. The API's answers never read it: they show a marker as its
size and the URL of ``GET /api/task-runs/{id}/result/`` (``api.result_fields.listed_result``; the
marker's name holds the id of the task run that wrote it, ``task_run_of``), and that endpoint
alone sends the value, streamed from the file (``open_stored``). Retention deletes the files with
their runs (``names_of_runs``), clearing a task run deletes its own (``control.clear_task_runs``).

A result that the graph reads in SQL stays in the row, under ``ORCHESTRATOR_MAX_RESULT_BYTES``:
a list that a task is mapped over (its items are copied into the instances) and a branch's choice.

No task can forge a marker: a return value shaped like one is refused (``refuse_marker``), so a
marker always names a file this module wrote.
"""

from __future__ import annotations

import json
import logging
import re

from django.core.files.base import ContentFile

from orchestrator.conf import app_settings, log_storage

log = logging.getLogger(__name__)

KEY = "$stored_result"
NAME = re.compile(r"runs/\d+/(?P<task_run>\d+)-\d+\.result(_[A-Za-z0-9]+)?\.json")


class StoredResultError(Exception):
    """A stored result that cannot be read back (deleted by hand, or the storage is down);
    ``missing`` when the storage answered that the file is not there."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


def name_for(run_id: int, task_run_id: int, number: int) -> str:
    return f"runs/{run_id}/{task_run_id}-{number}.result.json"


def hard_limit() -> int:
    return max(app_settings.MAX_STORED_RESULT_BYTES, app_settings.MAX_RESULT_BYTES)


def _is_marker(value) -> bool:
    return isinstance(value, dict) and KEY in value


def marker_of(value) -> dict | None:
    """The marker's ``{"name", "bytes"}`` when ``value`` (a result as read from a row) is one."""
    if _is_marker(value) and len(value) == 1 and isinstance(value[KEY], dict):
        return value[KEY]
    return None


def refuse_marker(value) -> str | None:
    """Why ``value`` cannot be a task's result (it has the shape of a marker), or None."""
    if _is_marker(value) or (isinstance(value, list) and any(_is_marker(v) for v in value)):
        return (f"the task's result holds a dict with the key {KEY!r}, which marks a result kept in the log "
                "storage: rename that key")
    return None


def place(reply: tuple, run_id: int) -> tuple:
    """``reply`` (``executor.run``'s tuple, masked) with a result over ``ORCHESTRATOR_MAX_RESULT_BYTES``
    written to the log storage and replaced by its marker; when the storage refuses it, the
    attempt fails saying so."""
    result = reply[3]
    if result is None:
        return reply
    inline = app_settings.MAX_RESULT_BYTES
    if len(result) <= inline // 4:  # a character is at most 4 bytes of UTF-8
        return reply
    data = result.encode()
    if len(data) <= inline:
        return reply
    task_run_id, number = reply[0], reply[1]
    try:
        name = log_storage().save(name_for(run_id, task_run_id, number), ContentFile(data))
    except Exception as exc:  # noqa: BLE001 - a storage backend may raise anything: the attempt fails saying so
        return (task_run_id, number, "failed", None,
                f"the task's result of {len(data)} bytes (over ORCHESTRATOR_MAX_RESULT_BYTES, {inline}) could not "
                f"be written to the log storage: {type(exc).__name__}: {exc}", *reply[5:])
    marker = json.dumps({KEY: {"name": name, "bytes": len(data)}})
    return (*reply[:3], marker, *reply[4:])


def task_run_of(marker: dict) -> int | None:
    """The id of the task run whose attempt wrote the stored result (from its name)."""
    name = marker.get("name")
    found = NAME.fullmatch(name) if isinstance(name, str) else None
    return int(found["task_run"]) if found else None


def open_stored(marker: dict):
    """The stored result's file, open for reading its JSON as bytes (the caller closes it)."""
    name = marker.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise StoredResultError(f"not the name of a stored result: {name!r:.100}")
    try:
        return log_storage().open(name, "rb")
    except FileNotFoundError as exc:
        raise StoredResultError(f"the stored result {name} cannot be read: it is not in the log storage "
                                f"({type(exc).__name__}: {exc})", missing=True) from exc
    except Exception as exc:  # noqa: BLE001 - a storage backend may raise anything
        raise StoredResultError(f"the stored result {name} cannot be read: {type(exc).__name__}: {exc}") from exc


def read(marker: dict):
    """The value a marker stands for."""
    with open_stored(marker) as handle:
        try:
            return json.loads(handle.read())
        except (OSError, ValueError) as exc:
            raise StoredResultError(f"the stored result {marker['name']} cannot be read: "
                                    f"{type(exc).__name__}: {exc}") from exc


def load(value):
    """A result as the task returned it: a marker is read from the log storage, and so is each
    marker in a list (a mapped task's result: its instances' results, in order)."""
    marker = marker_of(value)
    if marker is not None:
        return read(marker)
    if isinstance(value, list) and any(_is_marker(v) for v in value):
        return [load(v) for v in value]
    return value


def shown(value):
    """``load`` for the faces (API, pages): a stored result that cannot be read is shown as its
    marker with the reason (``"error"``), never raised."""
    try:
        return load(value)
    except StoredResultError as exc:
        marker = marker_of(value)
        return {KEY: {**marker, "error": str(exc)}} if marker is not None else {KEY: {"error": str(exc)}}


def load_upstream(upstream: dict) -> dict:
    """The parents' results of a task (``ctx.upstream``) with the stored ones read back."""
    return {name: load(value) for name, value in upstream.items()}


# The stored results of these runs' task runs (instances each hold their own marker; a mapped
# task's list repeats them). Read before the rows are deleted.
STORED_OF_RUNS = f"""
SELECT result->'{KEY}'->>'name' FROM orchestrator_taskrun
WHERE run_id = ANY (%s) AND jsonb_typeof(result) = 'object' AND result ? '{KEY}'
"""


def delete(names: list[str]) -> None:
    """Delete stored results no row refers to any more (a cleared task run's); a storage error is
    logged, never raised: the rows are committed already."""
    for name in names:
        if NAME.fullmatch(name):
            try:
                log_storage().delete(name)
            except Exception:  # noqa: BLE001 - a storage backend may raise anything
                log.warning("could not delete the stored result %s", name, exc_info=True)


def names_of_runs(cursor, run_ids: list[int]) -> list[str]:
    cursor.execute(STORED_OF_RUNS, [run_ids])
    return [name for (name,) in cursor.fetchall() if name and NAME.fullmatch(name)]
