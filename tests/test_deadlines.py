"""Run deadlines (recorded once, announced to webhooks, the run goes on) and run timeouts (the
run is cancelled with the reason), checked by the scheduler's tick with an injected clock."""

from datetime import timedelta

import pytest

from orchestrator import dispatcher
from orchestrator.models import Run, TaskRun, WebhookDelivery, Workflow
from orchestrator.runs import trigger_workflow
from tests.support.features_support import run_to_end, scheduler_tick, sync_module, worker_loop

pytestmark = pytest.mark.django_db


@pytest.fixture
def loop(db):
    return worker_loop()

MODULE = '''
from orchestrator.dsl import Workflow

def on_failure(context):
    return context

slow = Workflow("slow", deadline=600, run_timeout=3600, webhooks=["http://127.0.0.1:9/hook"],
                on_failure=on_failure)

@slow.task
def first(ctx):
    return 1

@slow.task
def second(ctx):
    return 2

first >> second
'''


@pytest.fixture
def slow(tmp_path):
    return sync_module(tmp_path, MODULE)["slow"]


def test_a_run_past_its_deadline_is_recorded_once_announced_and_goes_on(slow, clock, loop):
    run, _ = trigger_workflow(slow, logical_date=clock.now(), now=clock.now())
    assert run.deadline_at == clock.now() + timedelta(seconds=600)
    clock.advance(seconds=599)
    scheduler_tick(clock)
    run.refresh_from_db()
    assert run.deadline_missed_at is None
    clock.advance(seconds=2)
    scheduler_tick(clock)
    scheduler_tick(clock)
    run.refresh_from_db()
    assert run.deadline_missed_at == clock.now() and run.state == "running"
    [delivery] = WebhookDelivery.objects.filter(run=run, event="deadline_missed")
    assert delivery.url == "http://127.0.0.1:9/hook"
    # The run is not stopped by it: it ends normally, and its end is announced as usual.
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    assert WebhookDelivery.objects.filter(run=run, event="deadline_missed").count() == 1
    assert WebhookDelivery.objects.filter(run=run, event="run.succeeded").count() == 1


def test_a_run_that_ends_late_between_two_checks_is_recorded_when_it_ends(slow, clock, loop):
    run, _ = trigger_workflow(slow, logical_date=clock.now() - timedelta(seconds=3000), now=clock.now())
    run_to_end(run, clock, loop)
    assert run.state == "succeeded" and run.deadline_missed_at == run.finished_at
    assert WebhookDelivery.objects.filter(run=run, event="deadline_missed").count() == 1
    scheduler_tick(clock)
    assert WebhookDelivery.objects.filter(run=run, event="deadline_missed").count() == 1


def test_a_run_in_time_records_no_miss(slow, clock, loop):
    run, _ = trigger_workflow(slow, logical_date=clock.now(), now=clock.now())
    run_to_end(run, clock, loop)
    clock.advance(seconds=3600)
    scheduler_tick(clock)
    run.refresh_from_db()
    assert run.deadline_missed_at is None
    assert not WebhookDelivery.objects.filter(event="deadline_missed").exists()


def test_a_run_still_active_after_its_run_timeout_fails_with_the_reason(slow, clock, loop):
    run, _ = trigger_workflow(slow, now=clock.now())
    assert run.timeout_at == clock.now() + timedelta(seconds=3600)
    dispatcher.tick(now=clock.now())
    loop.claim(1, clock.now())  # "first" is running on a worker
    clock.advance(seconds=3599)
    scheduler_tick(clock)
    assert Run.objects.get(pk=run.pk).state == "running"
    clock.advance(seconds=2)
    scheduler_tick(clock)
    run.refresh_from_db()
    # It fails, as a timed-out DAG run does in Airflow, saying why; its tasks are stopped.
    assert run.state == "failed"
    assert run.reason == "timed out: still active 3600s after it started (run_timeout)"
    assert dict(TaskRun.objects.filter(run=run).values_list("task", "state")) == {
        "first": "cancelled", "second": "cancelled"}
    # The workflow's on_failure callback is enqueued as a job, with the reason.
    [job] = TaskRun.objects.filter(spec__callback="on_failure")
    context = job.spec["args"][0]
    assert (context["run_id"], context["state"], context["error"]) == (run.pk, "timed_out", run.reason)
    # The workflow's webhooks hear of a failed run.
    assert sorted(WebhookDelivery.objects.filter(run=run).values_list("event", flat=True)) == [
        "deadline_missed", "run.failed"]


def test_a_held_back_run_times_out_from_when_it_starts_not_when_it_was_created(slow, clock, loop):
    Workflow.objects.filter(pk=slow.pk).update(max_active_runs=1)
    slow.refresh_from_db()
    first, _ = trigger_workflow(slow, now=clock.now())
    second, _ = trigger_workflow(slow, now=clock.now())
    assert second.state == "pending" and second.timeout_at is None
    clock.advance(seconds=1800)
    run_to_end(first, clock, loop)
    scheduler_tick(clock)  # releases the held-back run
    second.refresh_from_db()
    assert second.state == "running" and second.timeout_at == clock.now() + timedelta(seconds=3600)
