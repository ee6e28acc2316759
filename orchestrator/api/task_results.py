"""``GET /api/task-runs/{id}/result/``: a task run's result, whole, as the task returned it. The
API's other answers show a result kept in the log storage as its size and this URL
(``result_fields.listed_result``); this is the one place that sends the value.

A result kept in the row is sent as PostgreSQL has it (the jsonb's text, at most
``ORCHESTRATOR_MAX_RESULT_BYTES``); one kept in the log storage is streamed from its file
(``FileResponse``), never read into memory whole. A mapped task's own result is the list of its
instances' results: it is streamed as a JSON array built from the instances, read by map index a
page of ``PAGE`` rows at a time (on ``taskrun_unique_task``), each stored one streamed from its
file in turn; the mapped task's own row holds the same list but is never read (10,000 results of
up to 256 KiB each would be gigabytes in one value). The memory it takes is one page of rows or
one chunk of a file, whatever the number of instances.
"""

from __future__ import annotations

import json
import logging

from django.db import connection
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from orchestrator import access, results
from orchestrator.api.base import APIBase, errors
from orchestrator.api.schema import extend_schema
from orchestrator.models import TaskRun
from orchestrator.states import TaskState

log = logging.getLogger(__name__)

PAGE = 100  # instances read at once: at most 100 results of the row's limit (25 MiB) in memory
CHUNK = 64 * 1024  # bytes of a stored file sent at once
JSON = "application/json"
# How a marker's jsonb text starts (a marker has this one key): an in-row result that does not
# start so is sent as it is, without being parsed.
MARKER_START = json.dumps({results.KEY: None})[:-len("null}")]

# The task run's state, whether it is a mapped task's own, whether it has a result at all and,
# but for a mapped task's own (a list of every instance's result), the result's text.
RESULT = """
SELECT state, run_id, task, (map_index = -1 AND spec ? 'map_over'), result IS NULL,
       CASE WHEN map_index = -1 AND spec ? 'map_over' THEN NULL ELSE result::text END
FROM orchestrator_taskrun WHERE id = %s
"""

# A page of a mapped task's instances' results by map index.
INSTANCE_RESULTS = """
SELECT map_index, result::text FROM orchestrator_taskrun
WHERE run_id = %(run)s AND task = %(task)s AND map_index > %(after)s
ORDER BY map_index LIMIT %(limit)s
"""

NO_RESULT = "task run {pk} has no result: it is {state}"


def stored_marker(text: str | None) -> dict | None:
    """The marker a result's jsonb text is, or None (without parsing a result kept in the row)."""
    if text is None or not text.startswith(MARKER_START):
        return None
    return results.marker_of(json.loads(text))


def unreadable(exc: results.StoredResultError) -> Response:
    """The answer for a stored result whose file cannot be opened: the storage answered that it is
    not there (502), or did not answer (503)."""
    return Response({"detail": str(exc)}, status=status.HTTP_502_BAD_GATEWAY if exc.missing
                    else status.HTTP_503_SERVICE_UNAVAILABLE)


def file_chunks(handle):
    with handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def instance_results(run_id: int, task: str, pk: int):
    """The JSON array of a mapped task's instances' results, in map-index order, a chunk at a time.
    A stored result that cannot be read once the answer has begun ends it there, short of its
    closing bracket (not valid JSON, so no client takes it for the whole list), and is logged."""
    yield b"["
    after, first = -1, True
    while True:
        with connection.cursor() as cursor:
            cursor.execute(INSTANCE_RESULTS, {"run": run_id, "task": task, "after": after, "limit": PAGE})
            rows = cursor.fetchall()
        for map_index, text in rows:
            if not first:
                yield b","
            first = False
            marker = stored_marker(text)
            if marker is None:
                yield b"null" if text is None else text.encode()
                continue
            try:
                handle = results.open_stored(marker)
            except results.StoredResultError:
                log.warning("the result of task run %s stopped at instance %s", pk, map_index, exc_info=True)
                raise
            yield from file_chunks(handle)
        if len(rows) < PAGE:
            break
        after = rows[-1][0]
    yield b"]"


class TaskRunResultView(APIBase):
    @extend_schema(
        tags=["runs"], summary="A task run's result, whole, as the task returned it",
        description="The value itself, as JSON: kept in the task run's row or, larger than "
                    "ORCHESTRATOR_MAX_RESULT_BYTES, streamed from the log storage (up to "
                    "ORCHESTRATOR_MAX_STORED_RESULT_BYTES). The other answers show such a result as "
                    "`{\"$stored_result\": {\"bytes\": N, \"url\": ...}}` with this URL. A mapped task's own "
                    "task run answers the list of every instance's result in map-index order, streamed (a "
                    "stored result that cannot be read then cuts the answer short, not valid JSON). A task "
                    "run without a result (not succeeded) is a 404; a succeeded task that returned nothing "
                    "answers `null`.",
        responses={(200, JSON): OpenApiResponse(OpenApiTypes.ANY, description="the result, as the task returned it"),
                   **errors(401, 403, 404, 502, 503)},
    )
    def get(self, request, pk):
        if not access.visible(request.user, TaskRun.objects.filter(pk=pk)).exists():
            raise NotFound(f"no task run {pk}")
        with connection.cursor() as cursor:
            cursor.execute(RESULT, [pk])
            row = cursor.fetchone()
        if row is None:
            raise NotFound(f"no task run {pk}")
        state, run_id, task, mapped, empty, text = row
        if empty and state != TaskState.SUCCEEDED:
            raise NotFound(NO_RESULT.format(pk=pk, state=state))
        if mapped:
            if empty:  # marked succeeded before its instances ended: no list was made
                raise NotFound(NO_RESULT.format(pk=pk, state=state) + ", without its instances' list")
            return StreamingHttpResponse(instance_results(run_id, task, pk), content_type=JSON)
        marker = stored_marker(text)
        if marker is None:
            return HttpResponse("null" if text is None else text, content_type=JSON)
        try:
            handle = results.open_stored(marker)
        except results.StoredResultError as exc:
            return unreadable(exc)
        return FileResponse(handle, content_type=JSON, filename=f"task-run-{pk}-result.json")
