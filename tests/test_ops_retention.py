"""Retention: prune deletes old finished history and its logs, and nothing else."""

from datetime import timedelta

import psycopg
import pytest
from django.core.files.base import ContentFile
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator import conf, retention
from orchestrator.models import Attempt, Run, TaskRun, WebhookDelivery, Workflow


@pytest.fixture(autouse=True)
def log_storage(settings, tmp_path):
    settings.ORCHESTRATOR_LOG_STORAGE_OPTIONS = {"location": str(tmp_path / "logs")}
    return tmp_path / "logs"


def make_run(name, state, finished_ago, now, *, tasks=(("a", "succeeded"),), workflow=None):
    """A run with task runs in the given states, each with one attempt and a log file."""
    finished_at = now - finished_ago if finished_ago is not None else None
    run = Run.objects.create(workflow=workflow, logical_date=now - timedelta(days=90), trigger="manual",
                             state=state, finished_at=finished_at, reason=name)
    for task, task_state in tasks:
        task_run = TaskRun.objects.create(run=run, task=task, state=task_state, finished_at=finished_at)
        path = conf.log_storage().save(f"runs/{run.pk}/{task}/1.log", ContentFile(f"log of {name}/{task}\n"))
        Attempt.objects.create(task_run=task_run, number=1, started_at=now - timedelta(days=90),
                               finished_at=finished_at, outcome="succeeded", log_path=path)
    return run


def surviving():
    return set(Run.objects.values_list("reason", flat=True))


@pytest.mark.django_db
def test_prune_deletes_only_old_finished_runs_with_their_children_and_logs(clock):
    now = clock.now()
    wf = Workflow.objects.create(name="etl")
    old = timedelta(days=40)
    doomed = [
        make_run("old-succeeded", "succeeded", old, now, workflow=wf, tasks=[("a", "succeeded"), ("b", "succeeded")]),
        make_run("old-failed", "failed", old, now, workflow=wf, tasks=[("a", "failed"), ("b", "upstream_failed")]),
        make_run("old-cancelled", "cancelled", old, now, tasks=[("a", "cancelled")]),
        make_run("old-skipped", "skipped", old, now, tasks=[]),
        make_run("old-missed", "missed", old, now, tasks=[]),
    ]
    WebhookDelivery.objects.create(run=doomed[0], url="https://example.com/hook", event="run.succeeded")
    kept = [
        make_run("recent-succeeded", "succeeded", timedelta(days=29), now, workflow=wf),
        make_run("running", "running", None, now, tasks=[("a", "running")]),
        make_run("pending", "pending", None, now, tasks=[("a", "waiting")]),
        # Retried from the dead-letter queue: running again, but still carrying its old finish time.
        make_run("retried", "running", old, now, tasks=[("a", "scheduled")]),
        # The dead-letter queue is kept whatever its age, until someone retries or discards it.
        make_run("old-dead", "failed", old, now, workflow=wf, tasks=[("a", "succeeded"), ("b", "dead")]),
        # Cancelled, but its worker has not stopped the task yet.
        make_run("cancelling", "cancelled", old, now, tasks=[("a", "running")]),
    ]
    doomed_logs = list(Attempt.objects.filter(task_run__run__in=doomed).values_list("log_path", flat=True))
    kept_logs = list(Attempt.objects.filter(task_run__run__in=kept).values_list("log_path", flat=True))
    assert len(doomed_logs) == 5 and all(conf.log_storage().exists(path) for path in doomed_logs)

    report = retention.prune(timedelta(days=30), clock=clock)

    assert surviving() == {"recent-succeeded", "running", "pending", "retried", "old-dead", "cancelling"}
    assert (report.runs, report.task_runs, report.attempts, report.logs) == (5, 5, 5, 5)
    assert report.batches == 1 and report.log_errors == []
    assert not TaskRun.objects.filter(run_id__in=[r.pk for r in doomed]).exists()
    assert not Attempt.objects.filter(task_run__run_id__in=[r.pk for r in doomed]).exists()
    assert not WebhookDelivery.objects.exists()
    assert not any(conf.log_storage().exists(path) for path in doomed_logs)
    assert all(conf.log_storage().exists(path) for path in kept_logs)
    assert TaskRun.objects.filter(run__in=kept).count() == 7
    # Nothing left to do: a second call deletes nothing.
    assert retention.prune(timedelta(days=30), clock=clock).runs == 0


@pytest.mark.django_db
def test_prune_works_in_bounded_batches_oldest_first(clock):
    now = clock.now()
    for day in range(5):
        make_run(f"day-{day}", "succeeded", timedelta(days=40 + day), now)

    with CaptureQueriesContext(connection) as queries:
        first = retention.prune(timedelta(days=30), batch_size=2, clock=clock, max_batches=1)
    assert (first.runs, first.batches) == (2, 1)
    # The two oldest went first.
    assert surviving() == {"day-0", "day-1", "day-2"}
    assert sum("SKIP LOCKED" in q["sql"] for q in queries.captured_queries) == 1

    rest = retention.prune(timedelta(days=30), batch_size=2, clock=clock)
    # 3 runs in batches of at most 2.
    assert (rest.runs, rest.batches) == (3, 2)
    assert surviving() == set()


@pytest.mark.django_db(transaction=True)
def test_prune_skips_a_run_another_transaction_has_locked(clock):
    now = clock.now()
    locked = make_run("locked", "succeeded", timedelta(days=40), now)
    make_run("free", "succeeded", timedelta(days=40), now)
    s = connection.settings_dict
    other = psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                            host=s["HOST"] or None, port=s["PORT"] or None)
    try:
        # Someone retries the run from the UI at this very moment and holds its row lock.
        other.execute("SELECT id FROM orchestrator_run WHERE id = %s FOR UPDATE", [locked.pk])
        report = retention.prune(timedelta(days=30), clock=clock)
        assert report.runs == 1
        assert surviving() == {"locked"}
    finally:
        other.rollback()
        other.close()
    assert retention.prune(timedelta(days=30), clock=clock).runs == 1
    assert surviving() == set()


@pytest.mark.django_db
def test_prune_command_takes_an_age_in_days_hours_or_minutes(capsys):
    now = timezone.now()
    make_run("two-hours", "succeeded", timedelta(hours=2), now)
    make_run("ten-minutes", "succeeded", timedelta(minutes=10), now)

    call_command("prune", "--older-than", "1d")
    assert surviving() == {"two-hours", "ten-minutes"}
    call_command("prune", "--older-than", "90m")
    assert surviving() == {"ten-minutes"}
    out = capsys.readouterr().out
    assert "pruned 1 runs, 1 task runs, 1 attempts and 1 log files" in out


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["30", "3x", "-1d", "0d", "d", "1.5h", ""])
def test_prune_command_rejects_a_bad_age_and_deletes_nothing(value):
    make_run("old", "succeeded", timedelta(days=400), timezone.now())
    with pytest.raises(CommandError, match=r"^--older-than: .*(d \(days\), h \(hours\) or m \(minutes\)|more than zero)"):
        call_command("prune", f"--older-than={value}")
    assert surviving() == {"old"}


def test_parse_age_understands_the_three_units():
    assert retention.parse_age("30d") == timedelta(days=30)
    assert retention.parse_age("12h") == timedelta(hours=12)
    assert retention.parse_age(" 90m ") == timedelta(minutes=90)
