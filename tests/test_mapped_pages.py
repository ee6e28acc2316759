"""A mapped task on the pages: one node with its instances' counts on the run page's graph, one
row with the first instances under it, one grid cell with a summary, and a page of its own that
lists every instance, by state, page by page."""

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access
from orchestrator.models import TaskRun
from orchestrator.runs import trigger_workflow
from orchestrator.web import mapped
from tests.support.features_support import run_to_end, sync_module, worker_loop
from tests.test_mapping import MODULE

pytestmark = pytest.mark.django_db


@pytest.fixture
def wfs(tmp_path):
    return sync_module(tmp_path, MODULE.format(retries=0, max_parallel=""))


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vera", password="pw-vera")
    access.add_to_group(user, access.VIEWERS)
    client.force_login(user)
    return user


def mapped_run(wfs, clock, items):
    """A run of "mapped" over these items, ended: the item 7 fails (no retries), so its instance
    is dead and the others succeeded."""
    run, _ = trigger_workflow(wfs["mapped"], {"items": items, "fail_on": 7}, now=clock.now())
    return run_to_end(run, clock, worker_loop())


@pytest.mark.time_sensitive
def test_the_run_page_shows_a_mapped_task_as_one_node_and_one_row_with_counts(wfs, clock, viewer, client):
    run = mapped_run(wfs, clock, list(range(30)))
    own = TaskRun.objects.get(run=run, task="double", map_index=-1)
    assert own.state == "failed"
    html = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    # One node for the mapped task, drawn as a stack, with ended/total and the counts by state.
    nodes = re.findall(r'<g class="node mapped st-(\w+)"><title>([^<]*)</title>', html)
    assert nodes == [("failed", "double: failed, 30 instances: 29 succeeded, 1 dead")]
    assert re.search(r'<tspan class="count"[^>]*>30/30</tspan>', html)
    # One row for it in the task table (its own task run), the counts next to it ...
    own_link = reverse("orchestrator:web:task_run", args=[own.pk])
    assert html.count(f'href="{own_link}"') == 3  # the graph node, the timeline label, the table row
    row = re.search(r'<tr class="mapped">.*?</tr>', html, re.S).group(0)
    assert ">30/30<" in row and "succeeded</span> 29" in row and "dead</span> 1" in row
    assert "1 of 30 mapped instances did not succeed" in row
    # ... and, folded under it, the first instances with a link to all of them.
    shown = re.findall(r">double\[(\d+)\]<", html)
    assert shown == [str(i) for i in range(mapped.INSTANCES_SHOWN)]
    assert reverse("orchestrator:web:mapped_instances", args=[own.pk]) in html
    assert "All 30 instances, by state" in html
    # The timeline has one bar for the map, not one per instance.
    assert len(re.findall(r'class="bar mapped out-failed"', html)) == 1


@pytest.mark.time_sensitive
def test_the_run_page_costs_the_same_queries_for_three_items_or_sixty(wfs, clock, viewer, client):
    small, large = mapped_run(wfs, clock, [1, 2, 3]), mapped_run(wfs, clock, list(range(60)))
    counted = []
    client.get(reverse("orchestrator:web:dashboard"))  # the session's first page reads the viewer's clock choice
    for run in (small, large):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("orchestrator:web:run", args=[run.pk])).status_code == 200
        counted.append(len(queries))
    assert counted[0] == counted[1]


@pytest.mark.time_sensitive
def test_the_instances_page_lists_every_instance_by_state_a_page_at_a_time(wfs, clock, viewer, client, monkeypatch):
    run = mapped_run(wfs, clock, list(range(25)))
    own = TaskRun.objects.get(run=run, task="double", map_index=-1)
    url = reverse("orchestrator:web:mapped_instances", args=[own.pk])
    monkeypatch.setattr(mapped, "INSTANCES_PAGE", 10)
    first = client.get(url).content.decode()
    assert re.findall(r">double\[(\d+)\]<", first) == [str(i) for i in range(10)]
    assert "25 instances: 24 succeeded, 1 dead" in first
    assert 'href="?from=10"' in first
    last = client.get(url, {"from": 20}).content.decode()
    assert re.findall(r">double\[(\d+)\]<", last) == [str(i) for i in range(20, 25)]
    assert 'href="?from=' not in last
    # Filtered by state: only the dead one, whose error is shown.
    dead = client.get(url, {"state": "dead"}).content.decode()
    assert re.findall(r">double\[(\d+)\]<", dead) == ["7"]
    assert "item 7 fails" in dead
    # htmx asks for the rows only.
    partial = client.get(url, {"from": 10}, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<section class="card" id="rows">') and ">double[10]<" in partial


@pytest.mark.time_sensitive
def test_the_instances_page_refuses_bad_input_and_a_task_run_that_is_an_instance(wfs, clock, viewer, client):
    run = mapped_run(wfs, clock, [1, 2])
    own = TaskRun.objects.get(run=run, task="double", map_index=-1)
    url = reverse("orchestrator:web:mapped_instances", args=[own.pk])
    response = client.get(url, {"state": "happy"})
    assert response.status_code == 400 and "state must be one of" in response.content.decode()
    response = client.get(url, {"from": "-1"})
    assert response.status_code == 400 and "from must be a whole number" in response.content.decode()
    instance = TaskRun.objects.get(run=run, task="double", map_index=0)
    assert client.get(reverse("orchestrator:web:mapped_instances", args=[instance.pk])).status_code == 404


@pytest.mark.time_sensitive
def test_the_grid_shows_a_mapped_task_as_one_cell_with_a_summary(wfs, clock, viewer, client):
    first = mapped_run(wfs, clock, [1, 2, 3])
    second = mapped_run(wfs, clock, list(range(12)))
    html = client.get(reverse("orchestrator:web:workflow", args=["mapped"])).content.decode()
    cells = re.findall(r'<a class="cell mapped st-(\w+)" href="([^"]+)" title="([^"]*)"[^>]*>([^<]*)</a>', html)
    own = {run.pk: TaskRun.objects.get(run=run, task="double", map_index=-1) for run in (first, second)}
    assert cells == [
        ("succeeded", reverse("orchestrator:web:mapped_instances", args=[own[first.pk].pk]),
         f"double in run #{first.pk}: succeeded, 3 instances: 3 succeeded", "3/3"),
        ("failed", reverse("orchestrator:web:mapped_instances", args=[own[second.pk].pk]),
         f"double in run #{second.pk}: failed, 12 instances: 11 succeeded, 1 dead", "12/12"),
    ]
    # The selected (newest) run's graph shows the mapped node with its counts.
    assert re.search(r'<g class="node mapped st-failed"><title>double: failed, 12 instances', html)
