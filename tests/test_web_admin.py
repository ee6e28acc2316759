"""The admin: every model listed, actions that change state reserved to operators, and a
backfill that previews its fire times before it creates anything."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Backfill, Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from tests.test_web import dead_task_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def etl():
    sync_workflows()
    return Workflow.objects.select_related("current_version").get(name="nightly_etl")


@pytest.fixture
def admin_client(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


@pytest.mark.time_sensitive
def test_every_model_has_an_admin_list_with_its_columns(admin_client, etl):
    dead = dead_task_run(etl, error="KeyError: 'region'")
    pages = {
        "workflow": "nightly_etl", "workflowversion": "nightly_etl", "run": f"{dead.run_id}",
        "taskrun": "extract", "deadtaskrun": "KeyError", "attempt": "extract", "worker": "",
        "lease": "", "queuelimit": "", "tenantlimit": "", "backfill": "", "webhookdelivery": "",
        "schedule": "30 2 * * *",
    }
    for model, expected in pages.items():
        response = admin_client.get(reverse(f"admin:orchestrator_{model}_changelist"))
        assert response.status_code == 200, model
        assert expected in response.content.decode(), model
    # the dead-letter queue lists dead task runs only
    create_run(etl, trigger="manual")
    html = admin_client.get(reverse("admin:orchestrator_deadtaskrun_changelist")).content.decode()
    assert html.count('class="action-select"') == 1


@pytest.mark.time_sensitive
def test_a_backfill_previews_its_fire_times_and_creates_runs_only_when_confirmed(admin_client, etl):
    url = reverse("admin:orchestrator_workflow_backfill", args=[etl.pk])
    form = {"start": "2026-03-01 00:00", "end": "2026-03-03 23:59", "reprocess": "none", "schedule": "",
            "params": '{"orders": 10}'}
    assert admin_client.get(url).status_code == 200
    preview = admin_client.post(url, {**form, "preview": "1"}).content.decode()
    # 02:30 in Berlin (UTC+1 in March before the change) is 01:30 UTC, three days in the range
    assert re.search(r'<b id="preview-count">3</b>', preview)
    assert re.findall(r"<li><time [^>]*>(2026-03-0\d 01:30:00) UTC</time> <span class=\"help\">(2026-03-0\d 02:30) "
                      r"Europe/Berlin</span></li>", preview) == [
        ("2026-03-01 01:30:00", "2026-03-01 02:30"), ("2026-03-02 01:30:00", "2026-03-02 02:30"),
        ("2026-03-03 01:30:00", "2026-03-03 02:30")]
    assert not Backfill.objects.exists() and not Run.objects.exists()

    digest = re.search(r'name="confirm" value="([0-9a-f]+)"', preview).group(1)
    # "preview again" never starts; values edited after the preview get a new preview, not a start
    again = admin_client.post(url, {**form, "confirm": digest, "preview": "Preview again"})
    assert again.status_code == 200 and not Backfill.objects.exists()
    edited = admin_client.post(url, {**form, "end": "2026-03-04 23:59", "confirm": digest, "go": "Start"})
    assert edited.status_code == 200 and b'<b id="preview-count">4</b>' in edited.content
    assert not Backfill.objects.exists()

    started = admin_client.post(url, {**form, "confirm": digest, "go": "Start"})
    backfill = Backfill.objects.get()
    assert started.status_code == 302
    assert started["Location"] == reverse("admin:orchestrator_backfill_change", args=[backfill.pk])
    runs = Run.objects.filter(backfill=backfill)
    assert runs.count() == 3 and {r.params["orders"] for r in runs} == {10}
    listing = admin_client.get(reverse("admin:orchestrator_backfill_changelist")).content.decode()
    assert "0 / 3" in listing
    Run.objects.filter(pk=runs[0].pk).update(state=RunState.SUCCEEDED)
    assert "1 / 3" in admin_client.get(reverse("admin:orchestrator_backfill_changelist")).content.decode()


@pytest.mark.time_sensitive
def test_a_bad_backfill_form_names_the_field_and_creates_nothing(admin_client, etl):
    url = reverse("admin:orchestrator_workflow_backfill", args=[etl.pk])
    backwards = admin_client.post(url, {"start": "2026-03-05 00:00", "end": "2026-03-01 00:00", "reprocess": "none",
                                        "preview": "1"}).content.decode()
    assert "must not be before the start" in backwards
    bad_params = admin_client.post(url, {"start": "2026-03-01 00:00", "end": "2026-03-02 00:00", "reprocess": "none",
                                         "params": '{"orders": "many", "colour": 1}', "preview": "1"}).content.decode()
    assert "orders: expected an integer, got &quot;many&quot;" in bad_params
    assert "colour: unknown param &#x27;colour&#x27;" in bad_params
    too_many = admin_client.post(url, {"start": "2000-01-01 00:00", "end": "2099-01-01 00:00", "reprocess": "none",
                                       "preview": "1"}).content.decode()
    assert "MAX_BACKFILL_RUNS" in too_many
    assert not Backfill.objects.exists() and not Run.objects.exists()


@pytest.mark.time_sensitive
def test_operators_pause_workflows_cancel_runs_and_retry_or_discard_dead_task_runs(admin_client, etl):
    changelist = reverse("admin:orchestrator_workflow_changelist")
    admin_client.post(changelist, {"action": "pause", "_selected_action": [etl.pk]})
    etl.refresh_from_db()
    assert etl.paused
    admin_client.post(changelist, {"action": "resume", "_selected_action": [etl.pk]})
    etl.refresh_from_db()
    assert not etl.paused
    backfill = admin_client.post(changelist, {"action": "backfill", "_selected_action": [etl.pk]})
    assert backfill["Location"] == reverse("admin:orchestrator_workflow_backfill", args=[etl.pk])

    run, _ = create_run(etl, trigger="manual")
    admin_client.post(reverse("admin:orchestrator_run_changelist"), {"action": "cancel", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED

    first, second = dead_task_run(etl), dead_task_run(etl)
    dlq = reverse("admin:orchestrator_deadtaskrun_changelist")
    admin_client.post(dlq, {"action": "retry", "_selected_action": [first.pk]})
    admin_client.post(dlq, {"action": "discard", "_selected_action": [second.pk]})
    assert TaskRun.objects.get(pk=first.pk).state in (TaskState.SCHEDULED, TaskState.QUEUED)
    assert TaskRun.objects.get(pk=second.pk).state == TaskState.FAILED


@pytest.mark.time_sensitive
def test_a_staff_viewer_cannot_run_state_changing_admin_actions(client, etl):
    viewer = User.objects.create_user("vera", password="pw", is_staff=True)
    access.add_to_group(viewer, access.VIEWERS)
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="orchestrator"))
    client.force_login(viewer)
    dead = dead_task_run(etl)
    changelist = reverse("admin:orchestrator_workflow_changelist")
    assert b'value="pause"' not in client.get(changelist).content
    client.post(changelist, {"action": "pause", "_selected_action": [etl.pk]})
    client.post(reverse("admin:orchestrator_deadtaskrun_changelist"),
                {"action": "retry", "_selected_action": [dead.pk]})
    assert client.get(reverse("admin:orchestrator_workflow_backfill", args=[etl.pk])).status_code == 403
    etl.refresh_from_db()
    dead.refresh_from_db()
    assert (etl.paused, dead.state) == (False, TaskState.DEAD)


@pytest.mark.time_sensitive
def test_the_admin_offers_no_bare_add_for_runs_so_no_run_without_task_runs_can_exist(admin_client, etl):
    # A run saved as a bare row (no task runs, no version) would stay "running" forever and hold a
    # max_active_runs slot; runs come from a trigger, the API or a backfill.
    changelist = admin_client.get(reverse("admin:orchestrator_run_changelist")).content.decode()
    assert reverse("admin:orchestrator_run_add") not in changelist
    response = admin_client.post(reverse("admin:orchestrator_run_add"), {
        "workflow": etl.pk, "logical_date_0": "2026-03-02", "logical_date_1": "09:00:00", "trigger": "manual",
        "params": "{}", "tenant": "default", "priority": "0", "lane": "live", "reason": "",
    })
    assert response.status_code == 403
    assert not Run.objects.exists()
