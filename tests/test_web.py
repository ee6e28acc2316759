"""The web pages through Django's test client: what each page shows, who may see and do what,
and bad input answered with an error next to the field while nothing is created."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access, clock, conf
from orchestrator.clock import FakeClock
from orchestrator.models import (
    Attempt,
    Lease,
    Run,
    RunState,
    Schedule,
    TaskRun,
    TaskState,
    Worker,
    Workflow,
)
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from tests.conftest import daily_fire_times

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def log_storage(settings, tmp_path):
    settings.ORCHESTRATOR_LOG_STORAGE_OPTIONS = {"location": str(tmp_path / "logs")}


@pytest.fixture
def workflows():
    sync_workflows()
    return {wf.name: wf for wf in Workflow.objects.select_related("current_version")}


@pytest.fixture
def etl(workflows):
    return workflows["nightly_etl"]


def _user(name, group=None):
    user = User.objects.create_user(name, password="pw-" + name)
    if group:
        access.add_to_group(user, group)
    return user


@pytest.fixture
def operator(client):
    return _user("olivia", access.OPERATORS)


@pytest.fixture
def viewer():
    return _user("victor", access.VIEWERS)


@pytest.fixture
def as_operator(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def as_viewer(client, viewer):
    client.force_login(viewer)
    return client


def finished_run(wf, state=RunState.SUCCEEDED, task_state=TaskState.SUCCEEDED, seconds=12.0, error=""):
    """A run whose every task ended in ``task_state``, each with one attempt."""
    run, _ = create_run(wf, trigger="manual")
    start = clock.now() - timedelta(minutes=5)
    end = start + timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(state=state, started_at=start, finished_at=end)
    TaskRun.objects.filter(run=run).update(state=task_state, attempts=1, started_at=start, finished_at=end,
                                           error=error)
    for tr in TaskRun.objects.filter(run=run):
        Attempt.objects.create(task_run=tr, number=1, started_at=start, finished_at=end,
                               outcome="succeeded" if task_state == TaskState.SUCCEEDED else "failed", error=error)
    run.refresh_from_db()
    return run


def dead_task_run(wf, error="ValueError: the upstream API said no"):
    run, _ = create_run(wf, trigger="manual")
    now = clock.now()
    tr = TaskRun.objects.filter(run=run, upstream=[]).first()
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.DEAD, attempts=1, error=error, started_at=now,
                                            finished_at=now)
    Attempt.objects.create(task_run=tr, number=1, started_at=now, finished_at=now, outcome="failed", error=error)
    tr.refresh_from_db()
    return tr


def page_urls(run, task_run, attempt, wf):
    return [
        reverse("orchestrator:web:dashboard"),
        reverse("orchestrator:web:workflows"),
        reverse("orchestrator:web:workflow", args=[wf.name]),
        reverse("orchestrator:web:runs"),
        reverse("orchestrator:web:run", args=[run.pk]),
        reverse("orchestrator:web:task_run", args=[task_run.pk]),
        reverse("orchestrator:web:attempt_log", args=[attempt.pk]),
        reverse("orchestrator:web:attempt_log_download", args=[attempt.pk]),
        reverse("orchestrator:web:dead_letter"),
    ]


# ---------------------------------------------------------------- access


@pytest.mark.time_sensitive
def test_every_page_sends_anonymous_visitors_to_the_login_page(client, etl):
    run = finished_run(etl)
    tr = run.task_runs.first()
    for url in page_urls(run, tr, tr.attempt_set.first(), etl):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("orchestrator:web:login") + "?next="), url
    response = client.post(reverse("orchestrator:web:workflow_trigger", args=[etl.name]), {})
    assert response.status_code == 302
    assert not Run.objects.exclude(pk=run.pk).exists()


@pytest.mark.time_sensitive
def test_a_user_in_neither_group_is_refused_every_page(client, etl):
    run = finished_run(etl)
    tr = run.task_runs.first()
    client.force_login(_user("nora"))
    for url in page_urls(run, tr, tr.attempt_set.first(), etl):
        assert client.get(url).status_code == 403, url


@pytest.mark.time_sensitive
def test_a_viewer_reads_every_page_without_action_buttons(as_viewer, etl):
    run = finished_run(etl)
    tr = run.task_runs.first()
    dead_task_run(etl)
    for url in page_urls(run, tr, tr.attempt_set.first(), etl):
        assert as_viewer.get(url, follow=True).status_code == 200, url
    workflow_page = as_viewer.get(reverse("orchestrator:web:workflow", args=[etl.name])).content.decode()
    assert "Only operators can trigger runs." in workflow_page
    assert 'action="/workflows/nightly_etl/trigger/"' not in workflow_page
    assert 'name="action" value="retry"' not in as_viewer.get(reverse("orchestrator:web:dead_letter")).content.decode()


@pytest.mark.time_sensitive
def test_every_post_of_a_viewer_is_refused_and_changes_nothing(as_viewer, etl):
    run, _ = create_run(etl, trigger="manual")
    dead = dead_task_run(etl)
    runs_before = Run.objects.count()
    posts = [
        (reverse("orchestrator:web:workflow_trigger", args=[etl.name]), {"param.orders": "3"}),
        (reverse("orchestrator:web:workflow_pause", args=[etl.name]), {}),
        (reverse("orchestrator:web:run_cancel", args=[run.pk]), {}),
        (reverse("orchestrator:web:run_retry", args=[dead.run_id]), {}),
        (reverse("orchestrator:web:dead_letter"), {"action": "retry", "ids": [dead.pk], "confirmed": "on"}),
        (reverse("orchestrator:web:dead_letter"), {"action": "discard", "ids": [dead.pk], "confirmed": "on"}),
    ]
    for url, data in posts:
        assert as_viewer.post(url, data).status_code == 403, url
    assert Run.objects.count() == runs_before
    run.refresh_from_db()
    dead.refresh_from_db()
    etl.refresh_from_db()
    assert (run.state, dead.state, etl.paused) == (RunState.RUNNING, TaskState.DEAD, False)


@pytest.mark.time_sensitive
def test_posts_without_a_csrf_token_are_refused(client, operator, etl):
    client = type(client)(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(reverse("orchestrator:web:workflow_trigger", args=[etl.name]), {})
    assert response.status_code == 403
    assert not Run.objects.exists()


@pytest.mark.time_sensitive
def test_logging_in_and_out(client, operator, etl):
    page = client.get(reverse("orchestrator:web:login"))
    assert page.status_code == 200 and b'name="password"' in page.content
    wrong = client.post(reverse("orchestrator:web:login"), {"username": "olivia", "password": "nope"})
    assert wrong.status_code == 200 and b"Please enter a correct username and password" in wrong.content
    right = client.post(reverse("orchestrator:web:login"), {"username": "olivia", "password": "pw-olivia",
                                               "next": "/workflows/"})
    assert right.status_code == 302 and right["Location"] == "/workflows/"
    assert client.get("/workflows/").status_code == 200
    client.post(reverse("orchestrator:web:logout"))
    assert client.get("/workflows/").status_code == 302


# ---------------------------------------------------------------- pages


@pytest.mark.time_sensitive
def test_the_dashboard_shows_run_states_queues_workers_leader_and_dead_letters(as_viewer, etl):
    finished_run(etl)
    finished_run(etl, state=RunState.FAILED, task_state=TaskState.FAILED)
    dead_task_run(etl)
    run, _ = create_run(etl, trigger="manual")
    TaskRun.objects.filter(run=run, upstream=[]).update(state=TaskState.QUEUED, queue="batch")
    now = clock.now()
    Worker.objects.create(name="host-a:4242", host="host-a", pid=4242, queues=["default", "batch"], concurrency=4,
                          started_at=now, heartbeat_at=now - timedelta(seconds=3))
    Lease.objects.create(name="scheduler", holder="host-b:77", epoch=5, acquired_at=now,
                         expires_at=now + timedelta(seconds=15))
    Run.objects.filter(pk=run.pk).update(schedule_delay=1.5, started_at=now)
    html = as_viewer.get(reverse("orchestrator:web:dashboard")).content.decode()
    assert "host-a:4242" in html and "host-b:77" in html and "epoch 5" in html
    assert re.search(r'<b>1</b><span>in the dead-letter queue', html)
    assert re.search(r'<b>1</b><span>failed, last 24 h', html)
    assert re.search(r"<code>batch</code></td><td class=\"num\">0</td><td class=\"num\">1</td>", html)
    assert "1.50 s" in html  # the p50 schedule delay of the one scheduled run of the last hour
    partial = as_viewer.get(reverse("orchestrator:web:dashboard"), headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="stats"') and "<html" not in partial


@pytest.mark.time_sensitive
def test_the_workflows_list_shows_schedules_in_words_next_fire_times_and_recent_run_states(as_viewer, workflows):
    etl = workflows["nightly_etl"]
    finished_run(etl)
    finished_run(etl, state=RunState.FAILED, task_state=TaskState.FAILED)
    broken = Workflow.objects.create(name="half_done", broken=True, sync_error="tasks.load: unknown upstream 'nope'")
    html = as_viewer.get(reverse("orchestrator:web:workflows")).content.decode()
    assert "every day at 02:30" in html and "30 2 * * *" in html and "Europe/Berlin" in html
    assert html.count('class="sq st-succeeded"') == 1 and html.count('class="sq st-failed"') == 1
    assert broken.name in html and "unknown upstream &#x27;nope&#x27;" in html
    # the next three fire times of the nightly ETL, from the (pinned) clock: 02:30 in Berlin
    row = next(part for part in html.split("<tr") if f'href="{reverse("orchestrator:web:workflow", args=[etl.name])}"' in part)
    shown = re.findall(r'<time datetime="([^"]+)"', row)
    assert shown == [at.isoformat().replace("+00:00", "Z") for at in daily_fire_times(2, 30, "Europe/Berlin", clock.now(), 3)]



@pytest.mark.time_sensitive
def test_the_workflow_page_draws_the_graph_the_grid_the_history_and_the_trigger_form(as_viewer, etl):
    runs = [finished_run(etl), finished_run(etl, state=RunState.FAILED, task_state=TaskState.FAILED)]
    html = as_viewer.get(reverse("orchestrator:web:workflow", args=[etl.name])).content.decode()
    # the graph: one node per task, coloured by the latest run's states, in topological layers
    assert html.count('<g class="node st-failed">') == 6
    xs = {name: int(x) for x, name in re.findall(r'<rect x="(\d+)" y="\d+" width="168"[^>]*/><circle[^>]*/>'
                                                  r'<text[^>]*>([a-z_]+)</text>', html)}
    assert xs["extract"] < xs["transform_emea"] == xs["transform_apac"] < xs["load"] < xs["publish_report"]
    # the grid: a cell per task run, linking to it
    for run in runs:
        for tr in run.task_runs.all():
            assert f'href="/task-runs/{tr.pk}/"' in html
    assert html.count('class="cell st-succeeded"') == 6 and html.count('class="cell st-failed"') == 6
    assert "50% of the last 2 finished runs succeeded" in html
    assert html.count('<rect class="bar st-') == 2
    assert html.count("<li><time datetime=") == 5  # the next five fire times
    assert 'name="param.currency"' not in html  # a viewer gets no form
    selected = as_viewer.get(reverse("orchestrator:web:workflow", args=[etl.name]) + f"?run={runs[0].pk}").content.decode()
    assert selected.count('<g class="node st-succeeded">') == 6


@pytest.mark.time_sensitive
def test_the_workflow_page_lists_the_fire_times_not_run_with_their_reasons(as_viewer, etl):
    from orchestrator.scheduler import Scheduler

    # The scheduler was away for three days: catchup=latest runs the latest fire time and records
    # the two before it as skipped, with the reason.
    schedule = etl.schedules.get()
    missed = [at for at in daily_fire_times(2, 30, "Europe/Berlin", clock.now() - timedelta(days=3), 4)
              if at <= clock.now()]
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=missed[0])
    Scheduler(clock=FakeClock(clock.now()), holder="test", maintenance=[]).tick()
    skipped = list(Run.objects.filter(schedule=schedule, state=RunState.SKIPPED).order_by("logical_date"))
    assert [run.logical_date for run in skipped] == missed[:-1]
    html = as_viewer.get(reverse("orchestrator:web:workflow", args=[etl.name])).content.decode()
    assert f"Fire times not run <small class=\"muted\">{len(skipped)} in the last 24 h" in html
    for run in skipped:
        assert f'href="{reverse("orchestrator:web:run", args=[run.pk])}"' in html
    assert html.count("catchup=latest runs only the most recent missed fire time") == len(skipped)


@pytest.mark.time_sensitive
def test_an_operator_triggers_a_run_with_params_from_the_form(as_operator, operator, etl):
    page = as_operator.get(reverse("orchestrator:web:workflow", args=[etl.name])).content.decode()
    assert 'name="param.orders"' in page and 'name="param.currency"' in page and 'name="param.dry_run"' in page
    response = as_operator.post(reverse("orchestrator:web:workflow_trigger", args=[etl.name]), {
        "param.orders": "25", "param.currency": "USD", "param.dry_run": "true", "param.dry_run.present": "1",
    })
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("orchestrator:web:run", args=[run.pk])
    assert run.params == {"orders": 25, "currency": "USD", "dry_run": True}
    assert (run.trigger, run.created_by) == ("manual", operator)
    assert run.task_runs.count() == 6


@pytest.mark.time_sensitive
def test_a_trigger_with_a_wrong_type_or_an_unknown_param_shows_the_error_and_creates_nothing(as_operator, etl):
    url = reverse("orchestrator:web:workflow_trigger", args=[etl.name])
    response = as_operator.post(url, {"param.orders": "many", "param.currency": "GBP", "param.dry_run.present": "1"})
    html = response.content.decode()
    assert response.status_code == 400
    assert '<span class="error field-error" id="e-orders">expected an integer, got &quot;many&quot;</span>' in html
    assert 'id="e-currency">&quot;GBP&quot; is not one of [&quot;EUR&quot;, &quot;USD&quot;]' in html
    assert 'value="many"' in html  # what was typed stays in the field
    response = as_operator.post(url, {"param.orders": "5", "param.colour": "<b>red</b>"})
    html = response.content.decode()
    assert response.status_code == 400
    assert "<code>colour</code>: unknown param &#x27;colour&#x27;" in html
    assert "<b>red</b>" not in html
    assert not Run.objects.exists()


@pytest.mark.time_sensitive
def test_an_unchecked_box_sends_false_and_empty_fields_use_their_defaults(as_operator, etl):
    as_operator.post(reverse("orchestrator:web:workflow_trigger", args=[etl.name]), {
        "param.orders": "", "param.currency": "EUR", "param.dry_run.present": "1",
    })
    assert Run.objects.get().params == {"orders": 500, "currency": "EUR", "dry_run": False}


@pytest.mark.time_sensitive
def test_the_run_page_polls_while_the_run_is_active_and_stops_when_it_ends(as_viewer, etl):
    run, _ = create_run(etl, trigger="manual")
    url = reverse("orchestrator:web:run", args=[run.pk])
    html = as_viewer.get(url).content.decode()
    assert f'hx-get="{url}" hx-trigger="every 2s"' in html
    assert html.count('<td><span class="st st-scheduled">') == 1 and html.count('<td><span class="st st-waiting">') == 5
    partial = as_viewer.get(url, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="live"') and "<html" not in partial
    done = finished_run(etl)
    html = as_viewer.get(reverse("orchestrator:web:run", args=[done.pk])).content.decode()
    assert "hx-trigger" not in html.split('<div id="live"')[1].split(">")[0]
    assert html.count('class="bar out-succeeded"') == 6  # the timeline: one bar per attempt
    assert "12.0 s" in html


@pytest.mark.time_sensitive
def test_an_operator_cancels_an_active_run_and_retries_a_failed_one(as_operator, etl):
    run, _ = create_run(etl, trigger="manual")
    page = as_operator.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert "Cancel run" in page
    response = as_operator.post(reverse("orchestrator:web:run_cancel", args=[run.pk]), headers={"HX-Request": "true"})
    assert response.status_code == 204 and response["HX-Redirect"] == reverse("orchestrator:web:run", args=[run.pk])
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert set(run.task_runs.values_list("state", flat=True)) == {TaskState.CANCELLED}

    dead = dead_task_run(etl)
    Run.objects.filter(pk=dead.run_id).update(state=RunState.FAILED, finished_at=clock.now())
    page = as_operator.get(reverse("orchestrator:web:run", args=[dead.run_id])).content.decode()
    assert "Retry failed tasks" in page
    response = as_operator.post(reverse("orchestrator:web:run_retry", args=[dead.run_id]))
    assert response.status_code == 302
    dead.refresh_from_db()
    assert dead.state in (TaskState.SCHEDULED, TaskState.QUEUED)
    assert Run.objects.get(pk=dead.run_id).state == RunState.RUNNING


@pytest.mark.time_sensitive
def test_the_task_run_page_escapes_what_a_task_printed_and_pages_a_long_log(as_viewer, etl):
    from orchestrator import logs
    from orchestrator.web import task_runs

    run = finished_run(etl, state=RunState.FAILED, task_state=TaskState.DEAD, error="<script>alert(1)</script>")
    tr = run.task_runs.get(task="extract")
    attempt = tr.attempt_set.get()
    line = "row <script>alert('x')</script> done\n"
    body = line * (task_runs.LOG_PAGE // len(line) + 50)
    conf.log_storage().save(logs.attempt_log_name(attempt), ContentFile(body.encode()))
    html = as_viewer.get(reverse("orchestrator:web:task_run", args=[tr.pk])).content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "row &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; done" in html
    assert "load the next 64 KB" in html  # a long log is paged, not loaded whole
    first_page = html.count("done\n")
    assert first_page < body.count("\n")
    next_offset = int(re.search(r"\?offset=(\d+)", html).group(1))
    chunk = as_viewer.get(reverse("orchestrator:web:attempt_log", args=[attempt.pk]) + f"?offset={next_offset}",
                          headers={"HX-Request": "true"}).content.decode()
    assert first_page + chunk.count("done\n") == body.count("\n")
    assert "load the next" not in chunk and "<script>alert" not in chunk
    download = as_viewer.get(reverse("orchestrator:web:attempt_log_download", args=[attempt.pk]))
    assert download["Content-Disposition"].startswith("attachment")
    assert b"".join(download.streaming_content).decode() == body
    bad = as_viewer.get(reverse("orchestrator:web:attempt_log", args=[attempt.pk]) + "?offset=-5")
    assert bad.status_code == 400


@pytest.mark.time_sensitive
def test_the_log_of_a_running_attempt_follows_its_tail(as_viewer, etl):
    from orchestrator import logs

    run, _ = create_run(etl, trigger="manual")
    tr = run.task_runs.get(task="extract")
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.RUNNING, attempts=1)
    attempt = Attempt.objects.create(task_run=tr, number=1, started_at=clock.now())
    conf.log_storage().save(logs.attempt_log_name(attempt), ContentFile(b"starting\n"))
    html = as_viewer.get(reverse("orchestrator:web:task_run", args=[tr.pk])).content.decode()
    assert "starting" in html
    assert (f'<span class="log-follow" hx-get="/attempts/{attempt.pk}/log/?offset=9" hx-trigger="every 2s"'
            in html)
    Attempt.objects.filter(pk=attempt.pk).update(outcome="succeeded", finished_at=clock.now())
    tail = as_viewer.get(f"/attempts/{attempt.pk}/log/?offset=9", headers={"HX-Request": "true"}).content.decode()
    assert "log-follow" not in tail  # the attempt ended: the page stops asking


@pytest.mark.time_sensitive
def test_the_dead_letter_queue_filters_and_retries_only_after_confirmation(as_operator, workflows):
    etl, maintenance = workflows["nightly_etl"], workflows["maintenance"]
    timeout = dead_task_run(etl, error="TimeoutError: the warehouse did not answer")
    refused = dead_task_run(maintenance, error="PermissionError: /scratch is read-only")
    html = as_operator.get(reverse("orchestrator:web:dead_letter")).content.decode()
    assert "the warehouse did not answer" in html and "/scratch is read-only" in html
    only = as_operator.get(reverse("orchestrator:web:dead_letter") + "?error=warehouse").content.decode()
    assert "warehouse" in only and "read-only" not in only
    only = as_operator.get(reverse("orchestrator:web:dead_letter") + "?workflow=maintenance").content.decode()
    assert "warehouse" not in only and "read-only" in only
    bad = as_operator.get(reverse("orchestrator:web:dead_letter") + "?since=yesterday")
    assert bad.status_code == 200 and b"Enter a valid date." in bad.content

    ask = as_operator.post(reverse("orchestrator:web:dead_letter"), {"action": "retry", "ids": [timeout.pk, refused.pk]})
    assert ask.status_code == 200 and b"Retry 2 dead task runs?" in ask.content
    assert TaskRun.objects.filter(state=TaskState.DEAD).count() == 2  # nothing happened yet
    done = as_operator.post(reverse("orchestrator:web:dead_letter"), {"action": "retry", "ids": [timeout.pk], "confirmed": "on"})
    assert done.status_code == 302
    assert TaskRun.objects.get(pk=timeout.pk).state in (TaskState.SCHEDULED, TaskState.QUEUED)

    as_operator.post(reverse("orchestrator:web:dead_letter"), {"action": "discard", "ids": [refused.pk], "confirmed": "on"})
    assert TaskRun.objects.get(pk=refused.pk).state == TaskState.FAILED
    empty = as_operator.post(reverse("orchestrator:web:dead_letter"), {"action": "retry"}, follow=True)
    assert b"Select at least one task run." in empty.content
    # An id that is no id (a superscript digit, past a bigint) is refused as one, nothing changed.
    for odd in ("\u00b2", "99999999999999999999", "0"):
        refused_id = as_operator.post(reverse("orchestrator:web:dead_letter"),
                                      {"action": "retry", "ids": [odd], "confirmed": "on"}, follow=True)
        assert refused_id.status_code < 500 and b"Select at least one task run." not in refused_id.content, odd
    assert TaskRun.objects.get(pk=refused.pk).state == TaskState.FAILED


@pytest.mark.time_sensitive
def test_the_runs_list_filters_and_pages_by_id_without_offset(as_viewer, workflows, settings):
    etl, maintenance = workflows["nightly_etl"], workflows["maintenance"]
    ids = [create_run(etl, trigger="manual", logical_date=datetime(2026, 3, 1, 2, 30, tzinfo=UTC)
                      + timedelta(days=i))[0].pk for i in range(60)]
    other, _ = create_run(maintenance, trigger="api", logical_date=datetime(2026, 1, 1, tzinfo=UTC))
    url = reverse("orchestrator:web:runs")
    with CaptureQueriesContext(connection) as queries:
        first = as_viewer.get(url).content.decode()
    assert not any("OFFSET" in q["sql"].upper() for q in queries.captured_queries)
    listed = [int(x) for x in re.findall(r'<a href="/runs/(\d+)/">#', first)]
    assert listed == sorted([*ids, other.pk], reverse=True)[:50]
    older = re.search(r'href="\?([^"]*before=\d+)"', first).group(1).replace("&amp;", "&")
    second = as_viewer.get(f"{url}?{older}").content.decode()
    rest = [int(x) for x in re.findall(r'<a href="/runs/(\d+)/">#', second)]
    assert rest == sorted([*ids, other.pk], reverse=True)[50:]
    assert 'id="older"' not in second and "newer" in second
    newer = re.search(r'href="\?([^"]*after=\d+)"', second).group(1).replace("&amp;", "&")
    back = [int(x) for x in re.findall(r'<a href="/runs/(\d+)/">#', as_viewer.get(f"{url}?{newer}").content.decode())]
    assert back == listed

    only_api = as_viewer.get(f"{url}?trigger=api").content.decode()
    assert re.findall(r'<a href="/runs/(\d+)/">#', only_api) == [str(other.pk)]
    by_date = as_viewer.get(f"{url}?workflow=nightly_etl&since=2026-03-05&until=2026-03-06").content.decode()
    assert [int(x) for x in re.findall(r'<a href="/runs/(\d+)/">#', by_date)] == [ids[5], ids[4]]
    bad = as_viewer.get(f"{url}?state=exploded&before=abc")
    assert bad.status_code == 200
    assert b"Select a valid choice. exploded is not one of the available choices." in bad.content
    assert b"Enter a whole number." in bad.content


@pytest.mark.time_sensitive
def test_pausing_and_resuming_a_workflow_from_the_list(as_operator, etl):
    response = as_operator.post(reverse("orchestrator:web:workflow_pause", args=[etl.name]), {"next": "/workflows/"})
    assert response.status_code == 302 and response["Location"] == "/workflows/"
    etl.refresh_from_db()
    assert etl.paused
    assert b'<span class="tag paused">paused</span>' in as_operator.get("/workflows/").content
    response = as_operator.post(reverse("orchestrator:web:workflow_resume", args=[etl.name]), {"next": "https://evil.example/"})
    assert response["Location"] == reverse("orchestrator:web:workflow", args=[etl.name])  # no open redirect
    etl.refresh_from_db()
    assert not etl.paused


@pytest.mark.time_sensitive
def test_the_page_benchmark_fills_a_history_and_times_every_page():
    import io

    from orchestrator.bench import pages as bench_pages

    out = io.StringIO()
    results = bench_pages.run(out, runs=3000, repeat=2, big=1000)
    # And two runs of 1,000 task runs, and 3,000 runs of last year for the calendar.
    history = Run.objects.exclude(workflow__name__startswith="bench_big_").exclude(workflow__name="bench_calendar")
    assert history.count() == 3000
    assert history.filter(state=RunState.FAILED).count() == 3000 // 49  # about one in fifty
    assert "pages: runs of 1,000 task runs" in out.getvalue()
    assert Run.objects.filter(workflow__name="nightly_etl", trigger="manual").exists()
    assert TaskRun.objects.filter(run__in=history, state=TaskState.DEAD).count() == 1
    assert results["runs list, first page"]["median_ms"] > 0
    assert "workflow grid (25 runs x tasks)" in out.getvalue()
    assert results["calendar, first view"]["min_ms"] > 0 and "calendar, kept (3,000 runs)" in out.getvalue()
    assert Run.objects.filter(workflow__name="bench_calendar").count() == 3000
    assert all(key in results for key in ("plan first page", "plan keyset page", "plan grid runs"))


@pytest.mark.time_sensitive
def test_a_workflow_without_a_valid_version_shows_why_and_refuses_a_trigger(as_operator, workflows):
    broken = Workflow.objects.create(name="half_done", broken=True,
                                     sync_error="workflow 'half_done': tasks.load: unknown upstream 'nope'")
    html = as_operator.get(reverse("orchestrator:web:workflow", args=[broken.name])).content.decode()
    assert "The last sync found errors" in html and "unknown upstream &#x27;nope&#x27;" in html
    assert "This workflow has no tasks." in html
    response = as_operator.post(reverse("orchestrator:web:workflow_trigger", args=[broken.name]), {})
    assert response.status_code == 400
    assert b"cannot run: workflow &#x27;half_done&#x27;: tasks.load" in response.content
    assert not Run.objects.exists()
    assert as_operator.get(reverse("orchestrator:web:workflow", args=["no_such_workflow"])).status_code == 404
    assert as_operator.get(reverse("orchestrator:web:run", args=[987654])).status_code == 404
