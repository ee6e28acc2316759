"""Real scheduler processes against the test database: two that both act as leader create each
fire time once, a SIGKILLed leader is replaced within the lease time without losing or doubling a
fire time, and a clean shutdown hands the lease over at once."""

import re
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.models import Lease, Run, Schedule
from tests.conftest import process_env, wait_for
from tests.test_scheduler import make_schedule, make_workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EVERY_SECOND = "* * * * * *"


def every_second_schedules(count):
    workflow = make_workflow("ticker")
    now = timezone.now()
    return {make_schedule(workflow, EVERY_SECOND, now=now, name=f"s{i}", catchup="all").pk: None
            for i in range(count)}


def assert_one_run_per_fire_time_without_gaps(schedule_ids, initial_next_fire_at, minimum):
    """Every schedule has exactly one run for each second from its first fire time up to the last
    one it reached: none lost, none doubled."""
    for schedule in Schedule.objects.filter(pk__in=schedule_ids):
        dates = list(Run.objects.filter(schedule=schedule).order_by("logical_date").values_list("logical_date", flat=True))
        assert len(dates) >= minimum, f"{schedule.name}: only {len(dates)} runs"
        first = initial_next_fire_at[schedule.pk]
        expected = [first + timedelta(seconds=i) for i in range(len(dates))]
        assert dates == expected, f"{schedule.name}: gaps or duplicates in {dates}"
        assert dates[-1] == schedule.last_fire_at


def created_count(output):
    return int(re.search(r"stopped: created (\d+) runs", output).group(1))


def leader_pid():
    lease = Lease.objects.filter(name="scheduler").first()
    if lease is None or lease.expires_at <= timezone.now():
        return None
    return int(lease.holder.split(":")[1])


def test_two_schedulers_that_both_act_as_leader_create_exactly_one_run_per_fire_time(processes):
    ids = every_second_schedules(30)
    initial = dict(Schedule.objects.filter(pk__in=ids).values_list("pk", "next_fire_at"))
    # Small batches so the two processes interleave on the same schedules within each second.
    env = process_env(LOG_LEVEL="INFO")  # the tests read the schedulers' log lines
    first = processes.start("scheduler", "--no-lease", "--batch-size", "7", env=env, name="scheduler-a")
    second = processes.start("scheduler", "--no-lease", "--batch-size", "7", env=env, name="scheduler-b")
    # Nine seconds of runs once both are up (one may take seconds longer to start on a busy machine).
    wait_for(lambda: all(" started (lease" in processes.output(p) for p in (first, second)), timeout=60,
             message="both schedulers up")
    both_up = Run.objects.count()
    wait_for(lambda: Run.objects.count() >= both_up + 30 * 9, timeout=40, message="nine seconds of runs")
    assert processes.stop(first) == 0
    assert processes.stop(second) == 0

    assert_one_run_per_fire_time_without_gaps(ids, initial, minimum=9)
    counts = [created_count(processes.output(p)) for p in (first, second)]
    # Both really inserted, and what they report adds up to the runs that exist: no insert was
    # counted twice (the loser of a race inserts nothing).
    assert all(count > 0 for count in counts), counts
    assert sum(counts) == Run.objects.count()


def test_a_standby_takes_over_within_the_lease_time_after_the_leader_is_killed(processes):
    lease_seconds = 3
    env = process_env(ORCHESTRATOR_LEASE_SECONDS=lease_seconds, LOG_LEVEL="INFO")
    ids = every_second_schedules(10)
    initial = dict(Schedule.objects.filter(pk__in=ids).values_list("pk", "next_fire_at"))
    leader = processes.start("scheduler", env=env, name="scheduler-leader")
    wait_for(lambda: leader_pid() == leader.pid, timeout=20, message="the first scheduler to lead")
    standby = processes.start("scheduler", env=env, name="scheduler-standby")
    wait_for(lambda: "standby" in processes.output(standby), timeout=20, message="the second to stand by")
    wait_for(lambda: Run.objects.count() >= 30, timeout=20, message="some runs")

    processes.stop(leader, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: leader_pid() == standby.pid, timeout=lease_seconds + 5, interval=0.02,
             message="the standby to take the lease")
    takeover = time.monotonic() - killed_at
    print(f"takeover after SIGKILL: {takeover:.2f}s (lease {lease_seconds}s)")
    # The lease lapses at most lease_seconds after the last renewal; the standby retries every second.
    assert takeover <= lease_seconds + 1.5

    reached = timezone.now() + timedelta(seconds=2)
    wait_for(lambda: Schedule.objects.filter(pk__in=ids, last_fire_at__gte=reached).count() == len(ids),
             timeout=20, message="the new leader to catch up")
    assert processes.stop(standby) == 0
    assert_one_run_per_fire_time_without_gaps(ids, initial, minimum=5)
    assert Lease.objects.get().epoch == 2


def test_a_clean_shutdown_releases_the_lease_so_a_standby_takes_over_at_once(processes):
    env = process_env(ORCHESTRATOR_LEASE_SECONDS=15, LOG_LEVEL="INFO")
    first = processes.start("scheduler", env=env, name="scheduler-first")
    wait_for(lambda: leader_pid() == first.pid, timeout=20, message="the first scheduler to lead")
    second = processes.start("scheduler", env=env, name="scheduler-second")
    wait_for(lambda: "standby" in processes.output(second), timeout=20, message="the second to stand by")

    stopped_at = time.monotonic()
    assert processes.stop(first, signal.SIGTERM) == 0
    wait_for(lambda: leader_pid() == second.pid, timeout=10, message="the standby to take the lease")
    # Far sooner than the 15 s lease: the lease was released, not left to expire.
    assert time.monotonic() - stopped_at < 5
    assert "released the scheduler lease" in processes.output(first)
