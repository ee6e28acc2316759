"""The result tab of a task run: what the task returned as pretty JSON, in parts for a big value
(only a part travels from the database), the instances' results of a mapped task 50 at a time,
and a clear answer for a task run without a result or a bad page number."""

from __future__ import annotations

import html

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access
from orchestrator.models import TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.web import results
from tests.test_grid import user

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    sync_workflows()
    client.force_login(user("victor", access.VIEWERS))
    return client


def tab(client, tr, query=""):
    response = client.get(reverse("orchestrator:web:task_run_result", args=[tr.pk]) + query)
    return response.status_code, html.unescape(response.content.decode())


def test_the_result_tab_shows_what_the_task_returned_escaped(viewer):
    run, _ = create_run(Workflow.objects.get(name="nightly_etl"), trigger="manual")
    tr = TaskRun.objects.filter(run=run).first()
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.SUCCEEDED, result={"rows": 3, "note": "<b>ok</b>"})
    status, page = tab(viewer, tr)
    assert status == 200
    assert '"rows": 3' in page and '"note": "<b>ok</b>"' in page  # as text, unescaped only here
    raw = viewer.get(reverse("orchestrator:web:task_run_result", args=[tr.pk])).content.decode()
    assert "<b>ok</b>" not in raw
    # The task-run page links to it.
    detail = viewer.get(reverse("orchestrator:web:task_run", args=[tr.pk])).content.decode()
    assert 'id="result-tab"' in detail


def test_no_result_is_said_plainly(viewer):
    run, _ = create_run(Workflow.objects.get(name="nightly_etl"), trigger="manual")
    tr = TaskRun.objects.filter(run=run).first()
    status, page = tab(viewer, tr)
    assert status == 200 and "a result is recorded when it succeeds" in page
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.SUCCEEDED, result=None)
    assert "The task returned nothing (None)." in tab(viewer, tr)[1]


def test_a_big_result_is_shown_in_parts_and_only_a_part_is_read(viewer):
    run, _ = create_run(Workflow.objects.get(name="nightly_etl"), trigger="manual")
    tr = TaskRun.objects.filter(run=run).first()
    big = {"rows": [{"id": i, "name": f"row {i:06d}"} for i in range(20_000)]}
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.SUCCEEDED, result=big)

    with CaptureQueriesContext(connection) as queries:
        status, page = tab(viewer, tr)
    assert status == 200
    whole = results.result_page(tr.pk, 0, 10**9)
    assert whole.length > 30 * results.PAGE_CHARS
    assert f"JSON, {whole.length} characters, characters 1–{results.PAGE_CHARS} shown" in page
    assert whole.text[: results.PAGE_CHARS] in page and whole.text[results.PAGE_CHARS: results.PAGE_CHARS + 50] not in page
    # The page read one part of the value, not all of it (the rest stayed in the database).
    assert len(page.encode()) < 3 * results.PAGE_CHARS
    assert not any("SELECT" in q["sql"] and '"result"' in q["sql"] and "jsonb_pretty" not in q["sql"]
                   for q in queries.captured_queries)

    # The next part starts where this one ended; the last part has no next link.
    status, page = tab(viewer, tr, f"?offset={results.PAGE_CHARS}")
    assert whole.text[results.PAGE_CHARS: 2 * results.PAGE_CHARS] in page and 'id="result-previous"' in page
    last = (whole.length - 1) // results.PAGE_CHARS * results.PAGE_CHARS
    status, page = tab(viewer, tr, f"?offset={last}")
    assert whole.text[last:] in page and 'id="result-next"' not in page
    # Past the end, or not a number: a 400 that names the offset.
    assert tab(viewer, tr, f"?offset={whole.length + 5}")[0] == 400
    status, page = tab(viewer, tr, "?offset=lots")
    assert status == 400 and "offset" in page


def test_a_mapped_task_lists_its_instances_results_fifty_at_a_time(viewer):
    sales = Workflow.objects.get(name="regional_sales")
    run, _ = create_run(sales, trigger="manual")
    parent = TaskRun.objects.get(run=run, task="summarize", map_index=-1)
    spec = parent.spec
    TaskRun.objects.bulk_create([
        TaskRun(run=run, task="summarize", map_index=i, spec=spec, state=TaskState.SUCCEEDED,
                result={"region": f"r{i}", "total": i}) for i in range(120)])
    status, page = tab(viewer, parent)
    assert status == 200 and "Results of the instances" in page
    # Each instance's value as PostgreSQL writes JSON (its own key order).
    assert '{"total": 0, "region": "r0"}' in page and '{"total": 49, "region": "r49"}' in page
    assert '"r50"' not in page and 'href="?after=49"' in page
    page = tab(viewer, parent, "?after=99")[1]
    assert '"r100"' in page and '"r119"' in page and '"r99"' not in page and 'id="next-instances"' not in page
    # Each instance links to its own result tab.
    one = TaskRun.objects.get(run=run, task="summarize", map_index=7)
    assert reverse("orchestrator:web:task_run_result", args=[one.pk]) in page or \
        reverse("orchestrator:web:task_run_result", args=[one.pk]) in tab(viewer, parent)[1]
    assert '"region": "r7"' in tab(viewer, one)[1]
