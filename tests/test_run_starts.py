"""A worker writes its claims' run starts after the claim (worker.batch.RUN_STARTS): a one-task
job's run start goes into the same row version as its end when the job ends within
START_SECONDS, so a job writes its run once after creating it; a job that runs longer, one that
ends without ending its run (a retry), and a task of a run of many get their run's start
written by a batch, with the claim's time. Counted in rows written, never timed."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.jobs import enqueue_many
from orchestrator.models import Run
from orchestrator.states import RunState
from tests.test_throughput import REF, job_table_writes, since

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock(clock):
    """The test's clock, pinned: the worker's batches read it (the claim's and the ends' times)."""
    from orchestrator import clock as process_clock

    with process_clock.pinned(clock):
        yield clock


def claimed_by(worker, n: int, clock) -> list[dict]:
    """Claim n task runs in a worker batch of their own (a claim without run starts)."""
    claimed = worker.batch.flush(claim=n)
    assert len(claimed) == n
    return claimed


def ended(message: dict, outcome: str, *, job: bool = True):
    from orchestrator.resolver import Ending

    return Ending(message["id"], message["number"], outcome, result="null" if outcome == "succeeded" else None,
                  error="" if outcome == "succeeded" else "boom", job=job, run_id=message["run_id"])


def test_a_job_ending_within_the_wait_writes_its_run_once_with_its_start_and_end(clock):
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(10)], now=clock.now())
    worker = Worker(["default"], concurrency=10)
    worker.register()
    claimed_at = clock.now()
    before = job_table_writes()
    claimed = claimed_by(worker, 10, clock)
    assert since(before)["run"] == (0, 0, 0)  # the claim writes no run row
    assert not Run.objects.filter(started_at__isnull=False).exists()
    assert sorted(worker.batch.starts) == sorted(m["id"] for m in claimed)

    clock.advance(1)
    for message in claimed:
        worker.batch.add(ended(message, AttemptOutcome.SUCCEEDED))
    before = job_table_writes()
    worker.batch.flush()
    # One row version of each run: ended, with the start its claim gave it.
    assert since(before)["run"][:2] == (0, 10)
    assert worker.batch.starts == {}
    runs = Run.objects.filter(pk__in=[m["run_id"] for m in claimed])
    assert {(r.state, r.started_at, r.finished_at) for r in runs} == {
        (RunState.SUCCEEDED, claimed_at, claimed_at + timedelta(seconds=1))}
    assert all(r.schedule_delay is not None for r in runs)


def test_a_start_not_ended_within_the_wait_is_written_by_a_batch_unless_the_claim_is_no_longer_its(
        clock, monkeypatch):
    from orchestrator.worker import Worker, batch
    from orchestrator.worker.drain import hand_back

    monkeypatch.setattr(batch, "START_SECONDS", 0.0)  # due at the next batch
    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(3)], now=clock.now())
    first, second = Worker(["default"], concurrency=3), Worker(["default"], concurrency=1)
    first.register()
    second.register()
    claimed_at = clock.now()
    claimed = claimed_by(first, 3, clock)
    kept, given = claimed[:2], claimed[2]
    # Handed back without the batch hearing of it (as after a crash between the two), and claimed
    # again by another worker: the first one's pending start is no longer its to write.
    hand_back([given], "test", worker_id=first.id, queues=["default"])
    clock.advance(2)
    (again,) = claimed_by(second, 1, clock)
    assert again["id"] == given["id"]

    clock.advance(3)
    assert first.batch.starts_due(float("inf"))
    before = job_table_writes()
    assert first.batch.flush() == []
    assert since(before)["run"][:2] == (0, 2)
    assert first.batch.starts == {}
    starts = dict(Run.objects.values_list("pk", "started_at"))
    assert [starts[m["run_id"]] for m in kept] == [claimed_at, claimed_at]
    assert starts[given["run_id"]] is None

    second.batch.flush()  # the claim that runs it writes its start
    assert Run.objects.get(pk=given["run_id"]).started_at == claimed_at + timedelta(seconds=2)


def test_an_ending_that_does_not_end_its_run_in_place_writes_the_start_in_its_batch(clock):
    """A retry leaves the run running, and an ending not known as a job's (a child that died, a
    timeout) ends its run later in the batch (FINISH_RUNS): either way the batch writes the
    run's start, before the run's end."""
    from orchestrator.jobs import enqueue
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker import Worker

    retried, _ = enqueue(REF, kwargs={"user_id": 1}, max_attempts=2, now=clock.now())
    died, _ = enqueue(REF, kwargs={"user_id": 2}, max_attempts=1, now=clock.now())
    worker = Worker(["default"], concurrency=2)
    worker.register()
    claimed_at = clock.now()
    claimed = {m["run_id"]: m for m in claimed_by(worker, 2, clock)}
    clock.advance(1)
    worker.batch.add(ended(claimed[retried.pk], AttemptOutcome.FAILED))
    worker.batch.add(ended(claimed[died.pk], AttemptOutcome.FAILED, job=False))
    worker.batch.flush()
    retried.refresh_from_db()
    died.refresh_from_db()
    assert (retried.state, retried.started_at) == (RunState.RUNNING, claimed_at)
    assert (died.state, died.started_at, died.finished_at) == (RunState.FAILED, claimed_at,
                                                                claimed_at + timedelta(seconds=1))
    assert retried.schedule_delay is not None and died.schedule_delay is not None


def test_only_the_claim_of_a_run_s_first_task_waits_to_start_the_run(tmp_path, clock):
    """A run of many tasks starts at its first task's claim; the tasks claimed after that (a map's
    instances, the task that joins them) find it started and leave nothing for RUN_STARTS."""
    from orchestrator import executor, resolver
    from orchestrator.resolver import Ending
    from orchestrator.runs import trigger_workflow
    from tests.support.features_support import sync_module, worker_loop
    from tests.test_mapping_scale import MODULE

    big = sync_module(tmp_path, MODULE)["big"]
    loop = worker_loop()
    run, _ = trigger_workflow(big, {"n": 5}, now=clock.now())
    pending, claimed, first_claim = [], [], None
    for _ in range(50):
        for message in claimed:
            loop.batch.add(Ending(*executor.run(message), run_id=message["run_id"],
                                  unlocked=resolver.settles_later(message)))
        had = bool(claimed)
        clock.advance(1)
        claimed = loop.batch.flush(claim=10)
        first_claim = first_claim or (claimed and clock.now())
        pending.append([(m["task"], m["id"] in loop.batch.starts) for m in claimed])
        if not claimed and not had:
            break
    run.refresh_from_db()
    assert (run.state, run.started_at) == (RunState.SUCCEEDED, first_claim)
    assert run.schedule_delay is not None
    assert [each for each in pending if each] == [[("listing", True)], [("one", False)] * 5, [("total", False)]]
    assert loop.batch.starts == {}


def test_a_worker_wakes_for_a_run_start_and_writes_it_with_nothing_else_to_do(clock):
    import time

    from orchestrator.worker import Worker, batch

    enqueue_many([{"ref": REF, "kwargs": {"user_id": 1}}], now=clock.now())
    worker = Worker(["default"], concurrency=1)
    worker.register()
    worker.next_poll = worker.next_heartbeat = float("inf")  # nothing else to do: no poll, no heartbeat
    claimed_at = clock.now()
    (claimed,) = claimed_by(worker, 1, clock)
    assert 0 < worker.next_wait() <= batch.START_SECONDS  # its loop wakes when the start is due
    assert worker.record_and_claim(time.monotonic()) is False  # not due yet: no batch
    assert Run.objects.get(pk=claimed["run_id"]).started_at is None

    # Its START_SECONDS passed (what the loop's wait ends at).
    worker.batch.starts = {key: (*start[:3], time.monotonic()) for key, start in worker.batch.starts.items()}
    assert worker.next_wait() == 0
    assert worker.record_and_claim(time.monotonic()) is True
    assert Run.objects.get(pk=claimed["run_id"]).started_at == claimed_at
    assert worker.batch.starts == {} and worker.next_wait() > batch.START_SECONDS
