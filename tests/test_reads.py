"""One question, one answer: the web pages, the API and /metrics ask ``orchestrator.reads`` for
queue depths, the runs of a workflow and the dead-letter queue, so each gets the same answer, and
the lists read a page's worth of rows through their index however long the history."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import access, clock, reads
from orchestrator.models import Run, TaskRun, Workflow
from tests.support.api_support import client_for, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def web():
    client = Client()
    client.force_login(make_user("vera", access.VIEWERS))
    return client


@pytest.fixture
def api():
    return client_for(make_user("victor", access.VIEWERS))


def metrics(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}


def web_pages(client, path: str, cursor_key: str) -> list[int]:
    """Every row id of a web list, following its "older" links to the end."""
    ids, url = [], path
    for _ in range(100):
        response = client.get(url)
        assert response.status_code == 200
        rows = response.context["runs"] if "runs" in response.context else response.context["rows"]
        ids += [row.pk for row in rows]
        if not response.context["older_qs"]:
            return ids
        url = path.split("?")[0] + "?" + response.context["older_qs"]
        assert cursor_key in url
    raise AssertionError("more than 100 pages")


def api_pages(client, path: str) -> list[int]:
    """Every row id of an API list, following its "next" links to the end."""
    ids, url = [], path
    for _ in range(100):
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        ids += [row["id"] for row in body["results"]]
        if body["next"] is None:
            return ids
        url = body["next"]
    raise AssertionError("more than 100 pages")


# --- queue depth ---------------------------------------------------------------------------------


def test_the_dashboard_and_metrics_count_the_same_queue_depth(web):
    """Depth is what a worker could start now: queued, or scheduled and due. A task run scheduled
    for later, or with no due time (which no claim ever takes), is not in the queue yet."""
    now = clock.now()
    run = Run.objects.create(logical_date=now, trigger="job")
    for task, state, queue, due_at in [
        ("queued", "queued", "default", None), ("due", "scheduled", "default", now - timedelta(minutes=1)),
        ("later", "scheduled", "default", now + timedelta(hours=1)), ("no due time", "scheduled", "default", None),
        ("running", "running", "default", None),
        # A queue with nothing due yet.
        ("later too", "scheduled", "reports", now + timedelta(hours=1)), ("never", "scheduled", "reports", None),
    ]:
        TaskRun.objects.create(run=run, task=task, state=state, queue=queue, due_at=due_at)

    html = web.get(reverse("orchestrator:web:dashboard")).content.decode()
    dashboard = {queue: (int(due) + int(queued), int(running)) for queue, due, queued, running in re.findall(
        r'<tr><td><code>([^<]+)</code></td><td class="num">(\d+)</td><td class="num">(\d+)</td>'
        r'<td class="num">(\d+)</td></tr>', html)}
    samples = metrics(web)
    assert dashboard == {"default": (2, 1)}
    assert samples[("orchestrator_queue_depth", (("queue", "default"),))] == 2
    assert samples[("orchestrator_tasks_running", (("queue", "default"),))] == 1
    assert ("orchestrator_queue_depth", (("queue", "reports"),)) not in samples
    assert reads.queue_depths(now)["default"].waiting == 2


# --- runs of a workflow --------------------------------------------------------------------------


@pytest.fixture
def history():
    """Two workflows and jobs whose runs interleave, in every state."""
    now = clock.now()
    etl, other = Workflow.objects.create(name="etl"), Workflow.objects.create(name="other")
    states = ["succeeded", "failed", "running", "cancelled"]
    Run.objects.bulk_create([
        Run(workflow=[etl, other, None][i % 3], trigger="manual" if i % 3 < 2 else "job", state=states[i % 4],
            logical_date=now - timedelta(minutes=i))
        for i in range(160)
    ])
    return etl


def test_the_runs_list_and_the_api_list_the_same_runs_of_a_workflow(web, api, history):
    expected = list(Run.objects.filter(workflow=history).order_by("-id").values_list("id", flat=True))
    assert len(expected) > 50  # more than a page
    assert web_pages(web, "/runs/?workflow=etl", "before=") == expected
    assert api_pages(api, "/api/runs/?workflow=etl&limit=50") == expected
    assert api_pages(api, "/api/workflows/etl/runs/?limit=50") == expected
    failed = list(Run.objects.filter(workflow=history, state="failed").order_by("-id").values_list("id", flat=True))
    assert web_pages(web, "/runs/?workflow=etl&state=failed", "before=") == failed
    assert api_pages(api, "/api/runs/?workflow=etl&state=failed&limit=50") == failed


# --- the dead-letter queue -----------------------------------------------------------------------


def test_the_pages_the_api_and_metrics_list_and_count_the_same_dead_letters(web, api, history):
    """The last to die first, everywhere: a task run made later may have died earlier."""
    now = clock.now()
    runs = list(Run.objects.order_by("id")[:60])
    TaskRun.objects.bulk_create([
        TaskRun(run=run, task="t", state="dead", queue="default", error="boom",
                # Ids ascend while the times of death go back and forth.
                finished_at=now - timedelta(minutes=(i * 7) % 60))
        for i, run in enumerate(runs)
    ])
    expected = [tr.pk for tr in TaskRun.objects.filter(state="dead").order_by("-finished_at", "-id")]
    assert expected != sorted(expected, reverse=True)  # the order of death is not the order of ids
    assert web_pages(web, "/dead-letter/", "cursor=older.") == expected
    assert api_pages(api, "/api/dlq/?limit=50") == expected
    of_etl = [pk for pk in expected if TaskRun.objects.get(pk=pk).run.workflow_id == history.pk]
    assert web_pages(web, "/dead-letter/?workflow=etl", "cursor=") == of_etl
    assert api_pages(api, "/api/dlq/?workflow=etl&limit=50") == of_etl

    assert metrics(web)[("orchestrator_dead_letter_size", ())] == len(expected)
    assert web.get(reverse("orchestrator:web:dashboard")).context["dead"] == len(expected)


def test_a_web_dead_letter_cursor_that_is_not_one_is_named_and_the_rest_of_the_filters_apply(web, history):
    response = web.get("/dead-letter/?cursor=older.42&queue=default")
    assert response.status_code == 200
    assert "expected a cursor like" in response.content.decode()
    assert response.context["form"].errors.keys() == {"cursor"}


# --- the index behind each list --------------------------------------------------------------------


# A page: 50 rows and the one that tells whether another follows, and the few more an incremental
# sort reads to close the group of its last row's time.
PAGE_READ = 55


def plan_of(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        return cursor.fetchone()[0][0]["Plan"]


def reads_of(plan: dict, table: str) -> tuple[int, set[str]]:
    """Rows the plan read from ``table`` (returned or filtered out, over every loop), and the
    indexes it used for them (a bitmap scan names its index on the node below it)."""
    rows, indexes = 0, set()
    if plan.get("Relation Name") == table:
        rows += (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
                 + plan.get("Rows Removed by Index Recheck", 0)) * plan["Actual Loops"]
        if "Index Name" in plan:
            indexes.add(plan["Index Name"])
        indexes |= {child["Index Name"] for child in plan.get("Plans", []) if child["Node Type"] == "Bitmap Index Scan"}
    for child in plan.get("Plans", []):
        more, used = reads_of(child, table)
        rows, indexes = rows + more, indexes | used
    return rows, indexes


def list_query(client, url: str, table: str) -> str:
    """The SQL with which a page or an API answer read its list (the one ordered statement with a
    LIMIT on ``table``)."""
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    found = [q["sql"] for q in queries if re.search(rf'FROM "{table}"', q["sql"]) and "LIMIT" in q["sql"]
             and "ORDER BY" in q["sql"]]
    assert len(found) == 1, json.dumps([q["sql"] for q in queries], indent=1)
    return found[0]


RUNS = 20_000
SHARE = 50  # one run in fifty is etl's, one in fifty failed, one in fifty has a dead task run

# Written in one statement each: 20,000 rows through the ORM take seconds.
HISTORY_SQL = [
    """INSERT INTO orchestrator_run (workflow_id, logical_date, trigger, params, tenant, priority, lane, state,
                                     reason, payload_hash, created_at)
       SELECT CASE WHEN i %% %(share)s = 0 THEN %(etl)s ELSE %(busy)s END, %(now)s - i * interval '1 minute',
              'manual', '{}', 'default', 0, 0, CASE WHEN i %% %(share)s = 1 THEN 'failed' ELSE 'succeeded' END,
              '', '', %(now)s
         FROM generate_series(0, %(runs)s - 1) AS i""",
    """INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                         max_attempts, error, created_at, finished_at)
       SELECT r.id, 't', CASE WHEN r.id %% %(share)s = 2 THEN 'dead' ELSE 'succeeded' END, '{}', '{}', 'default',
              0, 'default', 0, 1, 1, '', %(now)s, %(now)s - (r.id * 7 %% %(runs)s) * interval '1 second'
         FROM orchestrator_run AS r""",
    "ANALYZE orchestrator_run, orchestrator_taskrun",
]


@pytest.fixture
def long_history():
    """A filter that keeps one row in fifty is where an index matters: walking the table by id
    would read fifty rows for each one shown, reading every match to sort them all 400."""
    etl, busy = Workflow.objects.create(name="etl"), Workflow.objects.create(name="busy")
    with connection.cursor() as cursor:
        for sql in HISTORY_SQL:
            cursor.execute(sql, {"share": SHARE, "etl": etl.pk, "busy": busy.pk, "now": clock.now(), "runs": RUNS})
    return sorted(Run.objects.values_list("id", flat=True))


RUN_PAGES = [
    ("/runs/?workflow=etl", "run_of_workflow"),
    ("/runs/?workflow=etl&before={middle}", "run_of_workflow"),
    ("/api/runs/?workflow=etl", "run_of_workflow"),
    ("/api/runs/?workflow=etl&cursor=older.{middle}", "run_of_workflow"),
    ("/api/workflows/etl/runs/?cursor=older.{middle}", "run_of_workflow"),
    ("/runs/?state=failed", "run_by_state"),
    ("/runs/?state=failed&before={middle}", "run_by_state"),
    ("/api/runs/?state=failed&cursor=older.{middle}", "run_by_state"),
]
DEAD_LETTER_PAGES = ["/dead-letter/", "/api/dlq/", "/dead-letter/?cursor={cursor}", "/api/dlq/?cursor={cursor}"]


def test_a_page_of_a_list_reads_a_page_of_rows_through_its_index(web, api, long_history):
    """The runs of one workflow or state through the index that leads with it, the dead-letter
    queue (from its first page or a cursor deep inside it) through the index of the dead, in the
    order of death: a page reads about a page of rows, wherever it is in the list."""
    middle = long_history[RUNS // 2]
    for url, index in RUN_PAGES:
        client = api if url.startswith("/api/") else web
        plan = plan_of(list_query(client, url.format(middle=middle), "orchestrator_run"))
        rows, indexes = reads_of(plan, "orchestrator_run")
        assert indexes == {index}, f"{url}: {json.dumps(plan, indent=1)}"
        assert rows <= PAGE_READ, f"{rows} rows read of {RUNS:,} for {url}"

    deep = TaskRun.objects.filter(state="dead").order_by("-finished_at", "-id")[100]
    cursor = reads.DEAD_LETTER_ORDER.text(reads.Cursor(True, reads.DEAD_LETTER_ORDER.key(deep)))
    for url in DEAD_LETTER_PAGES:
        client = api if url.startswith("/api/") else web
        plan = plan_of(list_query(client, url.format(cursor=cursor), "orchestrator_taskrun"))
        rows, indexes = reads_of(plan, "orchestrator_taskrun")
        assert indexes == {"taskrun_dead"}, f"{url}: {json.dumps(plan, indent=1)}"
        assert rows <= PAGE_READ, f"{rows} rows read of {RUNS // SHARE} dead for {url}"
