"""Every role rides out a database restart: real processes against a PostgreSQL server of the
test's own (stopped, crashed and started again by the test), real signals, and every task
execution counted outside the orchestrator's tables (in a file each task appends to)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.jobs import enqueue
from orchestrator.models import Worker
from tests.conftest import ROOT, alive, process_env, wait_for
from tests.support.pgcluster import OwnCluster

TEMPLATE = "orchestrator_template"
FINISHED = ("succeeded", "failed", "dead", "cancelled", "upstream_failed", "skipped")


@pytest.fixture(scope="module")
def cluster():
    """One server per module, migrated once into a template database; each test copies it."""
    own = OwnCluster()
    try:
        own.create_database(TEMPLATE)
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"], cwd=ROOT,
                       env=process_env(DATABASE_URL=own.url(TEMPLATE)), check=True, timeout=180)
        yield own
    finally:
        own.destroy()


@pytest.fixture
def database(cluster, request):
    name = "t_" + re.sub(r"\W", "", request.node.name)[-40:].lower()
    with cluster.connect("postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
    return name


def query(cluster, dbname, sql, params=()):
    with cluster.connect(dbname, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def enqueue_jobs(env, record: Path, tags: list[str], sleep: float) -> None:
    """Enqueue ``record_job`` jobs through a process of their database (the test's own Django
    connection is the suite's database)."""
    code = ("import json, os\n"
            "from django.db import transaction\n"
            "from orchestrator.jobs import enqueue\n"
            "with transaction.atomic():\n"
            "    for tag in json.loads(os.environ['JOB_TAGS']):\n"
            f"        enqueue('tests.support.tasks_for_tests:record_job', kwargs={{'path': {str(record)!r}, 'sleep': {sleep},"
            " 'tag': tag}, max_attempts=3)\n")
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", code], cwd=ROOT,
                   env={**env, "JOB_TAGS": json.dumps(tags)}, check=True, timeout=120, capture_output=True)


def executions(record: Path) -> Counter:
    """How many times each tag's task started, from the file the tasks append to."""
    if not record.exists():
        return Counter()
    return Counter(json.loads(line)["task"] for line in record.read_text().splitlines()
                   if json.loads(line)["event"] == "start")


def ended(record: Path) -> set[str]:
    if not record.exists():
        return set()
    return {json.loads(line)["task"] for line in record.read_text().splitlines() if json.loads(line)["event"] == "end"}


@pytest.mark.slow
@pytest.mark.own_server
def test_a_worker_rides_out_a_database_restart_and_records_the_outcomes_it_gathered_meanwhile(
        processes, cluster, database, tmp_path):
    env = process_env(DATABASE_URL=cluster.url(database), ORCHESTRATOR_HEARTBEAT_SECONDS="1",
                      ORCHESTRATOR_RECONNECT_MAX_SECONDS="1")
    record = tmp_path / "executions.jsonl"
    worker = processes.start("worker", "--concurrency", "4", env=env)
    processes.start("dispatcher", env=env)
    wait_for(lambda: query(cluster, database, "SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")[0][0],
             timeout=60, message="the worker to register")
    tags = [f"job{i}" for i in range(4)]
    enqueue_jobs(env, record, tags, sleep=2.0)
    wait_for(lambda: len(executions(record)) == 4, timeout=60, message="the four jobs to start")

    # The database goes away while the four tasks run, and stays away until they have all
    # finished: their outcomes exist only in the worker's memory.
    cluster.stop("fast")
    wait_for(lambda: ended(record) == set(tags), timeout=60, message="the tasks to finish during the outage")
    assert worker.poll() is None, processes.output(worker)
    cluster.start()

    def recorded():
        rows = query(cluster, database, "SELECT state, attempts FROM orchestrator_taskrun")
        return len(rows) == 4 and all(row == ("succeeded", 1) for row in rows)

    try:
        wait_for(recorded, timeout=60, message="the outcomes to be recorded after the restart")
    except AssertionError as exc:
        rows = query(cluster, database, "SELECT id, state, attempts FROM orchestrator_taskrun ORDER BY id")
        raise AssertionError(f"{exc}: {rows}\n{processes.output(worker)}") from None
    assert worker.poll() is None, processes.output(worker)  # the same process, never restarted
    assert executions(record) == Counter(dict.fromkeys(tags, 1))  # none ran twice
    assert query(cluster, database, "SELECT count(*), count(*) FILTER (WHERE outcome = 'succeeded')"
                                    " FROM orchestrator_attempt")[0] == (4, 4)
    # Logged once when it began, once when it ended (after the tick whose commit is seen above, so
    # a moment later); no traceback.
    wait_for(lambda: "worker: the database answers again after" in processes.output(worker), timeout=10,
             message="the worker to log that the database answers again")
    output = processes.output(worker)
    assert output.count("worker: database error") == 1, output
    assert "Traceback" not in output, output

    # And it still works: new work is claimed and recorded.
    enqueue_jobs(env, record, ["after"], sleep=0)
    wait_for(lambda: query(cluster, database, "SELECT count(*) FROM orchestrator_taskrun WHERE state = 'succeeded'")
             [0][0] == 5, timeout=60, message="a job enqueued after the restart to run")


@pytest.mark.django_db(transaction=True)
def test_a_draining_worker_exits_as_soon_as_its_last_task_ends(processes, tmp_path):
    # A heartbeat every 30 s: a worker that left only at its next heartbeat would take that long.
    env = process_env(ORCHESTRATOR_HEARTBEAT_SECONDS="30")
    record = tmp_path / "executions.jsonl"
    worker = processes.start("worker", "--concurrency", "2", "--grace", "60", env=env)
    processes.start("dispatcher", env=env)
    wait_for(lambda: Worker.objects.filter(pid=worker.pid, state="running").exists(), timeout=60,
             message="the worker to register")
    enqueue("tests.support.tasks_for_tests:record_job", kwargs={"path": str(record), "sleep": 1.5, "tag": "last"})
    wait_for(lambda: executions(record), timeout=60, message="the task to start")
    os.kill(worker.pid, signal.SIGTERM)
    wait_for(lambda: worker.poll() is not None, timeout=60, interval=0.02, message="the worker to exit")
    exited = time.time()
    task_end = next(json.loads(line)["at"] for line in record.read_text().splitlines() if '"end"' in line)
    assert worker.returncode == 0, processes.output(worker)
    assert exited - task_end < 5.0, f"exited {exited - task_end:.1f}s after its last task ended"


def started(output: str, child: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"started {child} pid (\d+)", output)]


def add_schedules(env) -> None:
    """Two schedules firing every 2 s, on the maintenance workflow: catchup=all (every fire time
    runs) and catchup=latest (fire times missed in an outage are recorded as skipped)."""
    code = ("from orchestrator import cron, clock\n"
            "from orchestrator.models import Schedule, Workflow\n"
            "from orchestrator.sync import sync_workflows\n"
            "sync_workflows()\n"
            "wf = Workflow.objects.get(name='maintenance')\n"
            "for name, catchup in (('every-2s-all', 'all'), ('every-2s-latest', 'latest')):\n"
            "    Schedule.objects.create(workflow=wf, name=name, source='admin', cron='*/2 * * * * *', timezone='UTC',\n"
            "        catchup=catchup, overlap='allow', next_fire_at=cron.next_fire_time('*/2 * * * * *', 'UTC',"
            " clock.now()))\n")
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", code], cwd=ROOT, env=env, check=True,
                   timeout=120, capture_output=True)


@pytest.mark.slow
@pytest.mark.own_server
def test_every_role_rides_out_a_database_crash_and_sigkills_under_load_and_no_job_is_lost(
        processes, cluster, database, tmp_path):
    env = process_env(DATABASE_URL=cluster.url(database), ORCHESTRATOR_HEARTBEAT_SECONDS="1",
                      ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS="6", ORCHESTRATOR_LEASE_SECONDS="4",
                      ORCHESTRATOR_RECONNECT_MAX_SECONDS="1")
    record = tmp_path / "executions.jsonl"
    add_schedules(env)
    supervisor = processes.start("deploy_local", "--web-workers", "0", "--schedulers", "2", "--dispatchers", "2",
                                 "--worker", "default", "--worker", "default", "--concurrency", "4", "--grace", "5",
                                 env=env)
    q = lambda sql, params=(): query(cluster, database, sql, params)  # noqa: E731

    def up():
        assert supervisor.poll() is None, processes.output(supervisor)
        workers = q("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")[0][0]
        leader = q("SELECT count(*) FROM orchestrator_lease WHERE expires_at > now()")[0][0]
        return workers == 2 and leader == 1

    wait_for(up, timeout=90, message="two workers and a scheduler leader")
    window_start = q("SELECT now()")[0][0]
    first, second = [f"a{i}" for i in range(120)], [f"b{i}" for i in range(60)]
    enqueue_jobs(env, record, first, sleep=0.4)
    wait_for(lambda: len(executions(record)) >= 16, timeout=60, message="the first jobs to run")

    # A crash of the database (immediate: no clean shutdown, recovery at the start) under load;
    # ORCHESTRATOR_FAULT_RESTART=fast (a clean restart) or outage:SECONDS (down that long) for
    # the other measurements of the README.
    mode, _, seconds = os.environ.get("ORCHESTRATOR_FAULT_RESTART", "immediate").partition(":")
    outage_began = time.monotonic()
    cluster.stop("fast" if mode == "outage" else mode)
    if mode == "outage":
        time.sleep(float(seconds))  # holding the server down is the fault itself, not a clock
    cluster.start()
    restarted = time.monotonic()
    restarted_at = time.time()  # the tasks' own records say when they started, in wall time

    back = q("SELECT now()")[0][0]

    def working_again():
        """Every role did its work since the database came back: both workers sent a heartbeat
        and recorded an outcome, the leader fired a schedule, a dispatcher queued its tasks."""
        workers = q("SELECT count(*) FROM orchestrator_worker WHERE state = 'running' AND heartbeat_at > %s",
                    [back])[0][0]
        recording = q("SELECT count(DISTINCT worker_id) FROM orchestrator_attempt WHERE finished_at > %s",
                      [back])[0][0]
        fired = q("SELECT count(*) FROM orchestrator_run WHERE trigger = 'schedule' AND created_at > %s", [back])[0][0]
        queued = q("SELECT count(*) FROM orchestrator_taskrun WHERE queued_at > %s", [back])[0][0]
        return workers == 2 and recording == 2 and fired and queued

    wait_for(working_again, timeout=60, interval=0.1, message="every role to work again after the restart")
    recovered = time.monotonic() - restarted
    enqueue_jobs(env, record, ["probe"], sleep=0)

    # Then the processes die one by one, as the OOM killer would have them.
    output = processes.output(supervisor)
    leader_pid = int(q("SELECT split_part(holder, ':', 2) FROM orchestrator_lease")[0][0])
    victims = {"worker-1": started(output, "worker-1")[-1], "dispatcher-1": started(output, "dispatcher-1")[-1],
               "leader": leader_pid}
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    enqueue_jobs(env, record, second, sleep=0.2)

    tags = [*first, "probe", *second]

    def all_done():
        assert supervisor.poll() is None, processes.output(supervisor)
        rows = q("SELECT t.state, count(*) FROM orchestrator_taskrun t JOIN orchestrator_run r ON r.id = t.run_id"
                 " WHERE r.trigger = 'job' GROUP BY 1")
        return sum(n for _, n in rows) == len(tags) and all(state in FINISHED for state, _ in rows)

    wait_for(all_done, timeout=120, interval=0.25, message="every job to end")
    window_end = q("SELECT now()")[0][0]

    # No job lost: each one succeeded and ran at least once; some ran twice (at least once).
    states = dict(q("SELECT t.state, count(*) FROM orchestrator_taskrun t JOIN orchestrator_run r ON r.id = t.run_id"
                    " WHERE r.trigger = 'job' GROUP BY 1"))
    assert states == {"succeeded": len(tags)}, states
    runs = executions(record)
    assert set(runs) == set(tags)
    # Run twice: those the killed worker was running (the reaper gives them another attempt), and
    # those claimed in the commits the crash lost (claims are written without waiting for the WAL
    # flush), which another worker then claimed again. Bounded by what the workers had in hand.
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    # A task the killed worker started before the crash and never ended was stopped around the crash
    # (its attempt reaped once the outage outlasted the heartbeat timeout): it counts with the crash's.
    on_killed = ({line["task"] for line in lines if line["ppid"] == victims["worker-1"] and line["event"] == "start"
                  and line["at"] >= restarted_at}
                 - {line["task"] for line in lines if line["ppid"] == victims["worker-1"] and line["event"] == "end"})
    twice = {tag: n for tag, n in runs.items() if n > 1}
    twice_killed = sum(n - 1 for tag, n in twice.items() if tag in on_killed)
    twice_crash = sum(n - 1 for tag, n in twice.items() if tag not in on_killed)
    # At most what the workers had in hand: four slots on the killed one; around the crash, the
    # claims of two workers' four slots in the commits it lost (the server flushes them within
    # wal_writer_delay, 200 ms): two rounds of claims at most for tasks that take 0.4 s.
    assert twice_killed <= 4 and twice_crash <= 2 * 4 * 2, (twice, on_killed)

    # Every process is alive or was restarted: the killed ones once, the others never.
    output = processes.output(supervisor)
    for child in ("scheduler-1", "scheduler-2", "dispatcher-1", "dispatcher-2", "worker-1", "worker-2"):
        pids = started(output, child)
        assert alive(pids[-1]), f"{child} is not running\n{output}"
        killed = child in victims or pids[0] == leader_pid
        assert len(pids) == (2 if killed else 1), f"{child} started {len(pids)} times\n{output}"
    assert "crash-looping" not in output

    # Every fire time of the window is a run, or (catchup=latest, across the outage) a skipped run
    # with the reason; none twice (the unique constraint) and none missing.
    fires = {name: q("SELECT r.logical_date, r.state, r.reason FROM orchestrator_run r JOIN orchestrator_schedule s"
                     " ON s.id = r.schedule_id WHERE s.name = %s AND r.logical_date BETWEEN %s AND %s"
                     " ORDER BY 1", [name, window_start, window_end])
             for name in ("every-2s-all", "every-2s-latest")}
    expected = (window_end - window_start).total_seconds() // 2 - 1
    for name, rows in fires.items():
        times = [row[0] for row in rows]
        gaps = [(a, b) for a, b in zip(times, times[1:], strict=False) if (b - a).total_seconds() != 2]
        assert not gaps and len(rows) >= expected, (name, gaps, len(rows), expected)
        assert all(reason for _, state, reason in rows if state in ("skipped", "missed"))
    assert not [row for row in fires["every-2s-all"] if row[1] in ("skipped", "missed")]
    print(f"\n  database {mode} restart: down {restarted - outage_began:.1f}s; every role working again "
          f"{recovered:.1f}s after it was back; of {len(tags)} jobs, {twice_crash} ran twice because of the "
          f"restart and {twice_killed} because a worker was killed; "
          f"{sum(1 for r in fires['every-2s-latest'] if r[1] == 'skipped')} fire times recorded as skipped")
