"""The data model's constraints, run creation and the settings, on a real PostgreSQL."""

from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from orchestrator import checks
from orchestrator.database_url import parse_database_url
from orchestrator.models import Attempt, Run, Schedule, TaskRun, TaskState, Workflow, WorkflowVersion
from orchestrator.params import ParamError, clean_params
from orchestrator.runs import IdempotencyConflict, create_run
from project import checks as project_checks

pytestmark = pytest.mark.django_db

SPEC = {
    "params": {"n": {"type": "int", "required": False, "default": 1}},
    "tasks": {
        "a": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": [], "max_attempts": 2},
        "b": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": ["a"], "queue": "batch"},
    },
}


@pytest.fixture
def workflow():
    wf = Workflow.objects.create(name="wf")
    version = WorkflowVersion.objects.create(workflow=wf, number=1, hash="h1", spec=SPEC)
    wf.current_version = version
    wf.save()
    return wf


@pytest.fixture
def schedule(workflow):
    return Schedule.objects.create(workflow=workflow, cron="0 * * * *")


def raw_insert_run(workflow, schedule, logical_date, key=None):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO orchestrator_run (workflow_id, version_id, schedule_id, logical_date, trigger, params,"
            " tenant, priority, lane, state, reason, idempotency_key, payload_hash, created_at)"
            " VALUES (%s, %s, %s, %s, 'schedule', '{}', 'default', 0, 0, 'running', '', %s, '', now())",
            [workflow.pk, workflow.current_version_id, schedule.pk if schedule else None, logical_date, key],
        )


def test_the_database_refuses_a_second_run_for_the_same_fire_time(workflow, schedule):
    fire = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    raw_insert_run(workflow, schedule, fire)
    # Plain SQL, bypassing every Python check: PostgreSQL itself must refuse the duplicate.
    with pytest.raises(IntegrityError, match="run_one_per_fire_time"), transaction.atomic():
        raw_insert_run(workflow, schedule, fire)
    assert Run.objects.filter(schedule=schedule).count() == 1


def test_the_database_refuses_a_reused_idempotency_key(workflow):
    raw_insert_run(workflow, None, datetime(2026, 3, 1, tzinfo=UTC), key="k1")
    with pytest.raises(IntegrityError, match="run_unique_idempotency_key"), transaction.atomic():
        raw_insert_run(workflow, None, datetime(2026, 3, 2, tzinfo=UTC), key="k1")
    # Runs without a key are not constrained by it.
    raw_insert_run(workflow, None, datetime(2026, 3, 3, tzinfo=UTC))
    raw_insert_run(workflow, None, datetime(2026, 3, 3, tzinfo=UTC))


def test_the_database_refuses_duplicate_task_runs_and_attempt_numbers(workflow):
    run, _ = create_run(workflow, trigger="manual")
    with pytest.raises(IntegrityError, match="taskrun_unique_task"), transaction.atomic():
        TaskRun.objects.create(run=run, task="a")
    task_run = run.task_runs.get(task="a")
    Attempt.objects.create(task_run=task_run, number=1, started_at=datetime.now(UTC))
    with pytest.raises(IntegrityError, match="attempt_unique_number"), transaction.atomic():
        Attempt.objects.create(task_run=task_run, number=1, started_at=datetime.now(UTC))


def test_a_new_run_schedules_its_roots_and_holds_the_rest(workflow):
    run, created = create_run(workflow, trigger="manual", params={"n": 3}, priority=5)
    assert created and run.state == "running"
    states = {tr.task: tr for tr in run.task_runs.all()}
    assert states["a"].state == TaskState.SCHEDULED and states["a"].due_at is not None
    assert states["a"].max_attempts == 2 and states["a"].priority == 5
    assert states["b"].state == TaskState.WAITING and states["b"].upstream == ["a"]
    assert states["b"].queue == "batch"


def test_create_run_returns_the_existing_run_for_the_same_fire_time(workflow, schedule):
    fire = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    first, created = create_run(workflow, trigger="schedule", schedule=schedule, logical_date=fire)
    again, created_again = create_run(workflow, trigger="schedule", schedule=schedule, logical_date=fire)
    assert created and not created_again and again.pk == first.pk
    assert TaskRun.objects.filter(run__schedule=schedule).count() == 2


def test_an_idempotency_key_with_another_payload_is_refused(workflow):
    first, _ = create_run(workflow, trigger="api", idempotency_key="k", request_payload={"n": 1})
    same, created = create_run(workflow, trigger="api", idempotency_key="k", request_payload={"n": 1})
    assert same.pk == first.pk and not created
    with pytest.raises(IdempotencyConflict, match="already used for a different request"):
        create_run(workflow, trigger="api", idempotency_key="k", request_payload={"n": 2})
    assert Run.objects.count() == 1


def test_params_are_checked_against_their_declaration():
    declared = {"n": {"type": "int", "required": True}, "mode": {"type": "str", "default": "a", "choices": ["a", "b"]}}
    assert clean_params(declared, {"n": "4"}) == {"n": 4, "mode": "a"}
    with pytest.raises(ParamError) as error:
        clean_params(declared, {"n": "four", "mode": "c", "extra": 1})
    assert error.value.errors == {
        "n": 'expected an integer, got "four"',
        "mode": '"c" is not one of ["a", "b"]',
        "extra": "unknown param 'extra' (declared params: mode, n)",
    }
    with pytest.raises(ParamError, match="n: this param is required"):
        clean_params(declared, {})


def test_database_url_is_parsed_including_socket_hosts():
    parsed = parse_database_url("postgres://u:p%40ss@db.example:6543/orch?sslmode=require")
    assert (parsed["USER"], parsed["PASSWORD"], parsed["HOST"], parsed["PORT"], parsed["NAME"]) == (
        "u", "p@ss", "db.example", "6543", "orch")
    assert parsed["OPTIONS"] == {"sslmode": "require"}
    assert parse_database_url("postgresql://postgres@/orch?host=/tmp/sock")["HOST"] == "/tmp/sock"
    with pytest.raises(ValueError, match="must start with postgres://"):
        parse_database_url("mysql://u@h/db")
    with pytest.raises(ValueError, match="no database name"):
        parse_database_url("postgres://u@h:5432/")


def test_a_missing_secret_key_is_reported_by_a_system_check(settings):
    settings.DEBUG = False
    settings.SECRET_KEY = ""
    settings.ALLOWED_HOSTS = []
    ids = {problem.id for problem in [*project_checks.check_environment(), *project_checks.check_web_hosts()]}
    assert {"orchestrator.E002", "orchestrator.E005"} <= ids


def test_a_missing_workflows_package_is_reported_by_a_system_check(settings):
    settings.ORCHESTRATOR_WORKFLOWS_PACKAGE = "nowhere_to_be_found"
    problems = checks.check_configuration()
    assert any(p.id == "orchestrator.E003" and "nowhere_to_be_found" in p.msg for p in problems)


def test_migrations_are_complete():
    # A model change without its migration would break a user's first start.
    call_command("makemigrations", "orchestrator", "--check", "--dry-run", verbosity=0)
