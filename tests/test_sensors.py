"""Sensors that cost nothing while they wait, through the real claim and resolver with an injected
clock: a "not yet" wakes no process (its next check's time is known), and a check is not an
attempt."""

from datetime import timedelta

import pytest
from django.db import transaction

from orchestrator import executor, resolver
from orchestrator.channels import DISPATCH_CHANNEL, DUE_CHANNEL, listen_connection, queue_channel
from orchestrator.models import Attempt, TaskRun
from orchestrator.resolver import Ending
from orchestrator.runs import trigger_workflow
from orchestrator.worker.batch import CHECK_LEASE_SECONDS
from tests.support.features_support import run_to_end, sync_module, worker_loop

MODULE = '''
import os

from orchestrator.dsl import Param, Workflow

sensing = Workflow("sensing", params={"flag": Param(str, default="")})

@sensing.sensor(every=30, timeout=3600)
def arrived(ctx):
    if os.path.exists(ctx.params["flag"]):
        return {"found": ctx.params["flag"]}
    return False

@sensing.task(retries=2, retry_delay=0)
def flaky(ctx):
    raise ValueError("flaky fails")

arrived >> flaky
'''


@pytest.fixture
def workflows(tmp_path):
    return sync_module(tmp_path, MODULE)


def notifications(listener) -> list[str]:
    return [note.channel for note in listener.notifies(timeout=0.2, stop_after=100)]


@pytest.mark.django_db(transaction=True)
def test_a_not_yet_wakes_no_process_and_a_retry_due_now_still_does(workflows, clock, tmp_path):
    loop = worker_loop()
    flag = tmp_path / "flag"
    runs = [trigger_workflow(workflows["sensing"], {"flag": str(flag)}, now=clock.now())[0] for _ in range(5)]
    listener = listen_connection(DISPATCH_CHANNEL, DUE_CHANNEL, queue_channel("default"))
    try:
        checks = 0
        for _ in range(3):
            for run in runs:
                run_to_end(run, clock, loop)
            checks += len(runs)
            # Every check said "not yet": nothing was sent to any process, whose roles wait for
            # the next due time they know.
            assert notifications(listener) == []
            clock.advance(seconds=30)
        assert checks == 15
        sensors = TaskRun.objects.filter(run__in=runs, task="arrived")
        assert sensors.count() == 5 and not sensors.filter(due_at__lt=clock.now()).exists()
        # The control: the same listener hears a task released and retried at once.
        flag.touch()
        run_to_end(runs[0], clock, loop, rounds=1)
        assert TaskRun.objects.get(run=runs[0], task="arrived").state == "succeeded"
        assert DUE_CHANNEL in notifications(listener)
        run_to_end(runs[0], clock, loop, rounds=1)
        assert TaskRun.objects.get(run=runs[0], task="flaky").state == "scheduled"
        assert DUE_CHANNEL in notifications(listener)
    finally:
        listener.close()


FLAKY_SENSOR = '''
import os

from orchestrator.dsl import Param, Workflow

flaky = Workflow("flaky", params={"flag": Param(str, default=""), "boom": Param(str, default="")})

@flaky.sensor(every=60, timeout=3600, retries=1, retry_delay=0)
def arrived(ctx):
    if os.path.exists(ctx.params["boom"]):
        os.remove(ctx.params["boom"])
        raise OSError("the share is away")
    return os.path.exists(ctx.params["flag"]) and "here"
'''


@pytest.mark.django_db
def test_checks_are_no_attempts_a_raising_check_is_a_failed_attempt_and_retries(tmp_path, clock):
    wfs = sync_module(tmp_path, FLAKY_SENSOR, name="flakymod")
    loop = worker_loop()
    flag, boom = tmp_path / "flag", tmp_path / "boom"
    run, _ = trigger_workflow(wfs["flaky"], {"flag": str(flag), "boom": str(boom)}, now=clock.now())
    started = clock.now()
    for n in range(1, 4):
        run_to_end(run, clock, loop)
        sensor = TaskRun.objects.get(run=run, task="arrived")
        # Waiting: a row with its check count, latest answer and next check; one attempt, still open.
        assert (sensor.state, sensor.checks, sensor.last_answer) == ("sensing", n, "false")
        assert sensor.due_at == clock.now() + timedelta(seconds=60) and sensor.worker_id == loop.id
        assert list(Attempt.objects.filter(task_run=sensor).values_list("number", "outcome", "finished_at")) == [
            (1, "rescheduled", None)]
        clock.advance(seconds=60)
    # A check that raises ends the try as a failed attempt; the retry rule gives it another.
    boom.touch()
    run_to_end(run, clock, loop, rounds=1)
    sensor = TaskRun.objects.get(run=run, task="arrived")
    assert sensor.state == "scheduled" and sensor.attempts == 1 and sensor.checks == 4
    first = Attempt.objects.get(task_run=sensor, number=1)
    assert first.outcome == "failed" and "the share is away" in first.error
    assert first.started_at == started and first.finished_at == clock.now()
    # The second try: its own attempt, which spans its checks until one says yes.
    run_to_end(run, clock, loop)
    clock.advance(seconds=60)
    flag.touch()
    run_to_end(run, clock, loop)
    sensor = TaskRun.objects.get(run=run, task="arrived")
    assert (sensor.state, sensor.result, sensor.attempts, sensor.checks) == ("succeeded", "here", 2, 6)
    assert list(Attempt.objects.filter(task_run=sensor).order_by("number").values_list("outcome", flat=True)) == [
        "failed", "succeeded"]
    run.refresh_from_db()
    assert run.state == "succeeded"


@pytest.mark.django_db
def test_a_check_claimed_again_after_its_lease_is_recorded_once(workflows, clock, tmp_path):
    first, second = worker_loop(), worker_loop()
    run, _ = trigger_workflow(workflows["sensing"], {"flag": str(tmp_path / "never")}, now=clock.now())
    run_to_end(run, clock, first, rounds=1)  # the first check, an attempt: not yet
    clock.advance(seconds=30)
    with transaction.atomic():
        (lost,) = first.claim(1, clock.now())  # a waiting sensor's check: no attempt, a lease
    assert lost["check"] == 1 and TaskRun.objects.get(pk=lost["id"]).due_at == clock.now() + timedelta(
        seconds=CHECK_LEASE_SECONDS)
    assert first.claim(1, clock.now()) == []  # held by its lease
    clock.advance(seconds=CHECK_LEASE_SECONDS)
    with transaction.atomic():
        (again,) = second.claim(1, clock.now())
    # The first worker's late answer changes nothing; the second's counts.
    with transaction.atomic():
        assert resolver.end_attempts([Ending(*executor.run(lost), check=lost["check"])],
                                     worker_id=first.id, now=clock.now()) == []
        assert len(resolver.end_attempts([Ending(*executor.run(again), check=again["check"])],
                                         worker_id=second.id, now=clock.now())) == 1
    sensor = TaskRun.objects.get(pk=again["id"])
    assert sensor.state == "sensing" and sensor.checks == 2 and sensor.attempts == 1


@pytest.mark.django_db
def test_a_waiting_sensor_shows_its_checks_and_next_check_on_its_page_and_in_the_api(workflows, clock, tmp_path,
                                                                                     client):
    from django.urls import reverse

    from orchestrator import access
    from tests.support.api_support import client_for, make_user

    loop = worker_loop()
    run, _ = trigger_workflow(workflows["sensing"], {"flag": str(tmp_path / "flag")}, now=clock.now())
    for _ in range(2):
        run_to_end(run, clock, loop)
        clock.advance(seconds=30)
    sensor = TaskRun.objects.get(run=run, task="arrived")
    viewer = make_user("victor", access.VIEWERS)
    client.force_login(viewer)
    html = client.get(reverse("orchestrator:web:task_run", args=[sensor.pk])).content.decode()
    body = client_for(viewer).get(reverse("orchestrator:api:task-run", args=[sensor.pk])).json()
    # One attempt tab for the whole wait, not one per check; the waiting said in words, its time a
    # <time> element that the page shows in the viewer's time zone, as every time there.
    assert html.count('data-outcome="') == 1 and 'data-outcome="rescheduled"' in html
    assert 'id="sensor-waiting">waiting, 2 checks, next check at <time datetime="2026-03-02T09:01:00Z"' in html
    assert "(last answer <code>false</code>)" in html
    assert body["state"] == "sensing" and body["attempts"] == 1 and len(body["attempt_list"]) == 1
    assert body["sensor"] == {"waiting": True, "checks": 2, "last_answer": "false",
                              "next_check_at": "2026-03-02T09:01:00Z"}


@pytest.mark.django_db
def test_checks_a_stopping_worker_will_not_run_are_due_again_at_once_not_after_their_lease(workflows, clock,
                                                                                           tmp_path):
    stopping, other = worker_loop(), worker_loop()
    run, _ = trigger_workflow(workflows["sensing"], {"flag": str(tmp_path / "never")}, now=clock.now())
    run_to_end(run, clock, stopping, rounds=1)
    clock.advance(seconds=30)
    with transaction.atomic():
        claimed = stopping.claim(1, clock.now())
    assert other.claim(1, clock.now()) == []  # leased to the stopping worker
    clock.advance(seconds=5)
    stopping.batch.release_checks(claimed, now=clock.now())
    assert TaskRun.objects.get(pk=claimed[0]["id"]).due_at == clock.now()
    with transaction.atomic():
        assert [m["id"] for m in other.claim(1, clock.now())] == [claimed[0]["id"]]


HANGING_SENSOR = '''
import os
import time

from orchestrator.dsl import Param, Workflow

hanging = Workflow("hanging", params={"hang": Param(str, default="")})

@hanging.sensor(every=10, timeout=None, poke_timeout=0.3)
def stuck(ctx):
    if os.path.exists(ctx.params["hang"]):
        time.sleep(30)
    return False
'''


@pytest.mark.django_db
def test_a_hanging_check_in_a_batch_times_out_alone_and_the_others_are_answered(tmp_path, clock):
    wfs = sync_module(tmp_path, HANGING_SENSOR, name="hangmod")
    loop = worker_loop()
    hang = tmp_path / "hang"
    runs = [trigger_workflow(wfs["hanging"], {"hang": str(hang) if i == 1 else ""}, now=clock.now())[0]
            for i in range(3)]
    for run in runs:
        run_to_end(run, clock, loop, rounds=1)
    clock.advance(seconds=10)
    hang.touch()
    with transaction.atomic():
        checks = loop.claim(3, clock.now())
    assert len(checks) == 3 and all("check" in m for m in checks)
    replies = executor.run_checks({"checks": checks})  # one round trip for the three
    outcomes = {reply[0]: reply[2] for reply in replies}
    hung = TaskRun.objects.get(run=runs[1]).pk
    assert outcomes.pop(hung) == "timed_out" and set(outcomes.values()) == {"rescheduled"}
    with transaction.atomic():
        resolver.end_attempts([Ending(*reply, check=m["check"]) for m, reply in zip(checks, replies, strict=True)],
                              worker_id=loop.id, now=clock.now())
    states = dict(TaskRun.objects.filter(run__in=runs).values_list("pk", "state"))
    assert states.pop(hung) == "dead" and set(states.values()) == {"sensing"}
    assert "the check was interrupted" in Attempt.objects.get(task_run_id=hung).error


@pytest.mark.django_db
def test_a_waiting_sensor_marked_or_cancelled_by_hand_leaves_no_try_open(workflows, clock, tmp_path):
    from orchestrator import control

    loop = worker_loop()
    runs = [trigger_workflow(workflows["sensing"], {"flag": str(tmp_path / "never")}, now=clock.now())[0]
            for _ in range(2)]
    for run in runs:
        run_to_end(run, clock, loop)
    marked, cancelled = (TaskRun.objects.get(run=run, task="arrived") for run in runs)
    assert marked.state == cancelled.state == "sensing"
    assert control.mark_task_runs([marked.pk], "succeeded", now=clock.now()) == [marked.pk]
    assert control.cancel_run(runs[1].pk)
    for sensor in (marked, cancelled):
        attempt = Attempt.objects.get(task_run=sensor)
        assert attempt.outcome == "cancelled" and attempt.finished_at is not None
    assert "marked succeeded" in Attempt.objects.get(task_run=marked).error
    assert TaskRun.objects.get(pk=cancelled.pk).state == "cancelled"
