"""Sensors that cost nothing while they wait, through the real claim and resolver with an injected
clock: a "not yet" wakes no process (its next check's time is known), and a check is not an
attempt."""

import pytest

from orchestrator.channels import DISPATCH_CHANNEL, DUE_CHANNEL, listen_connection, queue_channel
from orchestrator.models import TaskRun
from orchestrator.runs import trigger_workflow
from tests.features_support import run_to_end, sync_module, worker_loop

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
