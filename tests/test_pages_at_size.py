"""A run of 100,000 task runs costs its page and the API what a run of 1,000 does: the same
statements, each returning a bounded number of rows, and answers of bounded size. Distinct tasks
(a 100,000-task graph) and a map over 100,000 items, each made by one set-based INSERT
(``bench.pages.fill_run``), are compared with their 1,000 counterparts by counting, never by timing.
"""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.bench.pages import fill_run
from orchestrator.models import Run, TaskRun, Workflow
from tests.api_support import api, operator  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SMALL, BIG = 1_000, 100_000


def make_run(clock, n: int, mapped: str | None = None) -> Run:
    workflow, _ = Workflow.objects.get_or_create(name="big")
    now = clock.now()
    run = Run.objects.create(workflow=workflow, trigger="manual", state="failed", logical_date=now, started_at=now,
                             finished_at=now)
    fill_run(run, n, mapped)
    return run


@pytest.fixture
def runs(clock):
    """{(shape, size): run} for both shapes at both sizes."""
    return {(shape, n): make_run(clock, n, mapped) for shape, mapped in (("tasks", None), ("map", "square"))
            for n in (SMALL, BIG)}


def explained(sql: str) -> dict:
    """The plan of a statement, run (EXPLAIN ANALYZE), as JSON."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        return cursor.fetchone()[0][0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def rows_read(plan: dict) -> int:
    """Rows (or index entries) the statement's scans read: those they passed on and those their
    filters removed."""
    return sum(int(node["Actual Rows"] * node["Actual Loops"]) + int(node.get("Rows Removed by Filter", 0))
               for node in nodes(plan) if node["Node Type"].endswith("Scan"))


def measured(client, url: str) -> tuple[int, list[str], bytes]:
    """The status, the statements and the body of one GET."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    return response.status_code, [q["sql"] for q in queries.captured_queries], response.content


def costs(statements: list[str]) -> list[tuple[int, int, str]]:
    """(rows returned, rows read, statement) of each SELECT."""
    found = []
    for sql in statements:
        if sql.lstrip().upper().startswith("SELECT"):
            plan = explained(sql)
            found.append((int(plan["Actual Rows"]), rows_read(plan), sql))
    return found


def counting(sql: str) -> bool:
    """The statements that count a run's task runs (reads.run_counts, reads.instance_spans): they
    read each task run's index entry once and return a handful of rows."""
    return "GROUP BY" in sql


def assert_bounded(small: list[str], big: list[str], rows: int = 250):
    assert len(small) == len(big), (small, big)
    for returned, read, sql in costs(big):
        assert returned <= rows, (returned, sql)
        if not counting(sql):
            assert read <= 2 * rows, (read, sql)


def test_the_api_shows_a_run_of_100000_task_runs_as_counts_with_the_same_statements(runs, api):  # noqa: F811
    answers = {}
    for key, run in runs.items():
        status, statements, body = measured(api, f"/api/runs/{run.pk}/")
        assert status == 200, body
        answers[key] = (statements, json.loads(body), len(body))
    for shape in ("tasks", "map"):
        (small, _, small_bytes), (big, _, big_bytes) = answers[(shape, SMALL)], answers[(shape, BIG)]
        assert_bounded(small, big)
        assert big_bytes < small_bytes + 100
    # Distinct tasks: counted by state; a map: its own row among the tasks, its instances apart.
    tasks = answers[("tasks", BIG)][1]
    assert tasks["tasks"] == {"total": BIG, "by_state": {"dead": 1031, "succeeded": BIG - 1031}}
    assert tasks["mapped"] == []
    mapped = answers[("map", BIG)][1]
    own = TaskRun.objects.get(run=runs[("map", BIG)], map_index=-1)
    assert mapped["tasks"] == {"total": 1, "by_state": {"succeeded": 1}}
    assert mapped["mapped"] == [{"task": "square", "task_run": own.pk, "state": "succeeded", "instances": BIG,
                                 "by_state": {"dead": 1031, "succeeded": BIG - 1031},
                                 "instances_url": f"/api/runs/{own.run_id}/task-runs/?task=square"}]


def test_the_api_pages_a_runs_task_runs_by_task_and_state_at_the_same_cost_at_any_depth(clock, api):  # noqa: F811
    run, other_run = make_run(clock, BIG, "square"), make_run(clock, 10)
    base = f"/api/runs/{run.pk}/task-runs/"
    first = api.get(base + "?task=square&limit=100").json()
    assert [t["map_index"] for t in first["results"]] == list(range(-1, 99))
    second = api.get(first["next"]).json()
    assert [t["map_index"] for t in second["results"]] == list(range(99, 199))
    # Deep in the map, and by state: each page is one bounded index scan.
    deep = TaskRun.objects.get(run=run, task="square", map_index=90_000)
    pages = {}
    for label, url in {"first": base + "?limit=100", "deep": f"{base}?limit=100&cursor=after.{deep.pk}",
                       "dead": f"{base}?limit=100&state=dead", "dead, deep": f"{base}?limit=100&state=dead&cursor=after.{deep.pk}"}.items():
        status, statements, body = measured(api, url)
        assert status == 200, body
        pages[label] = (statements, json.loads(body))
    assert [t["map_index"] for t in pages["deep"][1]["results"]] == list(range(90_001, 90_101))
    assert {t["state"] for t in pages["dead"][1]["results"]} == {"dead"}
    assert pages["dead, deep"][1]["results"][0]["map_index"] == 90_021  # 90,021 % 97 == 5
    for label in ("deep", "dead, deep"):
        for returned, read, sql in costs(pages[label][0]):
            assert returned <= 101 and read <= 202, (label, returned, read, sql)
    # A cursor that is not one is a 400 naming it; another run's task run gives an empty page.
    bad = api.get(base + "?cursor=older.5")
    assert bad.status_code == 400 and "cursor" in bad.json()
    other = TaskRun.objects.filter(run=other_run).first()
    assert api.get(f"{base}?cursor=after.{other.pk}").json() == {"next": None, "previous": None, "results": []}
    assert api.get(base + "?state=sleeping").status_code == 400
