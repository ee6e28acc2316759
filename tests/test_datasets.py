"""Workflows triggered by data: a producer's success writes one event per dataset, and each
consumer gets exactly one run per event (mode "any") or per full set (mode "all"), however often
the producer runs again and however many schedulers race on the event."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from orchestrator import datasets
from orchestrator.models import ConsumerRun, DatasetEvent, Run, TaskRun, Workflow
from orchestrator.runs import trigger_workflow
from tests.support.features_support import run_to_end, scheduler_tick, sync_module, worker_loop

MODULE = '''
from orchestrator.dsl import On, Param, Workflow

producer = Workflow("producer", params={{"rows": Param(int, default=3)}})

@producer.task(produces=["sales_daily", "sales_audit"])
def publish(ctx):
    ctx.metadata["sales_daily"] = {{"rows": ctx.params["rows"]}}
    return ctx.params["rows"]

fx = Workflow("fx")

@fx.task(produces=["fx_rates"])
def rates(ctx):
    return 1.1

consumer = Workflow("consumer", triggers=[On("sales_daily")]{consumer_options})

@consumer.task
def report(ctx):
    return {{"logical_date": ctx.logical_date.isoformat(), "events": ctx.events}}

joined = Workflow("joined", triggers=[On("sales_daily", "fx_rates", mode="all")])

@joined.task
def join(ctx):
    return sorted(event["dataset"] for event in ctx.events)
'''


@pytest.fixture
def workflows(tmp_path):
    return lambda consumer_options="": sync_module(tmp_path, MODULE.format(consumer_options=consumer_options))


def produce(workflows, clock, loop, name="producer", **params):
    run, _ = trigger_workflow(workflows[name], params, logical_date=clock.now() - timedelta(hours=1), now=clock.now())
    return run_to_end(run, clock, loop)


def consumer_runs(name):
    return list(Run.objects.filter(workflow__name=name).order_by("id"))


@pytest.fixture
def loop(db):
    return worker_loop()


@pytest.mark.django_db
def test_a_successful_producer_starts_one_run_of_its_consumer_with_the_event_in_ctx(workflows, clock, loop):
    wfs = workflows()
    produced = produce(wfs, clock, loop, rows=7)
    assert produced.state == "succeeded"
    event = DatasetEvent.objects.get(dataset__name="sales_daily")
    assert (event.workflow, event.task, event.run_id) == ("producer", "publish", produced.pk)
    assert event.metadata == {"rows": 7} and event.logical_date == produced.logical_date
    assert DatasetEvent.objects.get(dataset__name="sales_audit").metadata == {}
    scheduler_tick(clock)
    [run] = consumer_runs("consumer")
    assert (run.trigger, run.logical_date) == ("dataset", produced.logical_date)
    run_to_end(run, clock, loop)
    result = TaskRun.objects.get(run=run, task="report").result
    assert result["logical_date"] == produced.logical_date.isoformat()
    [seen] = result["events"]
    assert (seen["dataset"], seen["metadata"], seen["workflow"], seen["run_id"]) == (
        "sales_daily", {"rows": 7}, "producer", produced.pk)
    # Nothing more to do: the event is handled and consumed.
    scheduler_tick(clock)
    assert len(consumer_runs("consumer")) == 1 and not consumer_runs("joined")


@pytest.mark.django_db
def test_a_producer_run_again_after_its_success_does_not_start_its_consumer_twice(workflows, clock, loop):
    wfs = workflows()
    produced = produce(wfs, clock, loop)
    scheduler_tick(clock)
    task_run = TaskRun.objects.get(run=produced, task="publish")
    # The producer runs again in the same run (what clearing a task does), and succeeds again.
    TaskRun.objects.filter(pk=task_run.pk).update(state="scheduled", due_at=clock.now(), finished_at=None)
    Run.objects.filter(pk=produced.pk).update(state="running", finished_at=None)
    run_to_end(produced, clock, loop)
    assert TaskRun.objects.get(pk=task_run.pk).attempts == 2
    scheduler_tick(clock)
    assert DatasetEvent.objects.filter(dataset__name="sales_daily").count() == 1
    assert len(consumer_runs("consumer")) == 1
    # A new run of the producer is new data: one more consumer run.
    produce(wfs, clock, loop)
    scheduler_tick(clock)
    assert len(consumer_runs("consumer")) == 2


@pytest.mark.django_db
def test_mode_all_waits_for_each_dataset_since_the_last_run_and_takes_every_pending_event(workflows, clock, loop):
    wfs = workflows()
    produce(wfs, clock, loop)
    produce(wfs, clock, loop)
    scheduler_tick(clock)
    assert not consumer_runs("joined")  # fx_rates has no event yet
    produce(wfs, clock, loop, name="fx")
    scheduler_tick(clock)
    [run] = consumer_runs("joined")
    assert ConsumerRun.objects.filter(run=run).count() == 3
    run_to_end(run, clock, loop)
    assert TaskRun.objects.get(run=run).result == ["fx_rates", "sales_daily", "sales_daily"]
    produce(wfs, clock, loop, name="fx")
    scheduler_tick(clock)
    assert len(consumer_runs("joined")) == 1  # sales_daily has nothing new since


@pytest.mark.django_db
def test_a_paused_consumer_keeps_its_events_and_max_active_runs_holds_runs_back(workflows, clock, loop):
    wfs = workflows(consumer_options=", max_active_runs=1")
    Workflow.objects.filter(name="consumer").update(paused=True)
    produce(wfs, clock, loop)
    produce(wfs, clock, loop)
    scheduler_tick(clock)
    assert not consumer_runs("consumer")
    Workflow.objects.filter(name="consumer").update(paused=False)
    scheduler_tick(clock)
    first, second = consumer_runs("consumer")
    assert (first.state, second.state) == ("running", "pending")
    assert "max_active_runs" in second.reason


def _race(rounds, clock, barrier_parties=2):
    """Each round, two threads (two connections, like two schedulers that both believe they lead)
    handle the same new events at the same moment."""
    errors = []

    def scheduler_step(barrier):
        try:
            barrier.wait(timeout=10)
            with transaction.atomic():
                datasets.trigger_consumers(clock.now())
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    for _ in range(rounds):
        barrier = threading.Barrier(barrier_parties)
        threads = [threading.Thread(target=scheduler_step, args=(barrier,)) for _ in range(barrier_parties)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_racing_on_the_same_events_start_each_consumer_once_per_event(workflows, clock, loop):
    wfs = workflows()
    runs = 0
    for round_ in range(12):
        # Several producer successes per round, and the fx data every third round.
        produce(wfs, clock, loop)
        produce(wfs, clock, loop)
        if round_ % 3 == 2:
            produce(wfs, clock, loop, name="fx")
        runs += 2
        _race(1, clock)
    _race(1, clock)  # whatever a skipped-locked row left for later
    events = DatasetEvent.objects.filter(dataset__name="sales_daily")
    assert events.count() == runs
    assert not DatasetEvent.objects.filter(handled=False).exists()
    # "any": exactly one run per event.
    consumed = ConsumerRun.objects.filter(workflow__name="consumer")
    assert consumed.count() == runs and consumed.filter(run__isnull=True).count() == 0
    assert len(consumer_runs("consumer")) == runs
    assert sorted(consumed.values_list("event_id", flat=True)) == sorted(events.values_list("id", flat=True))
    # "all": each event taken by at most one run, every run has both datasets.
    for run in consumer_runs("joined"):
        names = set(ConsumerRun.objects.filter(run=run).values_list("event__dataset__name", flat=True))
        assert names == {"sales_daily", "fx_rates"}
    assert len(consumer_runs("joined")) == 4


@pytest.mark.django_db
def test_the_unique_key_refuses_a_second_pending_row_and_a_second_run_for_the_same_rows(workflows, clock, loop):
    wfs = workflows()
    produce(wfs, clock, loop)
    event = DatasetEvent.objects.get(dataset__name="sales_daily")
    consumer = wfs["consumer"]
    with connection.cursor() as cursor:
        # A scheduler that read the event before another one marked it handled inserts again.
        for _ in range(2):
            cursor.execute(datasets.INSERT_PENDING, {"events": [event.pk], "workflows": [consumer.pk],
                                                     "nows": [clock.now()]})
    [row] = ConsumerRun.objects.filter(event=event, workflow=consumer)
    run = datasets._start(consumer, [row.pk], event.logical_date, clock.now())
    with pytest.raises(datasets._Taken):
        datasets._start(consumer, [row.pk], event.logical_date, clock.now())
    assert consumer_runs("consumer") == [run]
