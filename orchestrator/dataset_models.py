"""The datasets' tables: the datasets, each successful production of one (an event) and each
event as seen by one consumer workflow. ``orchestrator.datasets`` writes and reads them.

Defined here rather than in ``models.py`` to keep that module to the core of runs and tasks;
``models.py`` imports them, so they are the app's models like the others.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Dataset(models.Model):
    """A named piece of data that tasks produce (``produces=[...]``) and workflows wait for
    (``triggers=[On(...)]``). Created by the first event or sync that names it."""

    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class DatasetEvent(models.Model):
    """One successful production of a dataset. Written in the transaction that records the
    producer's success; at most one per producing task run (a producer run again after its
    success, by a retry or a clear, does not announce the same data twice)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="events")
    task_run = models.ForeignKey("orchestrator.TaskRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey("orchestrator.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="dataset_events")
    # Kept by name too: the producer's run may be pruned long before its events.
    workflow = models.CharField(max_length=200, blank=True)
    task = models.CharField(max_length=255, blank=True)
    logical_date = models.DateTimeField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    # False until a scheduler has recorded this event for each of its consumers.
    handled = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "task_run"], name="datasetevent_unique_producer"),
        ]
        indexes = [
            models.Index(fields=["id"], condition=Q(handled=False), name="datasetevent_unhandled"),
            models.Index(fields=["dataset", "-id"], name="datasetevent_by_dataset"),
        ]

    def __str__(self):
        return f"{self.dataset.name} event #{self.pk}"


class ConsumerRun(models.Model):
    """An event as seen by one consumer workflow: pending until a run of the consumer takes it
    (at once for a trigger in mode "any"; for mode "all", when each of its datasets has one).
    UNIQUE (event, workflow): racing schedulers and retried producers cannot start a consumer
    twice for one event."""

    event = models.ForeignKey(DatasetEvent, on_delete=models.CASCADE, related_name="consumers")
    workflow = models.ForeignKey("orchestrator.Workflow", on_delete=models.CASCADE, related_name="consumed_events")
    run = models.ForeignKey("orchestrator.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="consumed_events")
    created_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["event", "workflow"], name="consumerrun_unique_event")]
        indexes = [models.Index(fields=["workflow", "id"], condition=Q(consumed_at__isnull=True),
                                name="consumerrun_pending")]

    def __str__(self):
        return f"event #{self.event_id} for {self.workflow.name}"
