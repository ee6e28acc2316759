"""Task groups: ``with wf.group(...)`` in the DSL (names kept, nesting, ``>>`` between groups),
their mistakes reported against their module, the group stored in the graph's spec and said by
the API, and the pages: a folded group is one grid row with the worst state of its tasks and one
graph node with their counts, unfolded by ``?unfold=`` at no extra read."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access
from orchestrator.dsl import Workflow as Dsl
from orchestrator.models import Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.validation import validate
from orchestrator.web import folding, grid, svg
from orchestrator.web.workflows import workflow_context
from tests.test_sync import Folder

pytestmark = pytest.mark.django_db

GROUPED = '''
from orchestrator.dsl import Workflow

wf = Workflow("{name}")

@wf.task
def start(ctx):
    return 1

with wf.group("extract", tooltip="pull the sources") as extract:
    @wf.task
    def pull_a(ctx):
        return 1

    @wf.task
    def pull_b(ctx):
        return 2

    with wf.group("checks"):
        @wf.task
        def check(ctx):
            return 3

    pull_a >> check

@wf.task
def load(ctx):
    return 4

start >> extract >> load
'''

# The same graph without groups: what the grouped one must cost no more than.
FLAT = '''
from orchestrator.dsl import Workflow

wf = Workflow("{name}")

@wf.task
def start(ctx):
    return 1

@wf.task
def pull_a(ctx):
    return 1

@wf.task
def pull_b(ctx):
    return 2

@wf.task
def check(ctx):
    return 3

@wf.task
def load(ctx):
    return 4

start >> [pull_a, pull_b]
pull_a >> check
[pull_b, check] >> load
'''

T0 = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def folder(tmp_path):
    return Folder(tmp_path)


def synced(folder, source: str, name: str) -> Workflow:
    folder.write(name, source.format(name=name))
    report = folder.sync()
    assert report.ok, report
    return Workflow.objects.select_related("current_version").get(name=name)


def run_with(wf: Workflow, day: int, states: dict[str, str]) -> Run:
    """A run of ``wf`` whose task runs are in ``states`` (the others succeeded)."""
    at = T0 + timedelta(days=day)
    run, _ = create_run(wf, trigger="manual", logical_date=at)
    Run.objects.filter(pk=run.pk).update(state=RunState.FAILED, started_at=at, finished_at=at + timedelta(seconds=9))
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED, attempts=1, started_at=at,
                                           finished_at=at + timedelta(seconds=3))
    for task, state in states.items():
        TaskRun.objects.filter(run=run, task=task).update(state=state)
    return run


def viewer(client):
    person = User.objects.create_user("vera", password="pw-vera")
    access.add_to_group(person, access.VIEWERS)
    client.force_login(person)


# --- the DSL and its checks -------------------------------------------------------------------------

def test_tasks_defined_in_a_group_belong_to_it_and_keep_their_names(folder):
    wf = synced(folder, GROUPED, "grouped")
    spec = wf.spec
    # Names are not prefixed: moving a task into a group renames nothing.
    assert set(spec["tasks"]) == {"start", "pull_a", "pull_b", "check", "load"}
    assert spec["tasks"]["pull_a"]["group"] == ["extract"]
    assert spec["tasks"]["check"]["group"] == ["extract", "checks"]
    assert "group" not in spec["tasks"]["start"]
    assert spec["groups"] == {"extract": {"parent": None, "tooltip": "pull the sources"},
                              "checks": {"parent": "extract", "tooltip": ""}}
    # start >> extract >> load: to the group's first tasks, from its last ones.
    upstream = {name: sorted(task["upstream"]) for name, task in spec["tasks"].items()}
    assert upstream == {"start": [], "pull_a": ["start"], "pull_b": ["start"], "check": ["pull_a"],
                        "load": ["check", "pull_b"]}


def test_a_workflow_without_groups_keeps_its_spec_and_hash(folder):
    wf = synced(folder, FLAT, "flat")
    assert "groups" not in wf.spec
    assert not any("group" in task for task in wf.spec["tasks"].values())


def test_groups_link_to_groups_and_lists_of_them():
    wf = Dsl("links", module="tests.links")
    with wf.group("a") as a:
        wf.shell("first", "true")
    with wf.group("b") as b:
        second = wf.shell("second", "true")
        third = wf.shell("third", "true")
    last = wf.shell("last", "true")
    b << a  # a's last tasks before b's first
    [a, b] >> last
    assert sorted(wf.edges) == sorted([("first", "second"), ("first", "third"), ("first", "last"),
                                       ("second", "last"), ("third", "last")])
    assert validate(wf) == []
    assert [t.name for t in b.members()] == [second.name, third.name]


@pytest.mark.parametrize(("source", "field", "words"), [
    ('with wf.group("load"):\n    wf.shell("x", "true")\n', "groups.load", "a task has this name too"),
    ('with wf.group("g"):\n    wf.shell("x", "true")\nwith wf.group("g"):\n    wf.shell("y", "true")\n',
     "groups.g", "two groups have this name"),
    ('with wf.group("bad name"):\n    wf.shell("x", "true")\n', "groups.bad name", "a group name must use letters"),
    ('with wf.group(""):\n    wf.shell("x", "true")\n', "groups.", "a group name must use letters"),
    ('with wf.group("empty"):\n    pass\n', "groups.empty", "the group has no task"),
    ('g = wf.group("later")\ng >> load\nwith g:\n    wf.shell("x", "true")\n', "groups.later", "has no task yet"),
])
def test_a_group_mistake_names_the_module_and_the_group_and_breaks_only_its_module(folder, source, field, words):
    folder.write("fine", FLAT.format(name="fine"))
    folder.write("mod", 'from orchestrator.dsl import Workflow\nwf = Workflow("wrong")\n'
                        'load = wf.shell("load", "true")\n' + source)
    report = folder.sync()
    assert list(report.broken) == ["wrong"], report
    message = report.broken["wrong"]
    assert field in message and words in message and f"in module {folder.package}.mod" in message, message
    assert Workflow.objects.get(name="fine").current_version is not None


def test_the_api_says_each_tasks_group(client, folder):
    wf = synced(folder, GROUPED, "grouped")
    viewer(client)
    graph = client.get(reverse("orchestrator:api:workflow", args=[wf.name])).json()["graph"]
    tasks = {task["name"]: task for task in graph["tasks"]}
    assert tasks["check"]["group"] == "checks" and tasks["check"]["group_path"] == ["extract", "checks"]
    assert tasks["start"]["group"] is None and tasks["start"]["group_path"] == []
    assert graph["groups"]["extract"]["tooltip"] == "pull the sources"


# --- the grid -----------------------------------------------------------------------------------

def rows_of(context) -> list[tuple[str, bool, int]]:
    return [(row.name, row.group, row.depth) for row in context["grid_rows"]]


def test_a_folded_group_is_one_grid_row_with_the_worst_state_of_its_tasks(folder):
    wf = synced(folder, GROUPED, "grouped")
    ok = run_with(wf, 0, {})
    bad = run_with(wf, 1, {"pull_b": TaskState.FAILED, "check": TaskState.UPSTREAM_FAILED})
    folded = grid.grid_context(wf, svg.upstream_of(wf.spec), T0 + timedelta(days=9))
    assert rows_of(folded) == [("start", False, 0), ("extract", True, 0), ("load", False, 0)]
    row = folded["grid_rows"][1]
    assert [cell.state for _run, cell in row.cells] == [TaskState.SUCCEEDED, TaskState.FAILED]
    assert row.cells[1][1].words == "1 failed, 1 upstream failed, 1 succeeded"
    assert [run.pk for run, _cell in row.cells] == [ok.pk, bad.pk]
    assert row.size == 3 and row.tooltip == "pull the sources" and not row.unfolded

    # Unfolded: the group's row stays (its summary), its tasks right under it, a nested group folded.
    params = grid.filters_from(_query("unfold=extract"))
    unfolded = grid.grid_context(wf, svg.upstream_of(wf.spec), T0 + timedelta(days=9), filters=params)
    assert rows_of(unfolded) == [("start", False, 0), ("extract", True, 0), ("pull_a", False, 1),
                                 ("pull_b", False, 1), ("checks", True, 1), ("load", False, 0)]
    both = grid.grid_context(wf, svg.upstream_of(wf.spec), T0 + timedelta(days=9),
                             filters=grid.filters_from(_query("unfold=extract&unfold=checks")))
    assert ("check", False, 2) in rows_of(both)


def _query(text: str) -> QueryDict:
    return QueryDict(text)


def test_the_grid_reads_no_more_with_groups_folded_or_unfolded(folder):
    """Folding works on the task runs the grid reads anyway: the same statements for a grouped
    workflow (folded, unfolded) as for the same graph without groups, and for 2 runs as for 6."""
    grouped, flat = synced(folder, GROUPED, "grouped"), synced(folder, FLAT, "flat")
    statements = {}
    for runs in (2, 6):
        for wf in (grouped, flat):
            for day in range(len(Run.objects.filter(workflow=wf)), runs):
                run_with(wf, day, {"pull_b": TaskState.FAILED})
        for label, wf, query in (("flat", flat, ""), ("folded", grouped, ""),
                                 ("unfolded", grouped, "unfold=extract&unfold=checks")):
            wf = Workflow.objects.select_related("current_version").get(pk=wf.pk)
            with CaptureQueriesContext(connection) as seen:
                context = grid.grid_context(wf, svg.upstream_of(wf.spec), T0 + timedelta(days=9),
                                            filters=grid.filters_from(_query(query)))
            assert len(context["runs"]) == runs
            statements[(label, runs)] = len(seen.captured_queries)
    assert len(set(statements.values())) == 1, statements


def test_the_fold_is_kept_in_the_grids_links_and_a_bad_name_is_a_400(client, folder):
    wf = synced(folder, GROUPED, "grouped")
    for day in range(3):
        run_with(wf, day, {})
    viewer(client)
    url = reverse("orchestrator:web:workflow", args=[wf.name])
    page = client.get(url + "?runs=25&unfold=extract&state=failed").content.decode()
    # The button folds it again, keeping the other parameters; the filter form keeps the fold.
    button = re.search(r'<form method="get" action="#grid" class="fold">(.*?)</form>', page).group(1)
    assert 'aria-expanded="true"' in button and 'name="state" value="failed"' in button
    assert 'name="unfold"' not in button
    assert '<input type="hidden" name="unfold" value="extract">' in page
    nested = re.findall(r'id="fold-checks" aria-expanded="(\w+)"', page)
    assert nested == ["false"]
    response = client.get(url + "?unfold=" + "x" * 300)
    assert response.status_code == 400 and b"unfold" in response.content


# --- the graph ----------------------------------------------------------------------------------

def test_a_folded_group_is_one_graph_node_with_its_tasks_counts_and_its_edges_merged(folder):
    wf = synced(folder, GROUPED, "grouped")
    run = run_with(wf, 0, {"pull_b": TaskState.FAILED, "check": TaskState.UPSTREAM_FAILED})
    context = workflow_context(wf, T0 + timedelta(days=1), run=run.pk)
    drawing = html.unescape(str(context["graph"].drawn(folding.Fold())))
    assert re.search(r'<g class="node group st-failed"><title>extract 3/3: group of 3 tasks, 1 failed, '
                     r'1 upstream failed, 1 succeeded\. pull the sources</title>', drawing), drawing
    assert 'aria-expanded="false"' in drawing and "pull_a" not in drawing
    # start -> extract and extract -> load: two edges (four task edges merged), three nodes.
    assert drawing.count('class="edge"') == 2
    assert drawing.count('class="node') == 3

    unfolded = html.unescape(str(context["graph"].drawn(folding.fold_from(_query("unfold=extract&run=1")))))
    assert '<g class="group-box">' in unfolded and "pull_a" in unfolded and "pull_b" in unfolded
    assert '<g class="node group' in unfolded  # checks, still folded inside extract's box
    assert 'href="?run=1#graph" aria-expanded="true"' in unfolded  # folding extract keeps the run
    # start -> pull_a, pull_b; pull_a -> checks; pull_b, checks -> load.
    assert unfolded.count('class="edge"') == 5
    box = re.search(r'<rect class="box" x="(\d+)" y="(\d+)" width="(\d+)" height="(\d+)"', unfolded).groups()
    left, top, width, height = map(int, box)
    for name in ("pull_a", "pull_b"):
        x, y = map(int, re.search(rf'<rect x="(\d+)" y="(\d+)"[^>]*/><circle[^>]*/><text[^>]*>{name}<',
                                  unfolded).groups())
        assert left < x and x + svg.NODE_W < left + width and top < y and y + svg.NODE_H < top + height
    start_x = int(re.search(r'<rect x="(\d+)" y="\d+"[^>]*/><circle[^>]*/><text[^>]*>start<', unfolded).group(1))
    assert start_x + svg.NODE_W <= left  # no task outside the group falls in its box


def test_the_workflow_and_run_pages_draw_the_fold_their_address_asks(client, folder):
    wf = synced(folder, GROUPED, "grouped")
    run = run_with(wf, 0, {"pull_b": TaskState.FAILED})
    viewer(client)
    page = client.get(reverse("orchestrator:web:workflow", args=[wf.name]) + f"?run={run.pk}").content.decode()
    assert 'class="node group st-failed"' in page and "group-box" not in page
    page = client.get(reverse("orchestrator:web:workflow", args=[wf.name]) + f"?run={run.pk}&unfold=extract"
                      ).content.decode()
    assert "group-box" in page and f'href="?run={run.pk}#graph" aria-expanded="true"' in page
    run_page = client.get(reverse("orchestrator:web:run", args=[run.pk]) + "?unfold=extract").content.decode()
    assert "group-box" in run_page and "pull_a" in run_page
    folded = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert 'class="node group st-failed"' in folded
    refused = client.get(reverse("orchestrator:web:run", args=[run.pk]) + "?unfold=no%20such%3Cgroup")
    assert refused.status_code == 400 and b"unfold takes group names" in refused.content
