"""The production set of processes, end to end: ``manage.py deploy_local`` starts gunicorn with two
workers, two schedulers, two dispatchers and three workers on two queues as separate OS
processes against one PostgreSQL. A fast schedule fires while a burst of jobs runs; every job must
run exactly once, every fire time must get exactly one run, and SIGTERM must stop everything
cleanly.

Run with ``-s`` to see the wall time and the throughput.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import cron
from orchestrator.jobs import enqueue
from orchestrator.models import Attempt, Lease, Run, Schedule, TaskRun, Worker, Workflow
from orchestrator.runs import trigger_workflow
from orchestrator.sync import sync_workflows
from tests.conftest import ROOT, process_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DEFAULT_JOBS = 2000
BATCH_JOBS = 1000
EVERY_TWO_SECONDS = "*/2 * * * * *"
FINISHED = ("succeeded", "failed", "dead", "upstream_failed", "skipped", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, **headers) -> tuple[int, bytes, dict]:
    request = urllib.request.Request(url, headers={"Host": "127.0.0.1", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def production_env(tmp_path) -> dict:
    static_root = tmp_path / "static"
    env = process_env(
        DEBUG="0", ALLOWED_HOSTS="127.0.0.1", SECURE_COOKIES="0", LOG_FORMAT="json",
        STATIC_ROOT=static_root, ORCHESTRATOR_DATA_DIR=tmp_path / "data",
    )
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v", "0"],
                   env=env, cwd=ROOT, check=True, timeout=120)
    return env


def test_the_production_process_set_runs_every_job_and_fire_time_exactly_once(processes, tmp_path):
    env = production_env(tmp_path)
    report = sync_workflows()
    assert not report.broken, report.broken
    maintenance = Workflow.objects.get(name="maintenance")
    window_start = timezone.now()
    fast = Schedule.objects.create(
        workflow=maintenance, name="every-2s", source=Schedule.Source.ADMIN, cron=EVERY_TWO_SECONDS,
        timezone="UTC", catchup=Schedule.Catchup.ALL, overlap=Schedule.Overlap.ALLOW,
        next_fire_at=cron.next_fire_time(EVERY_TWO_SECONDS, "UTC", window_start),
    )

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    role_logs = tmp_path / "roles"
    started = time.monotonic()
    supervisor = processes.start(
        "deploy_local", "--bind", f"127.0.0.1:{port}", "--web-workers", "2", "--schedulers", "2",
        "--dispatchers", "2", "--worker", "default", "--worker", "default,batch", "--worker", "batch",
        "--concurrency", "8", "--grace", "10", "--log-dir", str(role_logs), env=env,
    )

    def ready():
        assert supervisor.poll() is None, processes.output(supervisor)
        live = Worker.objects.filter(state="running").count()
        lease = Lease.objects.filter(name="scheduler", expires_at__gt=timezone.now()).exists()
        try:
            web = get(f"{base}/healthz")[0] == 200
        except OSError:
            web = False
        return live == 3 and lease and web

    wait_for(ready, timeout=60, interval=0.25, message="gunicorn, a scheduler lease and three workers")
    print(f"\n  all processes up in {time.monotonic() - started:.1f}s")

    # Readiness and metrics through gunicorn, while everything runs.
    status, body, _ = get(f"{base}/readyz")
    assert status == 200, body
    assert all(check["ok"] for check in json.loads(body)["checks"].values())
    status, body, _ = get(f"{base}/metrics")
    assert status == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
               if not s.labels}
    assert samples["orchestrator_workers_live"] == 3
    assert samples["orchestrator_scheduler_leader_present"] == 1
    # A page and a fingerprinted static file, served by gunicorn and whitenoise with DEBUG off.
    status, page, _ = get(f"{base}/admin/login/")
    assert status == 200
    css = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page).group(1).decode()
    status, _, headers = get(base + css)
    assert status == 200 and "max-age=315360000" in headers["Cache-Control"]

    # The container health checks of docker/compose.yaml pass against these processes too.
    for role in ("web", "scheduler", "dispatcher", "worker"):
        check = subprocess.run([sys.executable, str(ROOT / "docker" / "healthcheck.py"), role],
                               env={**env, "PORT": str(port)}, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, (role, check.stdout)

    # An example workflow, triggered by hand, next to the burst.
    etl_run, _ = trigger_workflow(Workflow.objects.get(name="nightly_etl"), {}, trigger="manual")

    enqueue_started = time.monotonic()
    # One transaction: the workers see the whole burst at once, at the commit.
    with transaction.atomic():
        for i in range(DEFAULT_JOBS + BATCH_JOBS):
            enqueue("workflows.jobs:noop", queue="default" if i < DEFAULT_JOBS else "batch")
    burst_started = time.monotonic()
    print(f"  enqueued {DEFAULT_JOBS + BATCH_JOBS} jobs in {burst_started - enqueue_started:.1f}s")
    jobs = TaskRun.objects.filter(run__trigger="job")

    def burst_done():
        assert supervisor.poll() is None, processes.output(supervisor)
        return not jobs.exclude(state__in=FINISHED).exists()

    wait_for(burst_done, timeout=120, interval=0.25, message="every job of the burst to finish")
    burst_seconds = time.monotonic() - burst_started
    total = DEFAULT_JOBS + BATCH_JOBS
    print(f"  burst: {total} jobs in {burst_seconds:.1f}s = {total / burst_seconds:.0f} jobs/s "
          f"(3 workers x 8, 2 dispatchers, while a schedule fired every 2 s)")

    # Every job ran exactly once: one attempt, succeeded, none lost or retried.
    assert jobs.count() == total
    assert dict(jobs.values_list("state").annotate(n=Count("id"))) == {"succeeded": total}
    assert not jobs.exclude(attempts=1).exists()
    attempts = Attempt.objects.filter(task_run__run__trigger="job")
    assert attempts.count() == total
    assert not attempts.values("task_run").annotate(
        n=Count("id"), ok=Count("id", filter=Q(outcome="succeeded"))
    ).exclude(n=1, ok=1).exists()
    assert not Run.objects.filter(trigger="job").exclude(state="succeeded").exists()
    # All three workers took part, and the batch-only worker ran only batch jobs.
    by_worker = dict(attempts.values_list("worker__name").annotate(n=Count("id")))
    assert len(by_worker) == 3, by_worker
    batch_only = Worker.objects.get(queues=["batch"])
    assert not attempts.filter(worker=batch_only).exclude(task_run__queue="batch").exists()

    # Every fire time of the window got exactly one run: no gap, no duplicate. The window spans
    # at least 12 s (six fire times) however fast the burst went.
    wait_for(lambda: timezone.now() >= window_start + timedelta(seconds=15), timeout=20, interval=0.2,
             message="the window to span six fire times")
    window_end = timezone.now() - timedelta(seconds=3)
    wait_for(lambda: Schedule.objects.get(pk=fast.pk).next_fire_at > window_end, timeout=30,
             message="the scheduler to pass the end of the window")
    for schedule in Schedule.objects.all():
        expected = list(cron.fire_times(schedule.cron, schedule.timezone, window_start, until=window_end))
        fired = list(Run.objects.filter(schedule=schedule, logical_date__gt=window_start,
                                        logical_date__lte=window_end)
                     .order_by("logical_date").values_list("logical_date", flat=True))
        assert fired == expected, f"{schedule}: fired {len(fired)} of {len(expected)} fire times"
    fire_times = Run.objects.filter(schedule=fast, logical_date__lte=window_end).count()
    assert fire_times >= 6, "the window should hold several fire times"

    # The scheduled runs and the example workflow run to completion too.
    scheduled = Run.objects.filter(Q(schedule=fast, logical_date__lte=window_end) | Q(pk=etl_run.pk))
    wait_for(lambda: not scheduled.filter(state__in=["pending", "running"]).exists(), timeout=60,
             message="the scheduled and triggered runs to finish")
    failures = list(TaskRun.objects.filter(run__in=scheduled).exclude(state="succeeded")
                    .values_list("run__workflow__name", "task", "state", "error"))
    assert dict(scheduled.values_list("state").annotate(n=Count("id"))) == {"succeeded": fire_times + 1}, failures

    # Structured logs from every role: one JSON object per line.
    for log in role_logs.glob("*.log"):
        if log.name.startswith("web"):
            continue  # gunicorn's own access and error logs are plain text
        for line in log.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                assert {"time", "level", "logger", "message"} <= set(record), (log.name, line)

    # One scheduler led the whole time, the other stood by: one acquisition, epoch 1.
    roles = [json.loads(line)["message"].rsplit(": ", 1)[1]
             for name in ("scheduler-1", "scheduler-2")
             for line in (role_logs / f"{name}.log").read_text().splitlines()
             if '"action": "scheduler_role"' in line]
    assert sorted(roles) == ["leader", "standby"], roles
    assert Lease.objects.get(name="scheduler").epoch == 1

    # SIGTERM to the supervisor: it passes SIGTERM to each process and reports how each ended.
    stop_started = time.monotonic()
    code = processes.stop(supervisor, signal.SIGTERM, timeout=60)
    stop_seconds = time.monotonic() - stop_started
    output = processes.output(supervisor)
    assert code == 0, output
    ended = re.findall(r"\[deploy_local\] (\S+) \(pid (\d+)\) exited cleanly \(code (-?\d+)\)", output)
    names = ["web", "scheduler-1", "scheduler-2", "dispatcher-1", "dispatcher-2", "worker-1", "worker-2", "worker-3"]
    assert [name for name, _, _ in ended] == names, output
    assert all(code == "0" for _, _, code in ended), output
    assert "restarting" not in output, output
    for _, pid, _ in ended:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    assert stop_seconds < 30
    assert not Worker.objects.filter(state__in=["running", "draining"]).exists()
    print(f"  clean stop of 8 processes (and gunicorn's 2 workers) in {stop_seconds:.1f}s; "
          f"whole test {time.monotonic() - started:.1f}s")
