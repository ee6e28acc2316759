"""manage.py deploy_local: restarts a role that dies, stops all of them on SIGTERM, rejects bad options."""

import os
import re
import signal

import pytest
from django.core.management import CommandError, call_command

from orchestrator.models import Worker
from tests.conftest import wait_for


def started_pids(output: str, name: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"\[deploy_local\] started {name} pid (\d+)", output)]


@pytest.mark.django_db(transaction=True)
def test_it_restarts_a_killed_role_and_stops_everything_on_sigterm(processes):
    supervisor = processes.start("deploy_local", "--web-workers", "0", "--schedulers", "0", "--dispatchers", "1",
                                 "--worker", "default", "--concurrency", "1", "--grace", "5")
    # Killed once it has started, so that the second "dispatcher started" below is the new one's.
    wait_for(lambda: Worker.objects.filter(state="running").exists() and started_pids(
        processes.output(supervisor), "dispatcher-1") and "dispatcher started" in processes.output(supervisor),
        timeout=30, message="the worker and the dispatcher")
    (first,) = started_pids(processes.output(supervisor), "dispatcher-1")

    os.kill(first, signal.SIGKILL)  # the OOM killer, say
    wait_for(lambda: len(started_pids(processes.output(supervisor), "dispatcher-1")) == 2, timeout=15,
             message="the dispatcher to be restarted")
    output = processes.output(supervisor)
    assert f"dispatcher-1 (pid {first}) exited with -9; restarting in 1s" in output
    second = started_pids(output, "dispatcher-1")[1]
    assert second != first
    # Stopped only once it is up again: a SIGTERM during start-up ends it before its handler exists.
    try:
        wait_for(lambda: processes.output(supervisor).count("dispatcher started") >= 2, timeout=30,
                 message="the new dispatcher to start")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{processes.output(supervisor)}") from None

    assert processes.stop(supervisor, signal.SIGTERM, timeout=30) == 0, processes.output(supervisor)
    output = processes.output(supervisor)
    assert f"dispatcher-1 (pid {second}) exited with code 0" in output
    assert re.search(r"worker-1 \(pid \d+\) exited with code 0", output)
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)
    assert not Worker.objects.filter(state="running").exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--worker", " , "], "--worker ' , ': name at least one queue"),
    (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--schedulers", "-1"], "--schedulers must be 0 or more, got -1"),
    (["--web-workers", "0", "--schedulers", "0", "--dispatchers", "0", "--worker", "default", "--concurrency", "0"],
     "--concurrency must be at least 1"),
])
def test_it_rejects_bad_options_before_starting_anything(options, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("deploy_local", *options)
