"""Secrets on real workers: a workflow task in a forked child, and jobs on the thread and async
executors, each printing, logging, raising and returning a secret: what is stored is masked."""

from __future__ import annotations

import pytest
from django.test.utils import override_settings

from orchestrator import logs, secretstore
from orchestrator.jobs import enqueue
from orchestrator.models import Attempt, AuditEvent, Run, TaskRun, Worker, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support import secret_tasks
from tests.test_secrets import KEY, STRIPE, WAREHOUSE, leaks

REF = "tests.support.secret_tasks"


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):
        yield tmp_path / "data"


def start_worker(processes, data_dir, *, inprocess: int = 0):
    env = process_env(ORCHESTRATOR_DATA_DIR=str(data_dir), ORCHESTRATOR_SECRETS_KEYS=KEY,
                      ORCHESTRATOR_POLL_SECONDS="0.5", ORCHESTRATOR_JOB_MODULES=f"workflows.jobs,{REF}")
    worker = processes.start("worker", "--queues", "default", "--concurrency", "2", "--inprocess", str(inprocess),
                             env=env)
    wait_for(lambda: Worker.objects.filter(pid=worker.pid, state="running").exists(), 20, message="the worker")
    if inprocess:
        wait_for(lambda: "in-process executor ready" in processes.output(worker), 20, message="the host")
    return worker


def finished(run: Run) -> Run:
    wait_for(lambda: Run.objects.values_list("state", flat=True).get(pk=run.pk) not in ("pending", "running"), 60,
             message=f"run {run.pk} to finish")
    return Run.objects.get(pk=run.pk)


def stored_text(attempt: Attempt) -> str:
    """Everything stored of an attempt: its error, traceback, log and its task run's result."""
    text, _, _ = logs.read(attempt)
    return "\n".join([attempt.error, attempt.traceback, text, str(attempt.task_run.result)])


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_forked_child_masks_what_a_workflow_task_leaks(processes, data_dir):
    secretstore.put("secret", "stripe", {"value": STRIPE})
    secretstore.put("connection", "warehouse", {"url": WAREHOUSE})
    start_worker(processes, data_dir)
    workflow = Workflow.objects.create(name="secret-probe")
    spec = secret_tasks.probe.to_spec()
    tasks = {name: {**task, "upstream": [], "retries": 0, "max_attempts": 1} for name, task in spec["tasks"].items()}
    version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="secret-probe", spec={"tasks": tasks})
    run, _ = create_run(workflow, trigger="manual", tasks=tasks, version=version, params={"fail": True})
    finished(run)

    leak = Attempt.objects.get(task_run__run=run, task_run__task="leak")
    assert leak.error == "ValueError: the API refused key *** at ***"
    text = stored_text(leak)
    assert leaks(text) == [] and "the key is ***" in text and "logged: ***" in text and "in pieces: ***" in text
    shell = Attempt.objects.get(task_run__run=run, task_run__task="shell_leak")
    assert shell.outcome == "succeeded", shell.error
    assert "shell sees ***" in stored_text(shell) and leaks(stored_text(shell)) == []
    sneak = TaskRun.objects.get(run=run, task="sneak")
    assert sneak.state == "dead" and "reads the secret 'payroll', which it does not declare" in sneak.error
    reads = AuditEvent.objects.filter(action="secret_read", detail__run=run.pk)
    assert {(event.detail["task"], event.target_id) for event in reads} == {
        ("leak", "secret:stripe"), ("leak", "connection:warehouse"),
        ("shell_leak", "secret:stripe"), ("shell_leak", "connection:warehouse")}
    output = "".join(processes.output(proc) for proc in processes.started)
    assert leaks(output) == [], "the worker's own console shows no value either"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_jobs_in_every_executor_are_masked_and_an_undeclaring_job_is_refused(processes, data_dir):
    secretstore.put("secret", "stripe", {"value": STRIPE})
    start_worker(processes, data_dir, inprocess=4)
    runs = {name: enqueue(f"{REF}:{name}", max_attempts=1)[0]
            for name in ("process_leak", "thread_leak", "async_leak", "async_sneak")}
    for run in runs.values():
        finished(run)
    for name in ("process_leak", "thread_leak", "async_leak"):
        attempt = Attempt.objects.get(task_run__run=runs[name])
        executor = name.split("_")[0]
        assert attempt.error == f"ValueError: {executor} job refused ***", attempt.error
        text = stored_text(attempt)
        assert leaks(text) == [], (name, text)
        assert "the key is ***" in text and "logged: ***" in text and "RuntimeError: inner ***" in text, (name, text)
    sneak = Attempt.objects.get(task_run__run=runs["async_sneak"])
    assert sneak.error.startswith(f"SecretNotDeclared: job '{REF}:async_sneak' reads the secret 'stripe', "
                                  "which it does not declare")
    assert AuditEvent.objects.filter(action="secret_read").count() == 3
    output = "".join(processes.output(proc) for proc in processes.started)
    assert leaks(output) == []
