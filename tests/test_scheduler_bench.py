"""The scheduler benchmark's run() on the test database, small: it must measure real figures."""

import pytest

from orchestrator.bench import scheduler as bench_scheduler
from orchestrator.models import Run, Schedule
from tests.conftest import process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_scheduler_benchmark_measures_the_insert_and_a_failover():
    lines = []
    figures = bench_scheduler.run(lines.append, schedules=300, leases=(2,), env_factory=process_env)
    assert "insert: 300 runs (+300 task runs) for 300 schedules due in the same minute" in lines[0]
    assert "300 schedules advanced" in lines[0]
    assert 0 < figures["insert_seconds"] < 30
    assert "failover: standby leads" in lines[1]
    assert 0 < figures["failover_2s"] <= 2 + 1.5
    # It cleans up after itself.
    assert Run.objects.count() == 0 and Schedule.objects.count() == 0
