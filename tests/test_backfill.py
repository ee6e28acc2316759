"""Backfills: one run per fire time in the range, in the backfill lane; existing fire times skipped
unless reprocessing; bad requests refused with nothing written."""

import re
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from orchestrator import access, backfill
from orchestrator.backfill import BackfillError
from orchestrator.models import (
    Attempt,
    AuditEvent,
    Backfill,
    Lane,
    Run,
    RunState,
    Schedule,
    TaskRun,
    TaskState,
    Trigger,
)
from orchestrator.web.zones import ZONE_COOKIE
from tests.support.api_support import make_user
from tests.test_scheduler import make_schedule, make_workflow

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def day(d, hour=0, minute=0):
    return datetime(2026, 1, d, hour, minute, tzinfo=UTC)


@pytest.fixture
def workflow():
    workflow = make_workflow("etl", params={"n": {"type": "int", "required": False, "default": 1}})
    # 02:30 in Berlin is 01:30 UTC in January.
    make_schedule(workflow, "30 2 * * *", now=NOW, tz="Europe/Berlin", params={"n": 5})
    return workflow


def assert_nothing_written():
    assert Run.objects.count() == 0
    assert TaskRun.objects.count() == 0
    assert Backfill.objects.count() == 0


def test_a_plan_lists_the_fire_times_in_the_range_and_writes_nothing(workflow):
    plan = backfill.plan(workflow, day(1), day(5, 1, 30))
    # Both ends are included: the last fire time is exactly the end.
    assert plan.fire_times == [day(d, 1, 30) for d in range(1, 6)]
    assert (plan.count, plan.existing, plan.to_create) == (5, [], plan.fire_times)
    assert_nothing_written()


def test_a_backfill_creates_one_run_per_fire_time_in_the_backfill_lane(workflow):
    created = backfill.start(workflow, day(1), day(3, 23), params={"n": 9}, now=NOW)
    runs = list(Run.objects.order_by("logical_date"))
    assert [r.logical_date for r in runs] == [day(1, 1, 30), day(2, 1, 30), day(3, 1, 30)]
    assert {(r.trigger, r.lane, r.backfill_id, r.state) for r in runs} == {
        (Trigger.BACKFILL, Lane.BACKFILL, created.pk, RunState.RUNNING)}
    assert all(r.schedule == workflow.schedules.get() for r in runs)
    assert all(r.params == {"n": 9} for r in runs)  # the backfill's params override the schedule's
    roots = TaskRun.objects.filter(task="extract")
    assert {(t.lane, t.state, t.due_at) for t in roots} == {(Lane.BACKFILL, TaskState.SCHEDULED, NOW)}
    assert created.total == 3
    assert backfill.progress(created) == (0, 3)
    Run.objects.filter(pk=runs[0].pk).update(state=RunState.SUCCEEDED)
    assert backfill.progress(created) == (1, 3)


def test_fire_times_that_already_have_a_run_are_skipped(workflow):
    schedule = workflow.schedules.get()
    live = Run.objects.create(workflow=workflow, version=workflow.current_version, schedule=schedule,
                              logical_date=day(2, 1, 30), trigger="schedule", state=RunState.SUCCEEDED)
    plan = backfill.plan(workflow, day(1), day(3, 23))
    assert (plan.existing, plan.to_create) == ([day(2, 1, 30)], [day(1, 1, 30), day(3, 1, 30)])
    created = backfill.start(workflow, day(1), day(3, 23), now=NOW)
    assert created.total == 2
    assert Run.objects.filter(logical_date=day(2, 1, 30)).get() == live
    assert Run.objects.count() == 3


def make_finished_run(workflow, when, state):
    run = Run.objects.create(workflow=workflow, version=workflow.current_version, schedule=workflow.schedules.get(),
                             logical_date=when, trigger="schedule", state=state, finished_at=NOW)
    if state not in (RunState.SKIPPED, RunState.MISSED):
        extract = TaskRun.objects.create(run=run, task="extract", spec={"max_attempts": 2}, state=TaskState.DEAD,
                                         attempts=2, max_attempts=2, finished_at=NOW, error="boom")
        Attempt.objects.create(task_run=extract, number=1, started_at=NOW, outcome="failed")
        TaskRun.objects.create(run=run, task="load", upstream=["extract"], state=TaskState.UPSTREAM_FAILED)
    return run


@pytest.mark.parametrize(("reprocess", "rerun"), [
    ("none", set()),
    ("failed", {"failed", "missed"}),
    ("all", {"failed", "missed", "succeeded"}),
])
def test_reprocessing_resets_existing_runs_instead_of_inserting_duplicates(workflow, reprocess, rerun):
    runs = {
        "failed": make_finished_run(workflow, day(1, 1, 30), RunState.FAILED),
        "missed": make_finished_run(workflow, day(2, 1, 30), RunState.MISSED),
        "succeeded": make_finished_run(workflow, day(3, 1, 30), RunState.SUCCEEDED),
    }
    if not rerun:
        with pytest.raises(BackfillError, match="already have a run"):
            backfill.start(workflow, day(1), day(3, 23), reprocess=reprocess, now=NOW)
        assert Backfill.objects.count() == 0
        return
    created = backfill.start(workflow, day(1), day(3, 23), reprocess=reprocess, now=NOW)
    assert created.total == len(rerun)
    assert Run.objects.count() == 3  # no duplicate for any fire time
    for name, run in runs.items():
        run.refresh_from_db()
        if name not in rerun:
            assert run.state == RunState.SUCCEEDED and run.backfill_id is None
            continue
        assert (run.state, run.backfill_id, run.lane, run.finished_at) == (
            RunState.RUNNING, created.pk, Lane.BACKFILL, None)
        tasks = {t.task: t for t in run.task_runs.all()}
        assert (tasks["extract"].state, tasks["extract"].due_at) == (TaskState.SCHEDULED, NOW)
        assert tasks["load"].state == TaskState.WAITING
    failed_extract = runs["failed"].task_runs.get(task="extract")
    # A fresh set of attempts on top of the used ones; the old attempt stays in the history.
    assert (failed_extract.attempts, failed_extract.max_attempts, failed_extract.error) == (2, 4, "")
    assert failed_extract.attempt_set.count() == 1


def test_a_workflow_without_schedule_is_backfilled_from_a_given_cron_expression():
    workflow = make_workflow("adhoc")
    with pytest.raises(BackfillError, match="has no schedule: give a cron expression") as caught:
        backfill.plan(workflow, day(1), day(2))
    assert caught.value.field == "schedule"
    created = backfill.start(workflow, day(1), day(2), expr="0 12 * * *", timezone="UTC", now=NOW)
    assert [r.logical_date for r in created.runs.order_by("logical_date")] == [day(1, 12)]
    assert Run.objects.get().schedule is None
    # Run again: the fire time has a run now, so there is nothing to do.
    with pytest.raises(BackfillError, match="already have a run"):
        backfill.start(workflow, day(1), day(2), expr="0 12 * * *", timezone="UTC", now=NOW)


@pytest.mark.parametrize(("call", "field", "message"), [
    (dict(start=day(5), end=day(1)), "end", "is before start"),
    (dict(start=day(1), end=datetime(2026, 1, 3)), "end", "has no timezone"),
    (dict(start=day(1), end=day(31), expr="0 * * * *"), "end", "more than 20 fire times"),
    (dict(expr="61 * * * *"), "cron", "minute field value 61 is out of range 0-59"),
    (dict(expr="0 * * * *", timezone="Mars/Olympus"), "timezone", "unknown timezone 'Mars/Olympus'"),
    (dict(reprocess="some"), "reprocess", "must be one of none, failed, all"),
    (dict(schedule="weekly"), "schedule", "has no schedule 'weekly' (its schedules: default)"),
    (dict(params={"n": "x"}), "params", "n: expected an integer"),
    (dict(workflow="nope"), "workflow", "unknown workflow 'nope'"),
])
def test_bad_requests_are_refused_with_a_clear_error_and_nothing_written(workflow, settings, call, field, message):
    settings.ORCHESTRATOR_MAX_BACKFILL_RUNS = 20
    arguments = {"workflow": workflow, "start": day(1), "end": day(3), **call}
    with pytest.raises(BackfillError) as caught:
        backfill.start(arguments.pop("workflow"), arguments.pop("start"), arguments.pop("end"), **arguments)
    assert caught.value.field == field
    assert message in str(caught.value)
    assert_nothing_written()


def test_a_workflow_with_several_schedules_needs_one_named(workflow):
    Schedule.objects.create(workflow=workflow, name="hourly", cron="0 * * * *")
    with pytest.raises(BackfillError, match=r"has 2 schedules \(default, hourly\): choose one"):
        backfill.plan(workflow, day(1), day(2))
    assert backfill.plan(workflow, day(1), day(1, 3), schedule="hourly").count == 4


# -- the command ------------------------------------------------------------------------------------


def test_the_command_dry_run_lists_fire_times_and_count_and_writes_nothing(workflow):
    out = StringIO()
    call_command("backfill", "etl", "--start", "2026-01-01", "--end", "2026-01-03", "--dry-run", stdout=out)
    text = out.getvalue()
    assert "2026-01-01T01:30:00+00:00" in text and "2026-01-03T01:30:00+00:00" in text  # --end: whole day
    assert "3 fire times: 3 new runs, 0 to re-run, 0 skipped (dry run: nothing written)" in text
    assert_nothing_written()


def test_the_command_creates_the_runs_with_a_progress_bar(workflow):
    out = StringIO()
    call_command("backfill", "etl", "--start", "2026-01-01T00:00", "--end", "2026-01-04", "--param", "n=3",
                 stdout=out)
    text = out.getvalue()
    assert "creating runs [##############################] 4/4" in text
    assert "4 runs in the backfill lane" in text
    assert all(r.params == {"n": 3} for r in Run.objects.all())
    assert Run.objects.filter(trigger="backfill").count() == 4


@pytest.mark.parametrize(("args", "message"), [
    (["--start", "2026-01-05", "--end", "2026-01-01"], "end: end 2026-01-01T23:59:59.999999+00:00 is before start"),
    (["--start", "yesterday", "--end", "2026-01-01"], "--start 'yesterday' is not a date"),
    (["--start", "2026-01-01", "--end", "2026-01-02", "--cron", "0 0 31 2 *"], "cron: invalid cron expression"),
])
def test_the_command_reports_bad_input_as_an_error_not_a_traceback(workflow, args, message):
    with pytest.raises(CommandError) as caught:
        call_command("backfill", "etl", *args, stdout=StringIO())
    assert message in str(caught.value)
    assert_nothing_written()


def test_the_admin_preview_shows_fire_times_in_the_zone_of_its_date_inputs_and_says_which(workflow, admin_client):
    # The user's clock is local, in Berlin: the admin shows times there; the backfill's date inputs
    # are read as UTC, and the preview shows the fire times in UTC too, each one labelled.
    admin_client.cookies[ZONE_COOKIE] = "Europe/Berlin"
    url = reverse("admin:orchestrator_workflow_backfill", args=[workflow.pk])
    html = admin_client.post(url, {"start": "2026-01-01T01:30", "end": "2026-01-02T01:30", "reprocess": "none",
                                   "preview": "1"}).content.decode()
    assert '<label for="id_start">from (UTC):</label>' in html
    fires = re.findall(r"<li>(<time[^>]*>[^<]*</time>.*?)</li>", re.search(r'id="preview-fires">(.*?)</ol>', html,
                                                                           re.S).group(1))
    assert fires == [
        '<time datetime="2026-01-01T01:30:00+00:00">2026-01-01 01:30:00 UTC</time>'
        ' <span class="help">2026-01-01 02:30 Europe/Berlin</span>',
        '<time datetime="2026-01-02T01:30:00+00:00">2026-01-02 01:30:00 UTC</time>'
        ' <span class="help">2026-01-02 02:30 Europe/Berlin</span>',
    ]
    assert "in UTC like the dates above (and in the schedule's zone, Europe/Berlin)" in html


# --- the workflow page's backfill dialog -----------------------------------------------------------


def test_an_operator_backfills_from_the_workflow_page_after_a_dry_run_and_it_is_recorded(workflow, client):
    client.force_login(make_user("olga", access.OPERATORS))
    page = client.get(reverse("orchestrator:web:workflow", args=["etl"])).content.decode()
    assert 'id="backfill-dialog"' in page and 'href="#backfill-dialog">Backfill…</a>' in page
    url = reverse("orchestrator:web:workflow_backfill", args=["etl"])
    values = {"start": "2026-01-01T01:30", "end": "2026-01-03T01:30", "reprocess": "none", "params": '{"n": 2}'}

    # The dry run: three runs, their fire times in UTC as the inputs are, nothing written.
    dry = client.post(url, {**values, "preview": "1"}, headers={"HX-Request": "true"})
    html = dry.content.decode()
    assert dry.status_code == 200 and html.lstrip().startswith('<section class="card backfill" id="backfill-dialog"')
    assert re.search(r'<b id="backfill-count">3</b>', html)
    assert re.findall(r"<li>([^<]*) UTC <span", html) == [f"2026-01-0{d} 01:30:00" for d in (1, 2, 3)]
    assert "2026-01-01 02:30 Europe/Berlin" in html
    assert_nothing_written()
    digest = re.search(r'name="confirm" value="(\w+)"', html).group(1)

    # Values edited after the preview: previewed again, not started.
    edited = client.post(url, {**values, "end": "2026-01-04T01:30", "confirm": digest, "go": "1"})
    assert re.search(r'<b id="backfill-count">4</b>', edited.content.decode())
    assert_nothing_written()

    started = client.post(url, {**values, "confirm": digest, "go": "1"}, headers={"HX-Request": "true"})
    assert started.status_code == 204 and started["HX-Redirect"] == "/runs/?workflow=etl&trigger=backfill"
    created = Backfill.objects.get()
    assert (created.total, Run.objects.filter(trigger=Trigger.BACKFILL).count()) == (3, 3)
    event = AuditEvent.objects.get(action="backfill")
    assert (event.actor_name, event.source, event.target_id) == ("olga", "ui", str(created.pk))
    assert event.detail == {"workflow": "etl", "start": "2026-01-01T01:30:00+00:00",
                            "end": "2026-01-03T01:30:00+00:00", "runs": 3, "reprocess": "none", "params": {"n": 2}}


def test_the_backfill_dialog_refuses_bad_values_with_their_field_and_viewers_get_none(workflow, client):
    client.force_login(make_user("olga", access.OPERATORS))
    url = reverse("orchestrator:web:workflow_backfill", args=["etl"])
    bad = client.post(url, {"start": "2026-01-05T00:00", "end": "2026-01-01T00:00", "reprocess": "none",
                            "params": '{"n": "many"}', "preview": "1"})
    html = bad.content.decode()
    assert bad.status_code == 400 and "must not be before the start" in html and "n: " in html
    assert "<html" in html  # without script: the dialog is a page of its own
    assert_nothing_written()
    client.force_login(make_user("vera", access.VIEWERS))
    assert 'id="backfill-dialog"' not in client.get(reverse("orchestrator:web:workflow", args=["etl"])).content.decode()
    assert client.post(url, {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00", "reprocess": "none",
                             "go": "1"}).status_code == 403
    assert_nothing_written()
