# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Only registered functions run as jobs: an operator naming any importable function through the
API is refused with a 400 that names it, nothing is imported or run, and a worker refuses a task
run naming unregistered code however its row was written."""

from __future__ import annotations

import os
import sys
import time
import uuid

import pytest
from django.contrib.auth.models import User

from orchestrator import dispatcher, executor, registry
from orchestrator.jobs import JobError, enqueue, job
from orchestrator.models import Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support import tasks_for_tests
from tests.support.api_support import (  # noqa: F401 - fixtures
    api,
    operator,
    stored,
    workflow,
)

pytestmark = pytest.mark.django_db


def attacks(marker) -> list[dict]:
    """What an attacker with an Operator token tried: each would run code of their choosing."""
    return [
        {"ref": "os:system", "args": [f"id > {marker}"]},
        {"ref": "subprocess:run", "args": [["touch", str(marker)]]},
        {"ref": "builtins:exec", "args": [f"open({str(marker)!r}, 'w').write('x')"]},
        {"ref": "builtins:eval", "args": ["__import__('django.conf').conf.settings.SECRET_KEY"]},
        {"ref": "shutil:copy", "args": [".data/admin-password.txt", str(marker)]},
        {"ref": "django.contrib.auth.models:User.objects.create_superuser",
         "args": ["mallory", "m@example.com", "pw"]},
        {"ref": "this:s"},
    ]


@pytest.mark.parametrize("index", range(7))
def test_an_operator_cannot_enqueue_an_importable_function_that_was_not_registered(api, tmp_path, index):
    marker = tmp_path / "ran"
    attack = attacks(marker)[index]
    sys.modules.pop("this", None)
    before = stored()
    response = api.post("/api/jobs/", attack, format="json")
    assert response.status_code == 400, response.json()
    # The answer names the reference and says why it is refused.
    assert f"unknown job {attack['ref']!r}" in response.json()["ref"][0]
    assert stored() == before and not Run.objects.exists()
    assert not marker.exists() and not User.objects.filter(username="mallory").exists()
    assert "this" not in sys.modules  # the web process imported nothing because of the request


def test_a_module_that_sleeps_at_import_is_neither_imported_nor_waited_for(api, tmp_path, monkeypatch):
    name = f"sleepy_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('yes')\ntime.sleep(30)\n"
        "def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.monotonic()
    response = api.post("/api/jobs/", {"ref": f"{name}:f"}, format="json")
    assert response.status_code == 400 and f"unknown job '{name}:f'" in response.json()["detail"]
    assert time.monotonic() - started < 5
    assert name not in sys.modules and not marker.exists()


def test_registered_jobs_django_tasks_and_workflow_tasks_can_be_enqueued_by_name(api, workflow):
    for ref in ["workflows.jobs:send_welcome_email", "tests.support.tasks_for_tests:add",
                f"{workflow.current_version.spec['tasks']['extract']['ref']}"]:
        response = api.post("/api/jobs/", {"ref": ref}, format="json")
        assert response.status_code == 201, (ref, response.json())
        assert response.json()["ref"] == ref


def test_python_enqueue_takes_a_registered_function_and_refuses_any_other():
    run, created = enqueue(tasks_for_tests.add, args=[1, 2])
    assert created and run.task_runs.get().spec["ref"] == "tests.support.tasks_for_tests:add"
    with pytest.raises(JobError, match="os:system"):
        enqueue("os:system", args=["true"])
    with pytest.raises(JobError, match="not a registered job: decorate it with @job") as caught:
        enqueue(os.system, args=["true"])
    assert caught.value.field == "ref"

    def local():
        return 1

    with pytest.raises(JobError, match="not a registered job"):
        enqueue(local)
    assert Run.objects.count() == 1


def test_the_job_decorator_registers_the_function_and_returns_it_unchanged():
    def greet(name):
        return f"hi {name}"

    decorated = job(greet)
    assert decorated is greet and decorated("ada") == "hi ada"
    assert registry.get(registry.ref_of(greet)) is greet
    with pytest.raises(TypeError):
        job(42)


# --- the worker: defence in depth -------------------------------------------------------------------


def forged_message(spec: dict, task: str = "t", version=None) -> dict:
    """A task run written straight into the table (not through enqueue), claimed as a worker does."""
    run, _ = create_run(None, trigger="job", tasks={task: spec}, version=version)
    task_run = TaskRun.objects.get(run=run)
    return {"id": task_run.pk, "run_id": run.pk, "task": task, "number": 1, "spec": spec, "timeout": None,
            "has_parents": False, "params": {}, "logical_date": run.logical_date, "upstream": {}, "workflow": ""}


@pytest.mark.parametrize("ref, args", [
    ("os:system", ["touch {marker}"]),
    ("subprocess:run", [["touch", "{marker}"]]),
    ("builtins:exec", ["open('{marker}', 'w').write('x')"]),
    ("this:s", []),
])
def test_a_worker_refuses_a_row_naming_an_unregistered_function(tmp_path, ref, args):
    marker = tmp_path / "ran"
    sys.modules.pop("this", None)
    spec = {"kind": "python", "ref": ref, "call": "job", "kwargs": {},
            "args": [a.format(marker=marker) if isinstance(a, str) else [x.format(marker=marker) for x in a]
                     for a in args]}
    _, _, outcome, _, error, *_ = executor.run(forged_message(spec))
    assert outcome == "failed" and error.startswith(f"refused: unknown job {ref!r}")
    assert not marker.exists() and "this" not in sys.modules


def test_a_worker_refuses_a_shell_command_no_workflow_declares(tmp_path):
    marker = tmp_path / "ran"
    spec = {"kind": "shell", "command": f"touch {marker}", "env": {}}
    _, _, outcome, _, error, *_ = executor.run(forged_message(spec))
    assert outcome == "failed" and "is not one its workflow declares" in error and not marker.exists()

    # Declared by the run's graph version (as sync stores it), the same command runs; a changed
    # environment is a different command.
    wf = Workflow.objects.create(name="declared")
    version = WorkflowVersion.objects.create(workflow=wf, number=1, hash="h", spec={"tasks": {"t": spec}})
    _, _, outcome, _, error, *_ = executor.run(forged_message(spec, version=version))
    assert outcome == "succeeded" and marker.exists(), error
    marker.unlink()
    _, _, outcome, _, _, *_ = executor.run(
        forged_message({**spec, "env": {"LD_PRELOAD": "/tmp/evil.so"}}, task="t", version=version))
    assert outcome == "failed" and not marker.exists()


def test_a_workflow_task_declared_by_its_version_is_imported_and_run_by_the_worker(tmp_path, monkeypatch):
    package = f"wf_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "flow.py").write_text(
        "from orchestrator.dsl import Workflow\nwf = Workflow('flow')\n@wf.task\ndef hello(ctx):\n    return 'hello'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = f"{package}.flow:hello"
    spec = {"kind": "python", "ref": ref, "upstream": []}
    # Not declared by any version: refused, and the module is not imported.
    _, _, outcome, _, error, *_ = executor.run(forged_message(spec))
    assert outcome == "failed" and "unknown job" in error and f"{package}.flow" not in sys.modules
    wf = Workflow.objects.create(name="flow")
    version = WorkflowVersion.objects.create(workflow=wf, number=1, hash="h", spec={"tasks": {"hello": spec}})
    _, _, outcome, result, error, *_ = executor.run(forged_message(spec, task="hello", version=version))
    assert (outcome, result) == ("succeeded", '"hello"'), error


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_refuses_forged_rows_and_runs_nothing(processes, tmp_path):
    marker = tmp_path / "ran"
    env = process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"), ORCHESTRATOR_POLL_SECONDS="0.2")
    forged = [
        {"kind": "python", "ref": "os:system", "call": "job", "args": [f"touch {marker}"], "kwargs": {}},
        {"kind": "shell", "command": f"touch {marker}"},
    ]
    runs = [create_run(None, trigger="job", tasks={"t": spec})[0] for spec in forged]
    processes.start("worker", "--queues", "default", "--concurrency", "1", env=env)
    dispatcher.tick()

    def ended():
        return all(state == "failed" for state in Run.objects.filter(pk__in=[r.pk for r in runs])
                   .values_list("state", flat=True))

    wait_for(ended, 30, message="the forged runs to fail")
    errors = list(TaskRun.objects.filter(run__in=runs).values_list("error", flat=True))
    assert all(error.startswith("refused: ") for error in errors), errors
    assert not marker.exists()


def test_the_admin_cannot_add_a_task_run_or_change_what_one_executes(client, workflow):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    run, _ = create_run(workflow, trigger="manual")
    task_run = run.task_runs.first()
    assert client.get("/admin/orchestrator/taskrun/add/").status_code == 403
    change = f"/admin/orchestrator/taskrun/{task_run.pk}/change/"
    page = client.get(change).content.decode()
    assert 'name="spec"' not in page  # shown, not editable
    client.post(change, {"task": task_run.task, "spec": '{"kind": "shell", "command": "id"}', "run": run.pk,
                         "queue": "default", "priority": 0, "tenant": "default", "lane": 0, "max_attempts": 1})
    task_run.refresh_from_db()
    assert task_run.spec["kind"] == "python"
