"""/metrics: Prometheus text that its own parser reads, values from the database, a few queries."""

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import clock
from orchestrator.models import Attempt, Lease, Run, Schedule, TaskRun, Worker, Workflow

pytestmark = pytest.mark.django_db

METRICS = {
    "orchestrator_database_up", "orchestrator_queue_depth", "orchestrator_tasks_running",
    "orchestrator_task_outcomes_last_5m", "orchestrator_schedule_delay_seconds",
    "orchestrator_attempts_reaped_last_hour", "orchestrator_dead_letter_size", "orchestrator_workers_live",
    "orchestrator_queue_workers_live", "orchestrator_scheduler_leader_present",
    "orchestrator_scheduler_lease_epoch", "orchestrator_scheduler_lease_remaining_seconds",
    "orchestrator_scheduler_leader_info", "orchestrator_fire_times_not_run_last_hour",
}


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    families = {}
    for family in text_string_to_metric_families(response.content.decode()):
        families[family.name] = family
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def deployment():
    """A small but complete picture: work in every state, workers, a leader, reaped attempts."""
    now = clock.now()
    etl = Workflow.objects.create(name="etl")
    schedule = Schedule.objects.create(workflow=etl, cron="* * * * *")

    def run(**fields):
        return Run.objects.create(**{"logical_date": now, "trigger": "manual", **fields})

    busy = run(workflow=etl)
    tasks = [
        ("q1", "queued", "default", None), ("q2", "queued", "default", None), ("q3", "queued", "batch", None),
        ("due", "scheduled", "batch", now - timedelta(seconds=5)),
        ("later", "scheduled", "batch", now + timedelta(hours=1)),  # delayed: not yet depth
        ("r1", "running", "default", None), ("wait", "waiting", "default", None),
    ]
    for task, state, queue, due_at in tasks:
        TaskRun.objects.create(run=busy, task=task, state=state, queue=queue, due_at=due_at)

    done = run(workflow=etl, state="failed", finished_at=now)
    for task, state in (("a", "succeeded"), ("b", "succeeded"), ("c", "dead"), ("d", "upstream_failed")):
        TaskRun.objects.create(run=done, task=task, state=state, finished_at=now - timedelta(seconds=30))
    # Finished long ago: outside the outcome window, but still in the dead-letter queue.
    TaskRun.objects.create(run=done, task="old", state="dead", finished_at=now - timedelta(hours=2))
    job = run(trigger="job", state="succeeded", finished_at=now)
    job_task = TaskRun.objects.create(run=job, task="workflows.jobs:noop", state="succeeded", finished_at=now)

    for number, (outcome, age) in enumerate([("lost", 60), ("lost", 120), ("timed_out", 10), ("lost", 7200),
                                             ("succeeded", 5)], start=1):
        Attempt.objects.create(task_run=job_task, number=number, outcome=outcome, started_at=now - timedelta(hours=3),
                               finished_at=now - timedelta(seconds=age))

    for index, delay in enumerate([0.05, 0.3, 0.3, 4.0, 120.0]):
        run(workflow=etl, schedule=schedule, trigger="schedule", logical_date=now - timedelta(minutes=index + 1),
            started_at=now - timedelta(minutes=5), schedule_delay=delay)
    # Started two hours ago: outside the histogram's window.
    run(workflow=etl, schedule=schedule, trigger="schedule", logical_date=now - timedelta(days=1),
        started_at=now - timedelta(hours=2), schedule_delay=9.0)
    # A job's wait in the queue is its own series; a backfill's "delay" (days) is no delay at all.
    run(trigger="job", started_at=now, schedule_delay=0.2)
    run(workflow=etl, trigger="backfill", started_at=now, schedule_delay=86400.0)
    # Fire times not run: two skipped (catchup), one missed (start deadline); one skipped yesterday.
    for minutes, state, finished in [(61, "skipped", now), (62, "skipped", now), (63, "missed", now),
                                     (64, "skipped", now - timedelta(days=1))]:
        run(workflow=etl, schedule=schedule, trigger="schedule", logical_date=now - timedelta(minutes=minutes),
            state=state, reason="catchup=latest runs only the most recent missed fire time", finished_at=finished)

    for name, queues, age, state in [("w1", ["default"], 1, "running"), ("w2", ["default", "batch"], 3, "draining"),
                                     ("w3", ["batch"], 300, "running"), ("w4", ["gpu"], 1, "stopped")]:
        Worker.objects.create(name=name, host="h", pid=1, queues=queues, state=state, started_at=now,
                              heartbeat_at=now - timedelta(seconds=age))
    Lease.objects.create(name="scheduler", holder="scheduler@h:42", epoch=7, acquired_at=now,
                         expires_at=now + timedelta(seconds=12))


@pytest.mark.time_sensitive
def test_metrics_parse_and_describe_the_deployment(client, deployment):
    families, samples = scrape(client)
    assert METRICS <= set(families), METRICS - set(families)
    assert value(samples, "orchestrator_database_up") == 1

    # Queued plus scheduled-and-due; the delayed and waiting tasks are not depth yet.
    assert value(samples, "orchestrator_queue_depth", queue="default") == 2
    assert value(samples, "orchestrator_queue_depth", queue="batch") == 2
    assert value(samples, "orchestrator_tasks_running", queue="default") == 1
    assert value(samples, "orchestrator_tasks_running", queue="batch") == 0

    assert value(samples, "orchestrator_task_outcomes_last_5m", workflow="etl", state="succeeded") == 2
    assert value(samples, "orchestrator_task_outcomes_last_5m", workflow="etl", state="dead") == 1
    assert value(samples, "orchestrator_task_outcomes_last_5m", workflow="etl", state="upstream_failed") == 1
    assert value(samples, "orchestrator_task_outcomes_last_5m", workflow="(job)", state="succeeded") == 1

    delay = "orchestrator_schedule_delay_seconds"
    assert value(samples, f"{delay}_bucket", trigger="schedule", le="0.1") == 1
    assert value(samples, f"{delay}_bucket", trigger="schedule", le="0.5") == 3
    assert value(samples, f"{delay}_bucket", trigger="schedule", le="5.0") == 4
    assert value(samples, f"{delay}_bucket", trigger="schedule", le="60.0") == 4
    assert value(samples, f"{delay}_bucket", trigger="schedule", le="+Inf") == 5
    assert value(samples, f"{delay}_count", trigger="schedule") == 5
    assert value(samples, f"{delay}_sum", trigger="schedule") == pytest.approx(124.65)
    assert value(samples, f"{delay}_bucket", trigger="job", le="0.1") == 0
    assert value(samples, f"{delay}_bucket", trigger="job", le="0.25") == 1
    assert value(samples, f"{delay}_count", trigger="job") == 1
    assert value(samples, f"{delay}_count", trigger="backfill") is None

    assert value(samples, "orchestrator_fire_times_not_run_last_hour", workflow="etl", state="skipped") == 2
    assert value(samples, "orchestrator_fire_times_not_run_last_hour", workflow="etl", state="missed") == 1

    assert value(samples, "orchestrator_attempts_reaped_last_hour", outcome="lost") == 2
    assert value(samples, "orchestrator_attempts_reaped_last_hour", outcome="timed_out") == 1
    assert value(samples, "orchestrator_dead_letter_size") == 2

    # w3's heartbeat is stale and w4 has stopped.
    assert value(samples, "orchestrator_workers_live") == 2
    assert value(samples, "orchestrator_queue_workers_live", queue="default") == 2
    assert value(samples, "orchestrator_queue_workers_live", queue="batch") == 1
    assert value(samples, "orchestrator_queue_workers_live", queue="gpu") is None

    assert value(samples, "orchestrator_scheduler_leader_present") == 1
    assert value(samples, "orchestrator_scheduler_lease_epoch") == 7
    assert 0 < value(samples, "orchestrator_scheduler_lease_remaining_seconds") <= 12
    assert value(samples, "orchestrator_scheduler_leader_info", holder="scheduler@h:42") == 1


@pytest.mark.time_sensitive
def test_an_expired_lease_reports_no_leader(client):
    now = clock.now()
    Lease.objects.create(name="scheduler", holder="scheduler@h:42", epoch=9, acquired_at=now,
                         expires_at=now - timedelta(seconds=30))
    _, samples = scrape(client)
    assert value(samples, "orchestrator_scheduler_leader_present") == 0
    assert value(samples, "orchestrator_scheduler_lease_epoch") == 9
    assert value(samples, "orchestrator_scheduler_lease_remaining_seconds") < -25
    assert value(samples, "orchestrator_scheduler_leader_info", holder="scheduler@h:42") is None
    assert value(samples, "orchestrator_workers_live") == 0


@pytest.mark.time_sensitive
def test_a_scrape_costs_six_queries_however_much_history_there_is(client, deployment, django_assert_num_queries):
    with django_assert_num_queries(6):
        client.get("/metrics")
    run = Run.objects.filter(workflow__name="etl", state="failed").get()
    TaskRun.objects.bulk_create(
        TaskRun(run=run, task=f"extra{i}", state="succeeded", finished_at=clock.now()) for i in range(300)
    )
    with django_assert_num_queries(6):
        _, samples = scrape(client)
    assert value(samples, "orchestrator_task_outcomes_last_5m", workflow="etl", state="succeeded") == 302


@pytest.mark.time_sensitive
def test_metrics_need_the_bearer_token_when_one_is_configured(client, settings):
    settings.ORCHESTRATOR_METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    families, _ = scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert "orchestrator_dead_letter_size" in families
