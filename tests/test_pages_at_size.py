"""A run of 100,000 task runs costs its page and the API what a run of 1,000 does: the same
statements, each returning a bounded number of rows, and answers of bounded size. Distinct tasks
(a 100,000-task graph) and a map over 100,000 items, each made by one set-based INSERT
(``bench.pages.fill_run``), are compared with their 1,000 counterparts by counting, never by timing.
"""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access
from orchestrator.bench.pages import fill_run
from orchestrator.models import Run, TaskRun, Workflow
from tests.support.api_support import api, operator  # noqa: F401 - fixtures

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
    """{(shape, size): run} for both shapes at both sizes. The big runs first: each is half of this
    table, which no run is in a real one, and the planner, reckoning a run's rows spread evenly
    over the ids, would walk the primary key through any run made before it (the small ones) to
    find the first page's rows; behind the big ones, the small runs are rare enough for the
    planner to take their own index."""
    made = {(shape, n): make_run(clock, n, mapped) for n in (BIG, SMALL)
            for shape, mapped in (("tasks", None), ("map", "square"))}
    return {key: made[key] for key in sorted(made)}


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


def assert_bounded(small: list[str], big: list[str], rows: int = 250):
    assert len(small) == len(big), (small, big)
    # Counting included: a run's counts are kept as its task runs change state (counts.py), so no
    # statement reads an index entry per task run.
    for returned, read, sql in costs(big):
        assert returned <= rows, (returned, sql)
        assert read <= 2 * rows, (read, sql, json.dumps(explained(sql))[:1500])


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


@pytest.fixture
def viewer_client(client):
    user = User.objects.create_user("vera", password="pw-vera")
    access.add_to_group(user, access.VIEWERS)
    client.force_login(user)
    client.get(reverse("orchestrator:web:dashboard"))  # the session's first page reads the viewer's clock choice
    return client


def test_the_run_page_of_100000_task_runs_costs_what_1000_do(runs, viewer_client):
    pages = {}
    for key, run in runs.items():
        status, statements, html = measured(viewer_client, reverse("orchestrator:web:run", args=[run.pk]))
        assert status == 200
        pages[key] = (statements, html.decode())
    for shape in ("tasks", "map"):
        (small, small_html), (big, big_html) = pages[(shape, SMALL)], pages[(shape, BIG)]
        assert_bounded(small, big)
        # The same rows; only numbers grow a digit or two (counts, positions on the timeline).
        assert len(big_html) < len(small_html) * 1.02 + 200, (len(small_html), len(big_html))
    # 100,000 tasks: the first 100 listed, counted by state, no graph of 100,000 nodes.
    _, html = pages[("tasks", BIG)]
    assert len(html) < 300_000
    assert "100000 tasks: too many to draw" in html and "<svg" not in html
    assert len(re.findall(r">t\d{6}</a></td>", html)) == 100
    assert '<span class="count">all 100000</span>' in html
    nxt = re.search(r'<a rel="next" href="([^"]+)">Next tasks</a>', html).group(1)
    status, statements, second = measured(viewer_client, nxt)
    assert status == 200 and len(statements) == len(pages[("tasks", BIG)][0])
    assert re.findall(r">(t\d{6})</a></td>", second.decode())[:2] == ["t000100", "t000101"]
    # A map over 100,000 items: one node, one row with its counts and a link to its instances.
    _, html = pages[("map", BIG)]
    own = TaskRun.objects.get(run=runs[("map", BIG)], map_index=-1)
    assert re.search(r'<g class="node mapped st-succeeded"><title>square: succeeded, 100000 instances: '
                     r'98969 succeeded, 1031 dead</title>', html)
    assert reverse("orchestrator:web:mapped_instances", args=[own.pk]) in html
    assert "All 100000 instances, by state" in html


def test_the_mapped_tasks_page_counts_its_100000_instances_and_links_to_them(clock, viewer_client):
    small, big = make_run(clock, SMALL, "square"), make_run(clock, BIG, "square")
    answers = {}
    for run in (small, big):
        own = TaskRun.objects.get(run=run, map_index=-1)
        for name, url in (("task run", reverse("orchestrator:web:task_run", args=[own.pk])),
                          ("instances", reverse("orchestrator:web:mapped_instances", args=[own.pk])),
                          ("succeeded instances", reverse("orchestrator:web:mapped_instances", args=[own.pk])
                           + "?state=succeeded&from=50000")):
            status, statements, html = measured(viewer_client, url)
            assert status == 200, url
            answers[(run.pk, name)] = (statements, html.decode())
    for name in ("task run", "instances", "succeeded instances"):
        (small_sql, small_html), (big_sql, big_html) = answers[(small.pk, name)], answers[(big.pk, name)]
        assert_bounded(small_sql, big_sql)
        assert len(big_html) < len(small_html) + 200 or name != "task run", name
        assert len(big_html) < 200_000, name
    own = TaskRun.objects.get(run=big, map_index=-1)
    instances = reverse("orchestrator:web:mapped_instances", args=[own.pk])
    _, html = answers[(big.pk, "task run")]
    # Not "ATTEMPTS 0 of 1 / No attempt yet": its instances, counted by state, each count a link.
    assert "No attempt yet" not in html and "<dt>attempts</dt>" not in html
    assert '<dd id="instances-ended">100000/100000 ended</dd>' in html
    assert "100000 instances: 98969 succeeded, 1031 dead." in html
    assert f'href="{instances}?state=dead">' in html and f'<a id="all-instances" href="{instances}">' in html
    _, html = answers[(big.pk, "succeeded instances")]
    assert re.findall(r">square\[(\d+)\]<", html)[:3] == ["50000", "50001", "50002"]
    # By state from deep in the map (the dead ones are read through taskrun_dead or taskrun_run_state,
    # as the planner finds cheaper: every dead task run of the table, or the page's).
    html = viewer_client.get(f"{instances}?state=dead&from=50000").content.decode()
    assert re.findall(r">square\[(\d+)\]<", html)[:2] == ["50057", "50154"]


def test_the_api_pages_a_runs_task_runs_by_task_and_state_at_the_same_cost_at_any_depth(clock, api):  # noqa: F811
    run, other_run = make_run(clock, BIG, "square"), make_run(clock, 10)
    base = f"/api/runs/{run.pk}/task-runs/"
    response = api.get(base + "?task=square&limit=100")
    first = response.json()
    assert [t["map_index"] for t in first["results"]] == list(range(-1, 99))
    # The mapped task's own result, every instance's in one list, is left to its own answer.
    assert first["results"][0]["result"] is None and len(response.content) < 60_000
    # Its own answer counts its instances and links to their results, paged: not a list of 100,000.
    response = api.get(f"/api/task-runs/{first['results'][0]['id']}/")
    own = response.json()
    assert own["result"] is None and len(response.content) < 5_000
    assert own["mapped"] == {"count": BIG, "by_state": {"dead": 1031, "succeeded": BIG - 1031},
                             "results_url": f"/api/runs/{run.pk}/task-runs/?task=square",
                             "result_url": f"/api/task-runs/{own['id']}/result/"}
    with connection.cursor() as cursor:  # the instances' own results, as their ends wrote them
        cursor.execute("UPDATE orchestrator_taskrun SET result = to_jsonb(map_index * map_index) "
                       "WHERE run_id = %s AND map_index BETWEEN 0 AND 3", [run.pk])
    results = api.get(own["mapped"]["results_url"] + "&limit=5").json()["results"]
    assert [(t["map_index"], t["result"]) for t in results] == [(-1, None), (0, 0), (1, 1), (2, 4), (3, 9)]
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
