"""The io benchmark's run() on the test database, small: it must measure real figures."""

import pytest

from orchestrator.bench import iobound
from orchestrator.models import Run
from tests.conftest import process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_io_benchmark_runs_every_job_of_each_executor_on_one_worker_process():
    lines = []
    figures = iobound.run(lines.append, n=60, forked=12, env_factory=process_env)
    assert [kind for kind in figures] == ["process", "async", "thread"]
    assert {kind: m["done"] for kind, m in figures.items()} == {"process": 12, "async": 60, "thread": 60}
    assert all(m["running"] > 0 and m["worker_cpu"] >= 0 for m in figures.values())
    assert "32 forked children (the default): 12 jobs" in lines[0]
    assert "async, 500 places on one event loop: 60 jobs" in lines[1] and "x the forked default" in lines[1]
    assert "thread, 200 threads: 60 jobs" in lines[2] and "only" not in "".join(lines)
    assert Run.objects.filter(state="succeeded").count() == 60  # the last executor's, left for a look
