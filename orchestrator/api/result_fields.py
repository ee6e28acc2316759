"""How the API shows a task run's result: kept in the row, as it is; kept in the log storage
(``orchestrator.results``), by its size and the URL of ``GET /api/task-runs/{id}/result/``, the one
answer that sends the value (``api.task_results``). Nothing here reads the storage."""

from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers

from orchestrator import results


def result_url(task_run_id: int) -> str:
    return reverse("orchestrator:api:task-run-result", args=[task_run_id])


def stored_pointer(marker: dict) -> dict:
    """A result kept in the log storage as the API's answers show it: its size and where to get it."""
    task_run_id = results.task_run_of(marker)
    return {results.KEY: {"bytes": marker.get("bytes"),
                          "url": result_url(task_run_id) if task_run_id is not None else None}}


def listed_result(value):
    """A task run's result as every answer but ``GET /api/task-runs/{id}/result/`` shows it: one kept
    in the row as it is, one kept in the log storage (a marker; in a mapped task's list, each such
    instance's) as ``{"$stored_result": {"bytes": N, "url": ...}}``. The storage is never read, so a
    page of 100 task runs costs what their rows hold, whatever their results weigh."""
    marker = results.marker_of(value)
    if marker is not None:
        return stored_pointer(marker)
    if isinstance(value, list) and any(results.marker_of(item) is not None for item in value):
        return [stored_pointer(marker) if (marker := results.marker_of(item)) is not None else item
                for item in value]
    return value


STORED_RESULT_HELP = ("a result larger than ORCHESTRATOR_MAX_RESULT_BYTES is kept in the log storage and "
                      "shown as {\"$stored_result\": {\"bytes\": N, \"url\": ...}}: GET that url "
                      "(/api/task-runs/{id}/result/) for the value")


class ResultField(serializers.JSONField):
    """A task run's result as the task returned it, or, kept in the log storage, its size and URL
    (``listed_result``): never read from the storage here."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", STORED_RESULT_HELP)
        super().__init__(**kwargs)

    def to_representation(self, value):
        return super().to_representation(listed_result(value))
