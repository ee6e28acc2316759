# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The audit log: every operator action from the UI, the API, the admin and the command line is
recorded with who, when, what and from where; operators read it on a page and through the API;
retention never deletes it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse

from orchestrator import audit, clock
from orchestrator.clock import FakeClock
from orchestrator.models import AuditEvent, QueueLimit, Run, RunState, TaskRun, TaskState, TenantLimit
from orchestrator.retention import prune
from orchestrator.runs import create_run
from tests.support.api_support import (  # noqa: F401 - fixtures
    api,
    client_for,
    make_user,
    operator,
    viewer,
    viewer_api,
    workflow,
)

pytestmark = pytest.mark.django_db


def events(**filters) -> list[tuple]:
    return list(AuditEvent.objects.filter(**filters).order_by("id")
                .values_list("actor_name", "action", "source", "target_type", "target_id"))


def dead(workflow) -> TaskRun:
    run, _ = create_run(workflow, trigger="manual")
    task_run = run.task_runs.get(task="extract")
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.DEAD, attempts=1)
    return task_run


def test_each_action_in_the_web_ui_is_recorded_with_who_what_and_from_where(client, operator, workflow):
    client.force_login(operator)
    at = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    with clock.pinned(FakeClock(at)):
        client.post(reverse("orchestrator:web:workflow_trigger", args=["reports"]),
                    {"param.day": "2026-03-01", "param.orders": "7"}, REMOTE_ADDR="203.0.113.7")
    run = Run.objects.get()
    client.post(reverse("orchestrator:web:workflow_pause", args=["reports"]))
    client.post(reverse("orchestrator:web:workflow_resume", args=["reports"]))
    client.post(reverse("orchestrator:web:run_cancel", args=[run.pk]))
    client.post(reverse("orchestrator:web:run_retry", args=[run.pk]))
    task_run = dead(workflow)
    client.post(reverse("orchestrator:web:dead_letter"), {"action": "retry", "ids": [task_run.pk], "confirmed": "on"})
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.DEAD)
    client.post(reverse("orchestrator:web:dead_letter"), {"action": "discard", "ids": [task_run.pk], "confirmed": "on"})
    assert events() == [
        ("olga", "trigger", "ui", "run", str(run.pk)),
        ("olga", "pause", "ui", "workflow", str(workflow.pk)),
        ("olga", "resume", "ui", "workflow", str(workflow.pk)),
        ("olga", "cancel", "ui", "run", str(run.pk)),
        ("olga", "retry", "ui", "run", str(run.pk)),
        ("olga", "retry", "ui", "taskrun", str(task_run.pk)),
        ("olga", "discard", "ui", "taskrun", str(task_run.pk)),
    ]
    first = AuditEvent.objects.order_by("id").first()
    assert (first.at, first.ip, first.actor) == (at, "203.0.113.7", operator)
    # The params as the run took them: typed (7, not "7"), the defaults included.
    # And the logical date the run took (now, when the form leaves it empty).
    assert first.detail == {"workflow": "reports", "params": {"day": "2026-03-01", "orders": 7, "currency": "EUR"},
                            "logical_date": at.isoformat()}
    assert first.detail["params"] == run.params


def test_a_task_run_action_is_recorded_and_shown_with_its_workflow_task_and_what_it_changed(client, operator,
                                                                                            workflow):
    client.force_login(operator)
    task_run = dead(workflow)
    client.post(reverse("orchestrator:web:task_run_action", args=[task_run.pk, "mark-failed"]))
    event = AuditEvent.objects.get(action="mark")
    assert event.detail == {"workflow": "reports", "task": "extract", "run": task_run.run_id, "state": "failed",
                            "was": "dead", "changed": [task_run.pk], "changed_tasks": ["extract"]}
    page = client.get(reverse("orchestrator:web:audit")).content.decode()
    row = re.search(r"<tr><td>.*?</tr>", page, re.S).group(0)
    assert f'<a href="/task-runs/{task_run.pk}/">reports / extract in run #{task_run.run_id}</a>' in row
    detail = re.search(r'<td class="detail"><code>(.*?)</code>', row).group(1).split(", ")
    assert sorted(detail) == ["changed 1 task run", "changed_tasks=[&quot;extract&quot;]", "state=&quot;failed&quot;",
                              "was=&quot;dead&quot;"]


def test_each_action_through_the_api_is_recorded(api, workflow):
    response = api.post("/api/workflows/reports/runs/", {"params": {"day": "2026-03-01"}}, format="json")
    run_id = response.json()["id"]
    api.post(f"/api/runs/{run_id}/cancel/", {"reason": "wrong day"}, format="json")
    api.post(f"/api/runs/{run_id}/retry/", {}, format="json")
    api.post("/api/workflows/reports/pause/")
    api.post("/api/workflows/reports/resume/")
    job = api.post("/api/jobs/", {"ref": "workflows.jobs:noop"}, format="json").json()["id"]
    backfill = api.post("/api/backfills/", {"workflow": "reports", "start": "2026-03-01T00:00:00Z",
                                            "end": "2026-03-02T23:59:59Z", "params": {"day": "2026-03-01"}},
                        format="json").json()["id"]
    task_run = dead(workflow)
    api.post("/api/dlq/retry/", {"ids": [task_run.pk]}, format="json")
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.DEAD)
    api.post("/api/dlq/discard/", {"ids": [task_run.pk]}, format="json")
    assert [row[1:] for row in events()] == [
        ("trigger", "api", "run", str(run_id)), ("cancel", "api", "run", str(run_id)),
        ("retry", "api", "run", str(run_id)), ("pause", "api", "workflow", str(workflow.pk)),
        ("resume", "api", "workflow", str(workflow.pk)), ("enqueue", "api", "run", str(job)),
        ("backfill", "api", "backfill", str(backfill)), ("retry", "api", "taskrun", str(task_run.pk)),
        ("discard", "api", "taskrun", str(task_run.pk)),
    ]
    assert set(AuditEvent.objects.values_list("actor_name", flat=True)) == {"olga"}
    assert AuditEvent.objects.get(action="cancel").detail == {"reason": "wrong day", "changed": True}
    # A request that fails changes nothing and records nothing.
    before = AuditEvent.objects.count()
    assert api.post("/api/jobs/", {"ref": "os:system"}, format="json").status_code == 400
    assert AuditEvent.objects.count() == before


def test_admin_actions_and_limit_changes_are_recorded(client, workflow):
    root = User.objects.create_superuser("root", password="pw")
    client.force_login(root)
    run, _ = create_run(workflow, trigger="manual")
    client.post(reverse("admin:orchestrator_workflow_changelist"),
                {"action": "pause", "_selected_action": [workflow.pk]})
    client.post(reverse("admin:orchestrator_run_changelist"), {"action": "cancel", "_selected_action": [run.pk]})
    client.post(reverse("admin:orchestrator_queuelimit_add"), {"queue": "batch", "max_running": 3})
    limit = QueueLimit.objects.get()
    client.post(reverse("admin:orchestrator_queuelimit_change", args=[limit.pk]), {"queue": "batch", "max_running": 5})
    client.post(reverse("admin:orchestrator_queuelimit_delete", args=[limit.pk]), {"post": "yes"})
    client.post(reverse("admin:orchestrator_tenantlimit_add"), {"tenant": "acme", "max_running": 2})
    assert [row[:3] for row in events()] == [("root", "pause", "admin"), ("root", "cancel", "admin")] + \
        [("root", "limit", "admin")] * 4
    changes = [e.detail for e in AuditEvent.objects.filter(action="limit").order_by("id")]
    assert [c["change"] for c in changes] == ["added", "changed", "deleted", "added"]
    assert changes[1]["now"] == {"queue": "batch", "max_running": 5} and changes[2]["was"]["max_running"] == 5
    assert TenantLimit.objects.count() == 1


def test_a_backfill_from_the_command_line_is_recorded_with_the_system_user(workflow):
    call_command("backfill", "reports", "--start", "2026-03-01", "--end", "2026-03-02", "--param", "day=2026-03-01",
                 stdout=open("/dev/null", "w"), stderr=open("/dev/null", "w"))
    [event] = AuditEvent.objects.all()
    assert (event.action, event.source, event.actor, event.target_type) == ("backfill", "cli", None, "backfill")
    assert event.actor_name == audit.cli_user() and event.actor_name
    assert event.detail["runs"] == 2


def test_an_action_rolled_back_leaves_no_record(workflow):
    with pytest.raises(RuntimeError), transaction.atomic():
        audit.record("pause", target=workflow)
        raise RuntimeError("changed our mind")
    assert not AuditEvent.objects.exists()


def test_behind_the_proxy_the_address_is_the_one_the_proxy_saw(rf, settings, operator):
    request = rf.post("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.4")
    request.user = operator
    assert audit.record("pause", request=request, source="ui").ip == "10.0.0.2"
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # The last address is the proxy's own observation; the first one could be forged by the client.
    assert audit.record("pause", request=request, source="ui").ip == "198.51.100.4"


def test_operators_read_the_audit_log_on_a_page_and_viewers_do_not(client, operator, viewer, workflow):
    audit.record("pause", user=operator, source="api", target=workflow)
    audit.record("trigger", user=operator, source="ui", target_type="run", target_id=41, workflow="reports")
    client.force_login(viewer)
    assert client.get(reverse("orchestrator:web:audit")).status_code == 403
    assert "Audit log" not in client.get(reverse("orchestrator:web:runs")).content.decode()
    client.force_login(operator)
    page = client.get(reverse("orchestrator:web:audit")).content.decode()
    assert "Audit log" in client.get(reverse("orchestrator:web:runs")).content.decode()
    assert page.count("<tr><td>") == 2 and 'href="/runs/41/"' in page and 'workflow=&quot;reports&quot;' in page
    filtered = client.get(reverse("orchestrator:web:audit"), {"action": "pause"}).content.decode()
    assert filtered.count("<tr><td>") == 1 and "reports" in filtered
    # A NUL character in the address is refused before any page (PostgreSQL cannot compare it).
    assert client.get(reverse("orchestrator:web:audit"), {"target_id": "a\x00b"}).status_code == 400


def test_the_audit_api_is_for_operators_paginated_and_filtered(api, viewer_api, operator, workflow):
    for number in range(5):
        audit.record("cancel" if number % 2 else "trigger", user=operator, source="api", target_type="run",
                     target_id=number)
    assert viewer_api.get("/api/audit/").status_code == 403
    page = api.get("/api/audit/", {"limit": 2}).json()
    assert [e["target_id"] for e in page["results"]] == ["4", "3"] and page["next"]
    rest = api.get(page["next"]).json()
    assert [e["target_id"] for e in rest["results"]] == ["2", "1"]
    cancels = api.get("/api/audit/", {"action": "cancel"}).json()["results"]
    assert [e["target_id"] for e in cancels] == ["3", "1"]
    assert set(cancels[0]) == {"id", "at", "actor", "action", "source", "ip", "target_type", "target_id",
                               "target_label", "detail"}
    assert api.get("/api/audit/", {"source": "carrier-pigeon"}).status_code == 400
    assert api.get("/api/audit/", {"since": "2026-01-01"}).status_code == 400  # no timezone


def test_retention_never_deletes_audit_records(operator, workflow):
    run, _ = create_run(workflow, trigger="manual")
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, finished_at=long_ago)
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED, finished_at=long_ago)
    with clock.pinned(FakeClock(long_ago)):
        audit.record("trigger", user=operator, source="ui", target=run)
    report = prune(timedelta(days=30))
    assert report.runs == 1 and not Run.objects.exists()
    event = AuditEvent.objects.get()
    assert (event.target_type, event.target_id, event.actor) == ("run", str(run.pk), operator)
