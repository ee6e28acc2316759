"""The supervisor of manage.py deploy_local and up: restarts a role that dies with back-off, gives a
healthy child its budget back, stops everything only when a child crash-loops (and says why) or
cannot run as configured (at once, without restarting it), reports a child it stopped as stopped,
stops on SIGHUP as on SIGTERM, takes its children with it however it ends (SIGKILL included), and
rejects bad options."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from django.core.management import CommandError, call_command

from orchestrator.models import Worker
from orchestrator.supervisor import ForkedRole, die_with_parent
from tests.conftest import process_env, wait_for


def started_pids(output: str, name: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"\[deploy_local\] started {name} pid (\d+)", output)]


@pytest.mark.slow
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
    assert re.search(rf"dispatcher-1 \(pid {first}\) was killed by SIGKILL after [\d.]+s; restarting in 1s", output)
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
    assert f"dispatcher-1 (pid {second}) exited cleanly (code 0)" in output
    assert re.search(r"worker-1 \(pid \d+\) exited cleanly \(code 0\)", output)
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


def supervise(processes, policy: dict, children: list) -> object:
    spec = {"policy": policy, "children": children, "grace": 5}
    return processes.start_python("-m", "tests.support.supervise_for_tests", json.dumps(spec), name="supervisor",
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_a_child_that_ran_healthily_gets_its_budget_back_and_exits_spread_out_never_stop_everything(processes):
    # Exits every second or so, forever: after each healthy second the back-off starts again from
    # the first delay, and three exits never fall within the 1.5 s window.
    policy = {"first_delay": 0.1, "max_delay": 1.0, "healthy_seconds": 0.5, "crash_loop_exits": 3,
              "crash_loop_window": 1.5}
    supervisor = supervise(processes, policy, [
        ["flaky", python("import time; time.sleep(1.0); raise SystemExit(1)")],
        ["steady", python("import time; time.sleep(300)")],
    ])
    wait_for(lambda: processes.output(supervisor).count("started flaky") >= 6, timeout=60,
             message="the flaky child to be restarted five times")
    output = processes.output(supervisor)
    restarts = re.findall(r"flaky \(pid \d+\) exited with code 1 after [\d.]+s; restarting in ([\d.]+)s", output)
    assert len(restarts) >= 5 and set(restarts) == {"0.1"}, output
    assert "crash-looping" not in output and supervisor.poll() is None
    assert output.count("started steady") == 1  # the healthy child was never touched

    # Stopped by us: a child without a SIGTERM handler ends on that signal, which is no crash.
    assert processes.stop(supervisor, signal.SIGTERM, timeout=30) == 0, processes.output(supervisor)
    output = processes.output(supervisor)
    assert re.search(r"steady \(pid \d+\) stopped by the SIGTERM the supervisor sent", output), output
    assert "exited with code -15" not in output


def test_a_crash_looping_child_stops_everything_with_the_reason_after_backing_off(processes):
    policy = {"first_delay": 0.05, "max_delay": 0.2, "healthy_seconds": 30, "crash_loop_exits": 5,
              "crash_loop_window": 60}
    supervisor = supervise(processes, policy, [
        ["broken", python("raise SystemExit(3)")],
        ["steady", python("import time; time.sleep(300)")],
    ])
    code = supervisor.wait(timeout=60)
    output = processes.output(supervisor)
    assert code == 1, output
    delays = re.findall(r"broken \(pid \d+\) exited with code 3 after [\d.]+s; restarting in ([\d.]+)s", output)
    assert delays == ["0.05", "0.1", "0.2", "0.2"], output  # doubling up to the cap
    assert "broken is crash-looping: it ended 5 times within 60s (last: exited with code 3); stopping everything" \
        in output
    assert re.search(r"steady \(pid \d+\) stopped by the SIGTERM the supervisor sent", output), output


def test_a_killed_child_is_reported_as_killed_by_its_signal(processes):
    policy = {"first_delay": 0.05, "max_delay": 0.2, "healthy_seconds": 30, "crash_loop_exits": 5,
              "crash_loop_window": 60}
    supervisor = supervise(processes, policy, [["victim", python("import time; time.sleep(300)")]])
    wait_for(lambda: re.search(r"started victim pid (\d+)", processes.output(supervisor)), timeout=30,
             message="the child to start")
    pid = int(re.search(r"started victim pid (\d+)", processes.output(supervisor)).group(1))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: processes.output(supervisor).count("started victim") == 2, timeout=30,
             message="the child to be restarted")
    assert re.search(rf"victim \(pid {pid}\) was killed by SIGKILL after [\d.]+s; restarting in 0.05s",
                     processes.output(supervisor))
    assert processes.stop(supervisor, signal.SIGTERM, timeout=30) == 0, processes.output(supervisor)


def test_a_forked_role_runs_its_command_in_its_own_session_and_reports_how_it_ended(tmp_path):
    ended = ForkedRole.start([sys.executable, "manage.py", "shell", "-c", "import sys; sys.exit(3)"], None)
    assert ended.wait(timeout=30) == 3
    output = open(tmp_path / "out.log", "wb")  # noqa: SIM115 - closed below
    sleeping = ForkedRole.start([sys.executable, "manage.py", "shell", "-c",
                                 "import os, time; print(os.getsid(0), flush=True); time.sleep(60)"], output)
    output.close()
    # Named for its role where ps and top show the command, in a session of its own.
    wait_for(lambda: str(sleeping.pid) in (tmp_path / "out.log").read_text(), 30, message="the role to start")
    assert (Path("/proc") / str(sleeping.pid) / "comm").read_text().strip() == "shell"
    assert int((tmp_path / "out.log").read_text().split()[-1]) == sleeping.pid
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(timeout=0.1)
    assert sleeping.poll() is None
    sleeping.send_signal(signal.SIGKILL)
    assert sleeping.wait(timeout=10) == -signal.SIGKILL and sleeping.returncode == -signal.SIGKILL


def test_a_role_that_cannot_run_as_configured_is_not_restarted_into_the_same_error(processes):
    # A bad setting: the scheduler's system checks refuse it, and say so once.
    policy = {"first_delay": 0.05, "max_delay": 0.2, "healthy_seconds": 30, "crash_loop_exits": 5,
              "crash_loop_window": 60}
    spec = {"policy": policy, "grace": 5, "children": [
        ["scheduler", [sys.executable, "manage.py", "scheduler"]],
        ["steady", python("import time; time.sleep(300)")],
    ]}
    supervisor = processes.start_python("-m", "tests.support.supervise_for_tests", json.dumps(spec), name="supervisor",
                                        env=process_env(ORCHESTRATOR_POLL_SECONDS="-1"))
    code = supervisor.wait(timeout=60)
    output = processes.output(supervisor)
    assert code == 78, output
    assert output.count("ORCHESTRATOR_POLL_SECONDS") == 1, output  # the role's reason, once
    assert output.count("started scheduler") == 1 and "restarting in" not in output, output
    assert re.search(r"scheduler \(pid \d+\) cannot run as configured: it exited with code 78 after [\d.]+s \(its "
                     r"reason is above\); not restarting it into the same error: stopping everything", output), output
    assert re.search(r"steady \(pid \d+\) stopped by the SIGTERM the supervisor sent", output), output


def test_a_forked_role_that_cannot_run_as_configured_exits_with_the_configuration_error_code():
    # Any command, Django's own too: a CommandError is a configuration error.
    refused = ForkedRole.start([sys.executable, "manage.py", "runserver", "not-a-port"], None)
    assert refused.wait(timeout=30) == 78


def running(pid: int) -> bool:
    """Whether the process runs (an orphan that ended stays a zombie until init collects it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def printed(output: str, text: str) -> int:
    """How many times the children printed ``text``: not line by line (unbuffered, print writes
    its text and its newline apart, so two children stopped at once can write "draining on
    SIGTERMdraining on SIGTERM\n\n"), and not the quoted text in the supervisor's "started" line."""
    return len(re.findall(rf"(?<!'){re.escape(text)}(?!')", output))


DRAINS = ("import signal, sys, time\n"
          "def stop(*_):\n    print('draining on SIGTERM', flush=True)\n    sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(300)\n")


def supervise_draining_children(processes) -> tuple[object, list[int]]:
    policy = {"first_delay": 0.05, "max_delay": 0.2, "healthy_seconds": 30, "crash_loop_exits": 5,
              "crash_loop_window": 60}
    supervisor = supervise(processes, policy, [["one", python(DRAINS)], ["two", python(DRAINS)]])
    wait_for(lambda: printed(processes.output(supervisor), "ready") == 2, timeout=30, message="the children to start")
    pids = [int(pid) for pid in re.findall(r"started \w+ pid (\d+)", processes.output(supervisor))]
    return supervisor, pids


def test_sighup_stops_the_children_as_sigterm_does(processes):
    supervisor, pids = supervise_draining_children(processes)
    os.kill(supervisor.pid, signal.SIGHUP)  # its terminal closed
    assert supervisor.wait(timeout=30) == 0, processes.output(supervisor)
    output = processes.output(supervisor)
    assert printed(output, "draining on SIGTERM") == 2, output
    assert re.search(r"one \(pid \d+\) exited cleanly \(code 0\)", output), output
    assert not [pid for pid in pids if running(pid)]


def test_the_children_of_a_killed_supervisor_drain_and_end_with_it(processes):
    supervisor, pids = supervise_draining_children(processes)
    os.kill(supervisor.pid, signal.SIGKILL)  # the OOM killer, or a container runtime
    supervisor.wait(timeout=10)
    # Each child is told by the kernel (SIGTERM: the same drain as a stop), not by the supervisor.
    wait_for(lambda: printed(processes.output(supervisor), "draining on SIGTERM") == 2, timeout=10,
             message="both children to hear of their parent's death")
    wait_for(lambda: not [pid for pid in pids if running(pid)], timeout=10, message="both children to end")


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_stops_at_once():
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        # Its parent is not the one it was forked by: the parent died before the request took effect.
        die_with_parent(parent=os.getppid() + 1_000_000)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGTERM
