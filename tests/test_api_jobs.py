# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The API's jobs and backfills: enqueue and read jobs, plan and start backfills; idempotency,
permissions and bad input for each."""

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import clock
from orchestrator.models import Backfill, Run, RunState, TaskRun, TaskState
from tests.support.api_support import (  # noqa: F401 - fixtures
    anonymous,
    api,
    operator,
    stored,
    viewer,
    viewer_api,
    workflow,
)

pytestmark = pytest.mark.django_db

REF = "workflows.jobs:send_welcome_email"


def enqueue(client, **data):
    return client.post("/api/jobs/", {"ref": REF, "kwargs": {"user_id": 42}, **data}, format="json")


# --- jobs ---------------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_an_operator_enqueues_a_delayed_job_and_reads_it_back(api, viewer_api, operator):
    later = clock.now().replace(microsecond=0) + timedelta(hours=1)
    response = enqueue(api, run_after=later.isoformat(), queue="batch", priority=7, max_attempts=3, timeout=30)
    assert response.status_code == 201, response.json()
    job = response.json()
    assert response["Location"] == f"/api/jobs/{job['id']}/"
    assert (job["ref"], job["kwargs"], job["state"], job["queue"]) == (REF, {"user_id": 42}, "scheduled", "batch")
    assert datetime.fromisoformat(job["due_at"]) == later

    run = Run.objects.get(pk=job["id"])
    task_run = TaskRun.objects.get(run=run)
    assert (run.trigger, run.workflow, run.created_by) == ("job", None, operator)
    assert (task_run.due_at, task_run.queue, task_run.priority, task_run.max_attempts) == (later, "batch", 7, 3)
    assert task_run.spec["call"] == "job" and task_run.spec["timeout"] == 30

    read = viewer_api.get(f"/api/jobs/{job['id']}/")
    assert read.status_code == 200 and read.json()["result"] is None
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.SUCCEEDED, result={"message_id": "welcome-42"})
    assert viewer_api.get(f"/api/jobs/{job['id']}/").json()["result"] == {"message_id": "welcome-42"}
    assert [j["id"] for j in viewer_api.get("/api/jobs/").json()["results"]] == [job["id"]]


@pytest.mark.time_sensitive
def test_big_integers_and_unicode_in_job_arguments_are_stored_as_given(api):
    response = api.post("/api/jobs/", {"ref": REF, "args": [10**30, "żółw ✓"], "kwargs": {}}, format="json")
    assert response.status_code == 201, response.json()
    assert TaskRun.objects.get(run_id=response.json()["id"]).spec["args"] == [10**30, "żółw ✓"]


@pytest.mark.time_sensitive
def test_a_job_key_returns_the_same_job_and_conflicts_on_another_payload(api):
    first = enqueue(api, idempotency_key="welcome-42")
    again = api.post("/api/jobs/", {"ref": REF, "kwargs": {"user_id": 42}}, format="json",
                     HTTP_IDEMPOTENCY_KEY="welcome-42")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    before = stored()
    other = enqueue(api, kwargs={"user_id": 43}, idempotency_key="welcome-42")
    assert other.status_code == 409 and "different request" in other.json()["detail"]
    assert stored() == before


@pytest.mark.parametrize("data, field, message", [
    ({"ref": "workflows.nope:thing"}, "ref", "unknown job 'workflows.nope:thing'"),
    ({"ref": "workflows.jobs:nothing_here"}, "ref", "unknown job 'workflows.jobs:nothing_here'"),
    ({"ref": "not a reference"}, "ref", "package.module:function"),
    ({"ref": ""}, "ref", "may not be blank"),
    ({"run_after": "2026-03-01T10:00:00"}, "run_after", "no timezone"),
    ({"run_after": "next tuesday"}, "run_after", "expected a date and time"),
    ({"args": {"user_id": 1}}, "args", "expected a JSON array"),
    ({"kwargs": [1]}, "kwargs", "expected a JSON object"),
    ({"kwargs": {"user_id": "a\x00b"}}, "kwargs", "the text at user_id contains a NUL character"),
    ({"priority": 101}, "priority", "less than or equal to 100"),
    ({"priority": 2**64}, "priority", "less than or equal to 100"),
    ({"max_attempts": 0}, "max_attempts", "greater than or equal to 1"),
    ({"timeout": -1}, "timeout", "greater than or equal to"),
    ({"timeout": "forever"}, "timeout", "valid number"),
    ({"queue": "no spaces please"}, "queue", "does not match"),
    ({"idempotency_key": ""}, "idempotency_key", "may not be blank"),
])
def test_bad_job_input_is_a_400_naming_the_field_and_stores_nothing(api, data, field, message):
    before = stored()
    response = enqueue(api, **data)
    assert response.status_code == 400, response.json()
    assert message in str(response.json()[field]), response.json()
    assert stored() == before


def test_jobs_are_read_by_viewers_and_enqueued_by_operators(viewer_api, anonymous, api):
    before = stored()
    assert enqueue(viewer_api).status_code == 403
    assert enqueue(anonymous).status_code == 401
    assert anonymous.get("/api/jobs/").status_code == 401
    assert stored() == before
    assert viewer_api.get("/api/jobs/").status_code == 200


@pytest.mark.time_sensitive
def test_a_list_of_jobs_is_enqueued_at_once_and_answered_in_order(api, viewer_api, operator):
    from orchestrator.models import AuditEvent
    from tests.support.sent import Sent

    items = [{"ref": REF, "kwargs": {"user_id": n}, "queue": "batch", "idempotency_key": f"w-{n}"} for n in range(5)]
    with Sent() as queries:
        response = api.post("/api/jobs/", items, format="json")
    assert response.status_code == 201, response.json()
    answered = response.json()
    assert [job["kwargs"] for job in answered] == [{"user_id": n} for n in range(5)]
    assert {job["state"] for job in answered} == {"scheduled"}
    # One INSERT for the five runs and their task runs (the rest: the token, the audit, the read-back).
    inserts = [sql for sql in queries.sql if 'INSERT INTO "orchestrator_run"' in sql or 'INSERT INTO "orchestrator_taskrun"' in sql]
    assert len(inserts) == 1
    assert Run.objects.filter(created_by=operator).count() == 5
    assert AuditEvent.objects.filter(action="enqueue").count() == 5
    # Sent again (a client retrying): the same jobs, nothing new.
    again = api.post("/api/jobs/", items, format="json")
    assert again.status_code == 200
    assert [job["id"] for job in again.json()] == [job["id"] for job in answered]
    assert Run.objects.count() == 5
    # Not for viewers.
    assert viewer_api.post("/api/jobs/", items, format="json").status_code == 403


@pytest.mark.parametrize(("items", "field", "message"), [
    ([{"ref": REF}, {"ref": REF, "priority": 1000}], "jobs[1].priority", ""),
    ([{"ref": REF}, "x"], "jobs[1]", "expected a JSON object"),
    ([{"ref": "workflows.jobs:missing"}], "jobs[0].ref", "unknown job"),
    ([{"ref": REF, "idempotency_key": "k"}, {"ref": REF, "args": [1], "idempotency_key": "k"}],
     "jobs[1].idempotency_key", "also the key of jobs[0]"),
    ([], "non_field_errors", "1 to 1000 jobs"),
    ([{"ref": REF}] * 1001, "non_field_errors", "1 to 1000 jobs"),
])
def test_a_bad_list_of_jobs_is_a_400_naming_the_item_and_stores_nothing(api, items, field, message):
    response = api.post("/api/jobs/", items, format="json")
    assert response.status_code == 400, response.json()
    assert message in response.json()[field][0]
    assert Run.objects.count() == 0


@pytest.mark.time_sensitive
def test_a_list_of_jobs_conflicting_with_a_stored_key_is_a_409_and_stores_nothing(api):
    assert enqueue(api, idempotency_key="k").status_code == 201
    response = api.post("/api/jobs/", [{"ref": REF, "idempotency_key": "new"},
                                       {"ref": REF, "kwargs": {"user_id": 7}, "idempotency_key": "k"}], format="json")
    assert response.status_code == 409, response.json()
    assert not Run.objects.filter(idempotency_key="new").exists()
    header = api.post("/api/jobs/", [{"ref": REF}], format="json", HTTP_IDEMPOTENCY_KEY="x")
    assert header.status_code == 400 and "no Idempotency-Key header" in header.json()["idempotency_key"][0]
    assert Run.objects.count() == 1


@pytest.mark.time_sensitive
def test_an_unknown_job_or_a_workflow_run_is_not_a_job(api, workflow):
    from orchestrator.runs import trigger_workflow

    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    assert api.get(f"/api/jobs/{run.pk}/").status_code == 404
    assert api.get("/api/jobs/31337/").json()["detail"] == "no job 31337"


# --- backfills ----------------------------------------------------------------------------------

MARCH = {"workflow": "reports", "start": "2026-03-01T00:00:00+01:00", "end": "2026-03-05T23:59:59+01:00",
         "params": {"day": "2026-03-01"}}


@pytest.mark.time_sensitive
def test_a_dry_run_lists_the_fire_times_and_creates_nothing(api, workflow):
    before = stored()
    response = api.post("/api/backfills/", {**MARCH, "dry_run": True}, format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["count"] == plan["to_create"] == 5 and plan["existing"] == 0
    # 02:30 in Berlin, winter time: 01:30 UTC.
    assert plan["fire_times"][0] == datetime(2026, 3, 1, 1, 30, tzinfo=UTC).isoformat()
    assert (plan["cron"], plan["timezone"]) == ("30 2 * * *", "Europe/Berlin")
    assert stored() == before


@pytest.mark.time_sensitive
def test_an_operator_starts_a_backfill_and_follows_its_progress(api, viewer_api, operator, workflow):
    response = api.post("/api/backfills/", MARCH, format="json")
    assert response.status_code == 201, response.json()
    backfill = response.json()
    assert (backfill["total"], backfill["done"], backfill["workflow"]) == (5, 0, "reports")
    runs = Run.objects.filter(backfill_id=backfill["id"])
    assert runs.count() == 5 and {r.trigger for r in runs} == {"backfill"}
    assert {r.created_by for r in runs} == {operator}

    runs.filter(logical_date__lt=datetime(2026, 3, 3, tzinfo=UTC)).update(state=RunState.SUCCEEDED)
    progress = viewer_api.get(f"/api/backfills/{backfill['id']}/").json()
    assert (progress["done"], progress["total"]) == (2, 5)
    assert [b["id"] for b in viewer_api.get("/api/backfills/").json()["results"]] == [backfill["id"]]

    # The same range again: every fire time has a run, so there is nothing to do.
    again = api.post("/api/backfills/", MARCH, format="json")
    assert again.status_code == 400 and "nothing to backfill" in again.json()["start"][0]


@pytest.mark.time_sensitive
def test_a_backfill_can_follow_its_own_cron_expression(api, workflow):
    data = {**MARCH, "cron": "0 */12 * * *", "timezone": "UTC", "dry_run": True}
    plan = api.post("/api/backfills/", data, format="json").json()
    assert plan["count"] == 10 and plan["cron"] == "0 */12 * * *"


@pytest.mark.time_sensitive
@pytest.mark.parametrize("change, field, message", [
    ({"workflow": "nope"}, "workflow", "unknown workflow 'nope'"),
    ({"end": "2026-02-01T00:00:00Z"}, "end", "must not be before start"),
    ({"start": "2026-03-01T00:00:00"}, "start", "no timezone"),
    ({"cron": "61 * * * *"}, "cron", "minute field value 61 is out of range"),
    ({"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, "timezone", "unknown timezone 'Mars/Olympus'"),
    ({"schedule": "weekly"}, "schedule", "has no schedule 'weekly'"),
    ({"schedule": "default", "cron": "0 0 * * *"}, "cron", "not both"),
    ({"params": {"day": "2026-03-01", "colour": "red"}}, "params", "unknown param 'colour'"),
    # On its own cron, a backfill has no schedule's params to fall back on.
    ({"cron": "0 0 * * *", "timezone": "UTC", "params": {}}, "params", "this param is required"),
    ({"params": "day=1"}, "params", "expected a JSON object"),
    ({"reprocess": "everything"}, "reprocess", "is not a valid choice"),
    ({"end": "2031-01-01T00:00:00Z"}, "end", "MAX_BACKFILL_RUNS"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_bad_backfill_input_is_a_400_naming_the_field_and_stores_nothing(api, workflow, settings, change, field,
                                                                         message, dry_run):
    settings.ORCHESTRATOR_MAX_BACKFILL_RUNS = 100
    before = stored()
    response = api.post("/api/backfills/", {**MARCH, **change, "dry_run": dry_run}, format="json")
    assert response.status_code == 400, response.json()
    assert message in str(response.json()[field]), response.json()
    assert stored() == before


@pytest.mark.time_sensitive
def test_a_range_without_fire_times_plans_nothing_and_cannot_start(api, workflow):
    empty = {**MARCH, "start": "2026-03-01T03:00:00+01:00", "end": "2026-03-01T04:00:00+01:00"}
    plan = api.post("/api/backfills/", {**empty, "dry_run": True}, format="json")
    assert plan.status_code == 200 and (plan.json()["count"], plan.json()["fire_times"]) == (0, [])
    before = stored()
    started = api.post("/api/backfills/", empty, format="json")
    assert started.status_code == 400 and "no fire time" in started.json()["start"][0]
    assert stored() == before


@pytest.mark.time_sensitive
def test_backfills_are_read_by_viewers_and_started_by_operators(viewer_api, anonymous, api, workflow):
    before = stored()
    assert viewer_api.post("/api/backfills/", MARCH, format="json").status_code == 403
    assert anonymous.post("/api/backfills/", MARCH, format="json").status_code == 401
    assert stored() == before
    assert viewer_api.get("/api/backfills/").status_code == 200
    assert api.get("/api/backfills/777/").status_code == 404
    assert not Backfill.objects.exists()


def test_a_running_job_s_start_is_its_task_run_s_until_its_worker_writes_its_run_s(api):
    """A worker writes a run's start up to 0.2 s after its claim (worker.batch.RUN_STARTS); a
    job's start meanwhile is its running task run's, never nothing."""
    job = enqueue(api).json()
    assert job["started_at"] is None
    claimed = clock.now().replace(microsecond=0) - timedelta(seconds=5)
    TaskRun.objects.filter(run_id=job["id"]).update(state=TaskState.RUNNING, started_at=claimed)
    assert datetime.fromisoformat(api.get(f"/api/jobs/{job['id']}/").json()["started_at"]) == claimed
    Run.objects.filter(pk=job["id"]).update(started_at=claimed - timedelta(seconds=1))
    assert datetime.fromisoformat(api.get(f"/api/jobs/{job['id']}/").json()["started_at"]) == \
        claimed - timedelta(seconds=1)
    # Handed back (due again, not running): no start until a claim.
    Run.objects.filter(pk=job["id"]).update(started_at=None)
    TaskRun.objects.filter(run_id=job["id"]).update(state=TaskState.SCHEDULED)
    assert api.get(f"/api/jobs/{job['id']}/").json()["started_at"] is None
