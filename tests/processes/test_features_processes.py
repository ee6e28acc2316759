"""Mapping, sensors and data triggers with real worker, reaper and scheduler processes, crashes by
real signals; what ran is recorded by the tasks themselves (tests/support/feature_tasks.py)."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from orchestrator.models import Attempt, ConsumerRun, DatasetEvent, Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run, trigger_workflow
from orchestrator.worker.batch import CHECKS_PER_CHILD
from tests.conftest import process_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REF = "tests.support.feature_tasks"
FAST = {
    "ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5",
    "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS": "3",
    "ORCHESTRATOR_POLL_SECONDS": "0.5",
    "ORCHESTRATOR_JOB_MODULES": f"workflows.jobs,tests.support.tasks_for_tests,{REF}",
}


@pytest.fixture
def env(tmp_path):
    return process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"), **FAST)


def task(fn, upstream=(), **extra):
    return {"kind": "python", "ref": f"{REF}:{fn}", "upstream": list(upstream), **extra}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def start_worker(processes, env, concurrency, name):
    from orchestrator.models import Worker

    proc = processes.start("worker", "--queues", "default", "--concurrency", str(concurrency), env=env, name=name)
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 30, message=f"{name} to register")
    return proc


def run_state(run):
    return Run.objects.values_list("state", flat=True).get(pk=run.pk)


def test_a_map_survives_a_worker_killed_in_the_middle_each_item_done_and_the_results_in_order(processes, env, tmp_path):
    record = tmp_path / "work.jsonl"
    items = 40
    run, _ = create_run(None, trigger="job", params={"items": items, "sleep": 0.3, "record": str(record)}, tasks={
        "listing": task("listing", mapped_by=["work"]),
        "work": task("work", ["listing"], map_over="listing", max_attempts=3, retry_delay=0),
        "collect": task("collect", ["work"]),
    })
    assert run.dynamic
    processes.start("dispatcher", env=env)
    doomed = start_worker(processes, env, 4, "doomed")
    # Kill it while instances run: some started, not all ended.
    wait_for(lambda: sum(1 for r in records(record) if r["event"] == "end") >= 8, 60, message="some instances to end")
    processes.stop(doomed, signal.SIGKILL)
    killed_at = time.time()
    start_worker(processes, env, 4, "rescuer")
    processes.start("reaper", "--interval", "0.5", env=env)
    wait_for(lambda: run_state(run) not in ("pending", "running"), 120, message="the run to end")
    assert run_state(run) == "succeeded"
    own = TaskRun.objects.get(run=run, task="work", map_index=-1)
    assert own.result == [i * 10 for i in range(items)]
    assert TaskRun.objects.get(run=run, task="collect").result == sum(i * 10 for i in range(items))
    instances = TaskRun.objects.filter(run=run, task="work", map_index__gte=0)
    assert instances.count() == items and set(instances.values_list("state", flat=True)) == {"succeeded"}
    # The killed worker's instances were lost and ran again elsewhere; no instance ran twice at once.
    lost = Attempt.objects.filter(task_run__in=instances, outcome="lost")
    assert lost.exists()
    events = records(record)
    for attempt in lost:
        index = attempt.task_run.map_index
        again = [e for e in events if e["index"] == index and e["event"] == "start" and e["attempt"] > attempt.number]
        assert again and min(e["at"] for e in again) > killed_at
    ended = {e["index"] for e in events if e["event"] == "end"}
    assert ended == set(range(items))


def test_a_thousand_waiting_sensors_hold_no_worker_slot_while_other_jobs_run(processes, env, tmp_path):
    flag, record, jobs_record = tmp_path / "flag", tmp_path / "checks.jsonl", tmp_path / "jobs.jsonl"
    every = 600  # no second check comes due during the test unless the test moves the due times
    spec = task("wait_for_flag", sensor={"every": every, "timeout": 3600}, timeout=30)
    with transaction.atomic():
        sensors = [create_run(None, trigger="job", params={"flag": str(flag), "record": str(record)},
                              tasks={"sensor": spec})[0] for _ in range(1000)]
    sensor_rows = TaskRun.objects.filter(run__in=sensors)
    processes.start("dispatcher", env=env)
    worker = start_worker(processes, env, 2, "two-slots")
    # The first round of checks: every sensor says "not yet" and waits ("sensing"), due later.
    wait_for(lambda: sensor_rows.filter(state="sensing", checks=1).count() == 1000, 180,
             message="every sensor's first check")
    # Waiting costs rows, not slots: no sensor is queued or running, so other work starts at once.
    assert not sensor_rows.filter(state__in=["queued", "running"]).exists()
    with transaction.atomic():
        jobs = [create_run(None, trigger="job", tasks={"job": {
            "kind": "python", "ref": "tests.support.tasks_for_tests:record_job", "call": "job",
            "args": [str(jobs_record)], "kwargs": {"tag": f"job-{i}"}}})[0] for i in range(20)]
    submitted = time.time()
    wait_for(lambda: Run.objects.filter(pk__in=[j.pk for j in jobs], state="succeeded").count() == 20, 60,
             message="the other jobs")
    starts = [e["at"] for e in records(jobs_record) if e["event"] == "start"]
    assert len(starts) == 20 and max(starts) - submitted < 20
    # And no busy loop: while they wait, nothing checks them again.
    assert len(records(record)) == 1000
    assert not sensor_rows.filter(state__in=["queued", "running"]).exists()
    # Their interval passes (the test moves their due time instead of waiting ten minutes): one
    # more check each, and each sees the flag.
    flag.touch()
    TaskRun.objects.filter(run__in=sensors, state="sensing").update(due_at=timezone.now())
    wait_for(lambda: sensor_rows.filter(state="succeeded").count() == 1000, 180,
             message="every sensor to see the flag")
    assert len(records(record)) == 2000
    # Two checks each, one attempt each (a check is not an attempt).
    assert set(sensor_rows.values_list("checks", "attempts")) == {(2, 1)}
    assert Attempt.objects.filter(task_run__run__in=sensors).count() == 1000
    assert set(sensor_rows.values_list("result", flat=True)) == {"seen"}
    processes.stop(worker)
    # The second round were waiting sensors' checks: many per round trip to a child, not one each.
    checks, batches = map(int, re.search(r"\((\d+) waiting sensors' checks in (\d+) batches\)",
                                         processes.output(worker)).groups())
    assert checks == 1000 and batches <= 2 * 1000 // CHECKS_PER_CHILD


def _data_workflows(record: Path):
    params = {"record": {"type": "str", "required": False, "default": str(record), "description": ""}}
    producer = Workflow.objects.create(name="producer")
    producer.current_version = WorkflowVersion.objects.create(workflow=producer, number=1, hash="p", spec={
        "params": params, "tasks": {"publish": task("publish_once", produces=["sales"], max_attempts=3,
                                                    retry_delay=0)}})
    producer.save()
    consumer = Workflow.objects.create(name="consumer")
    consumer.current_version = WorkflowVersion.objects.create(workflow=consumer, number=1, hash="c", spec={
        "params": params, "triggers": [{"datasets": ["sales"], "mode": "any"}],
        "tasks": {"consume": task("consume")}})
    consumer.save()
    return producer, consumer


def test_a_producer_retried_after_doing_its_work_starts_its_consumer_once(processes, env, tmp_path):
    record = tmp_path / "data.jsonl"
    producer, consumer = _data_workflows(record)
    processes.start("dispatcher", env=env)
    processes.start("scheduler", env=env)
    doomed = start_worker(processes, env, 1, "doomed")
    run, _ = trigger_workflow(producer)
    # Attempt 1 published, then its worker dies before the success is recorded.
    wait_for(lambda: any(r["event"] == "publish" for r in records(record)), 60, message="the first publish")
    processes.stop(doomed, signal.SIGKILL)
    start_worker(processes, env, 1, "rescuer")
    processes.start("reaper", "--interval", "0.5", env=env)
    wait_for(lambda: run_state(run) == "succeeded", 90, message="the producer to succeed")
    wait_for(lambda: Run.objects.filter(workflow=consumer, state="succeeded").exists(), 60,
             message="the consumer run")
    # The work ran twice (at least once), the event and the consumer run exist once.
    assert [r["attempt"] for r in records(record) if r["event"] == "publish"] == [1, 2]
    [event] = DatasetEvent.objects.filter(dataset__name="sales")
    assert event.metadata == {"attempt": 2}
    time.sleep(2)  # a few more scheduler ticks: nothing more is started
    assert Run.objects.filter(workflow=consumer).count() == 1
    assert [r["event"] for r in records(record)].count("consume") == 1


def test_two_schedulers_racing_on_the_same_events_start_one_consumer_run_per_event(processes, env, tmp_path):
    record = tmp_path / "data.jsonl"
    producer, consumer = _data_workflows(record)
    env = {**env, "LOG_LEVEL": "INFO"}
    schedulers = [processes.start("scheduler", "--no-lease", env=env, name=name)
                  for name in ("scheduler-a", "scheduler-b")]
    wait_for(lambda: all(" started (lease" in processes.output(proc) for proc in schedulers), 60,
             message="both schedulers up")
    # Producer successes written the way the resolver writes them, in bursts the two schedulers
    # see at the same moment, until both have started runs from them (they really raced); a burst
    # goes to whichever scheduler looks first, so how many bursts that takes varies.
    from orchestrator import datasets

    def both_started_runs():
        return all("started run" in processes.output(proc) for proc in schedulers)

    events = 0
    for burst in range(60):
        with transaction.atomic():
            produced = []
            for _ in range(15):
                run, _ = trigger_workflow(producer)
                produced.append(TaskRun.objects.get(run=run).pk)
            TaskRun.objects.filter(pk__in=produced).update(state="succeeded")
            events += datasets.record_events(produced, now=run.created_at)
        if burst >= 9 and both_started_runs():
            break
        time.sleep(0.2 * (burst % 3))
    assert both_started_runs(), [processes.output(proc) for proc in schedulers]
    wait_for(lambda: ConsumerRun.objects.filter(workflow=consumer, run__isnull=False).count() == events, 60,
             message="a consumer run for every event")
    time.sleep(2)  # a few more scheduler ticks: nothing more is started
    assert events == 15 * (burst + 1)
    assert Run.objects.filter(workflow=consumer).count() == events
    assert ConsumerRun.objects.filter(workflow=consumer).count() == events
    assert not DatasetEvent.objects.filter(handled=False).exists()
