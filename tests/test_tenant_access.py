"""Access by tenant: every route of the web UI, the API and the operational endpoints, asked by
each identity about tenant A's objects and about tenant B's. The routes are read from the URL
resolver: a route this matrix does not know fails the test, so none can be added unchecked. The
table the matrix makes is the README's ("Access by tenant"): a test fails when they differ
(``ORCHESTRATOR_WRITE_MATRIX=1 ./dev test tests/test_tenant_access.py -n 0`` writes it).
Each identity's column is a test of its own, so the suite's processes share the work.

Every request runs in a savepoint that is rolled back, so each cell starts from the same rows;
an action's cell says whether it changed anything (runs, task runs, approvals, pauses, grants).
"""

from __future__ import annotations

import os
import re
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver

import orchestrator.urls
import tests.support.tasks_for_tests  # noqa: F401 - registers the job the matrix enqueues
from orchestrator import access, approval_links, audit, clock, jobs, logs
from orchestrator import backfill as backfills
from orchestrator.models import (
    Approval,
    Attempt,
    Backfill,
    Dataset,
    DatasetEvent,
    Note,
    Run,
    TaskRun,
    TaskState,
    TenantGrant,
    Workflow,
)
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from tests.support.api_support import make_user

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- tenant-matrix:start -->", "<!-- tenant-matrix:end -->"
TENANTS = {"A": ("tenant_a", "alpha_wf"), "B": ("tenant_b", "beta_wf")}
METRICS_TOKEN = "matrix-metrics-token"

MODULE = '''
from orchestrator.dsl import Schedule, Workflow

wf = Workflow("{name}", tenant="{tenant}", schedules=[Schedule("30 2 * * *")])

@wf.task(produces=["{name}_data"])
def extract(ctx):
    return 1

@wf.task
def load(ctx):
    return 2

extract >> load
'''


@dataclass
class World:
    """One tenant's objects: a workflow, a run with a dead task run (its attempt has a log) and a
    task run waiting for an approval, a dataset event, a backfill, a job and an audit record."""

    workflow: Workflow
    run: Run
    dead: TaskRun
    attempt: Attempt
    approval: Approval
    backfill: Backfill
    job: Run
    grant: TenantGrant
    dataset: str


def sync(folder: Path) -> None:
    """Both tenants' workflows, from one package (a sync makes what it does not find absent)."""
    package = f"tenantwf_{uuid.uuid4().hex[:10]}"
    (folder / package).mkdir()
    for tenant, name in TENANTS.values():
        (folder / package / f"{name}.py").write_text(textwrap.dedent(MODULE.format(name=name, tenant=tenant)))
    assert sorted(sync_workflows(folder / package, package).created) == sorted(name for _, name in TENANTS.values())


def build(tenant: str, name: str, grantee: User) -> World:
    workflow = Workflow.objects.get(name=name)
    now = clock.now()
    run, _ = create_run(workflow, trigger="manual")
    dead = run.task_runs.get(task="extract")
    TaskRun.objects.filter(pk=dead.pk).update(state=TaskState.DEAD, attempts=1, started_at=now, finished_at=now,
                                              error=f"{name} failed")
    log = logs.AttemptLog(logs.name_for(run.pk, dead.pk, 1))
    log.write(f"the log of {name}\n")
    attempt = Attempt.objects.create(task_run=dead, number=1, outcome="failed", started_at=now, finished_at=now,
                                     error=f"{name} failed", log_path=log.finish())
    waiting = run.task_runs.get(task="load")
    TaskRun.objects.filter(pk=waiting.pk).update(state=TaskState.AWAITING, attempts=1, started_at=now)
    approval = Approval.objects.create(task_run=waiting, number=1, run=run, workflow=name, task="load", tenant=tenant,
                                       question=f"Ship {name}?", options=["yes", "no"], asked_at=now)
    dataset = f"{name}_data"
    DatasetEvent.objects.create(dataset=Dataset.objects.get_or_create(name=dataset)[0], task_run=dead, run=run,
                                workflow=name, task="extract", logical_date=run.logical_date, created_at=now)
    day = datetime(2026, 1, 5, tzinfo=UTC)
    backfill = backfills.start(workflow, day, day + timedelta(hours=23))
    job, _ = jobs.enqueue("tests.support.tasks_for_tests:record_job", kwargs={"path": f"/nowhere/{name}-job"},
                          tenant=tenant)
    audit.record("cancel", target=run, source="cli", reason=f"{name} audited")
    grant = TenantGrant.objects.create(user=grantee, role=TenantGrant.Role.VIEWER, tenant=tenant)
    return World(Workflow.objects.get(pk=workflow.pk), Run.objects.get(pk=run.pk), TaskRun.objects.get(pk=dead.pk),
                 attempt, approval, Backfill.objects.get(pk=backfill.pk), job, grant, dataset)


# --- the cases: one or more per route --------------------------------------------------------------

READ, LIST, ACT, OPEN = "read", "list", "act", "open"


@dataclass
class Case:
    route: str  # namespace:name of the route (or the pattern of an unnamed one)
    kind: str  # READ an object, LIST (shows the tenant's objects or not), ACT on an object, OPEN to all
    method: str = "get"
    args: Callable[[World], list] = lambda w: []
    query: Callable[[World], dict] = lambda w: {}
    data: Callable[[World], dict] | None = None  # a form (web) or a JSON body (api)
    htmx: bool = False
    label: str = ""  # what the row says besides the route, when one route has several rows
    headers: dict = field(default_factory=dict)
    setup: Callable[[World], None] | None = None  # run in the cell's savepoint before asking


def wf(w):
    return [w.workflow.name]


def run(w):
    return [w.run.pk]


def dead(w):
    return [w.dead.pk]


CASES = [
    # --- the web UI
    Case("web:dashboard", LIST),
    Case("web:login", OPEN),
    Case("web:logout", OPEN, "post"),
    Case("web:workflows", LIST),
    Case("web:workflow", READ, args=wf),
    Case("web:workflow_trigger", ACT, "post", args=wf, data=lambda w: {}),
    Case("web:workflow_pause", ACT, "post", args=wf, data=lambda w: {}),
    Case("web:workflow_resume", ACT, "post", args=wf, data=lambda w: {}, label="(paused first)"),
    Case("web:workflow_backfill", ACT, "post", args=wf,
         data=lambda w: {"start": "2026-02-01T00:00", "end": "2026-02-01T23:00", "schedule": "",
                         "reprocess": "none"}, label="(a dry run first)"),
    Case("web:workflow_calendar", READ, args=wf),
    Case("web:workflow_code", READ, args=wf),
    Case("web:runs", LIST),
    Case("web:run", READ, args=run),
    Case("web:run_cancel", ACT, "post", args=run, data=lambda w: {}),
    Case("web:run_retry", ACT, "post", args=run, data=lambda w: {}),
    Case("web:task_run", READ, args=dead),
    Case("web:mapped_instances", READ, args=dead),
    Case("web:task_run_action", ACT, "post", args=lambda w: [w.dead.pk, "retry"], data=lambda w: {}),
    Case("web:attempt_log", READ, args=lambda w: [w.attempt.pk], htmx=True),
    Case("web:attempt_log_download", READ, args=lambda w: [w.attempt.pk]),
    Case("web:run_clear", READ, args=run, label="(the dialog)"),
    Case("web:run_mark", ACT, "post", args=lambda w: [w.run.pk, "succeeded"], data=lambda w: {}),
    Case("web:run_note", ACT, "post", args=run, data=lambda w: {"text": "a note"}),
    Case("web:runs_bulk", ACT, "post", data=lambda w: {"action": "mark-succeeded", "ids": [w.run.pk]},
         label="(its dry run)"),
    Case("web:task_run_clear", READ, args=dead, label="(the dialog)"),
    Case("web:task_run_result", READ, args=dead),
    Case("web:task_run_note", ACT, "post", args=dead, data=lambda w: {"text": "a note"}),
    Case("web:dead_letter", LIST),
    Case("web:dead_letter", ACT, "post", data=lambda w: {"action": "retry", "ids": [w.dead.pk], "confirmed": "on"},
         label="retry"),
    Case("web:approvals", LIST),
    Case("web:approval_answer", ACT, "post", args=lambda w: [w.approval.pk], data=lambda w: {"answer": "yes"}),
    Case("web:approval_link", OPEN, args=lambda w: [approval_links.token(w.approval.pk, "yes", "a@example.com")],
         label="(a signed link is the right)"),
    Case("web:audit", LIST),
    Case("web:datasets", LIST),
    Case("web:dataset_named", READ, query=lambda w: {"name": w.dataset}),
    Case("web:dataset", READ, args=lambda w: [w.dataset]),
    Case("web:dataset_event", ACT, "post", data=lambda w: {"name": w.dataset, "confirm": "yes"},
         label="(starts every tenant's consumers: global operators)"),
    Case("web:clock", OPEN, "post", data=lambda w: {"clock": "utc"}, label="(own preference)"),
    # --- the operational endpoints
    Case("healthz", OPEN),
    Case("readyz", OPEN),
    Case("metrics", LIST, label="(METRICS_TOKEN set)"),
    # --- the API
    Case("api:workflows", LIST),
    Case("api:workflow", READ, args=wf),
    Case("api:workflow-pause", ACT, "post", args=wf, data=lambda w: {}),
    Case("api:workflow-resume", ACT, "post", args=wf, data=lambda w: {}, label="(paused first)"),
    Case("api:workflow-runs", READ, args=wf),
    Case("api:workflow-runs", ACT, "post", args=wf, data=lambda w: {}, label="trigger"),
    Case("api:runs", LIST),
    Case("api:run", READ, args=run),
    Case("api:run-task-runs", READ, args=run),
    Case("api:run-cancel", ACT, "post", args=run, data=lambda w: {}),
    Case("api:run-retry", ACT, "post", args=run, data=lambda w: {}),
    Case("api:task-run", READ, args=dead),
    Case("api:task-run-result", READ, args=dead, setup=lambda w: TaskRun.objects.filter(pk=w.dead.pk).update(
        state=TaskState.SUCCEEDED, result={"rows": 1})),
    Case("api:task-run-retry", ACT, "post", args=dead, data=lambda w: {}),
    Case("api:task-run-clear", ACT, "post", args=dead, data=lambda w: {}),
    Case("api:task-run-mark", ACT, "post", args=dead, data=lambda w: {"state": "succeeded"}),
    Case("api:task-run-note", READ, args=dead),
    Case("api:task-run-note", ACT, "put", args=dead, data=lambda w: {"text": "a note"}, label="write"),
    Case("api:run-clear", ACT, "post", args=run, data=lambda w: {}),
    Case("api:run-mark", ACT, "post", args=run, data=lambda w: {"state": "succeeded"}),
    Case("api:run-note", READ, args=run),
    Case("api:run-note", ACT, "put", args=run, data=lambda w: {"text": "a note"}, label="write"),
    Case("api:runs-bulk", ACT, "post", data=lambda w: {"action": "mark-succeeded", "ids": [w.run.pk]}),
    Case("api:attempt-log", READ, args=lambda w: [w.dead.pk, 1]),
    Case("api:jobs", LIST),
    Case("api:jobs", ACT, "post", data=lambda w: {"ref": "tests.support.tasks_for_tests:record_job",
                                                  "kwargs": {"path": "/nowhere"}},
         label="enqueue (a job of the default tenant)"),
    Case("api:job", READ, args=lambda w: [w.job.pk]),
    Case("api:dlq", LIST),
    Case("api:dlq-retry", ACT, "post", data=lambda w: {"ids": [w.dead.pk]}),
    Case("api:dlq-discard", ACT, "post", data=lambda w: {"ids": [w.dead.pk]}),
    Case("api:backfills", LIST),
    Case("api:backfills", ACT, "post", data=lambda w: {"workflow": w.workflow.name, "start": "2026-02-01T00:00:00Z",
                                                       "end": "2026-02-01T23:00:00Z"}, label="start"),
    Case("api:backfill", READ, args=lambda w: [w.backfill.pk]),
    Case("api:audit", LIST),
    Case("api:approvals", LIST),
    Case("api:approval-answer", ACT, "post", args=lambda w: [w.approval.pk], data=lambda w: {"answer": "yes"}),
    Case("api:dataset-events", LIST),
    Case("api:dataset-events", READ, query=lambda w: {"dataset": w.dataset}, label="?dataset="),
    Case("api:dataset-events", ACT, "post", data=lambda w: {"dataset": w.dataset},
         label="record (global operators)"),
    Case("api:metrics", LIST),
    Case("api:grants", LIST),
    Case("api:grants", ACT, "post", data=lambda w: {"group": "Viewers", "role": "viewer",
                                                    "tenant": w.workflow.tenant}, label="give"),
    Case("api:grant", READ, args=lambda w: [w.grant.pk]),
    Case("api:grant", ACT, "delete", args=lambda w: [w.grant.pk], label="take back"),
    # Secrets belong to the installation, not to a tenant: superusers and Secrets managers only.
    Case("api:secrets", OPEN, label="(installation-wide)"),
    Case("api:secret", OPEN, args=lambda w: ["secret", "absent"], label="(installation-wide, no such secret)"),
    Case("api:schema", OPEN),
    Case("api:docs", OPEN),
    Case("api:<any other path>", OPEN, args=lambda w: [], label="(a JSON 404)"),
]


# --- the routes, from the resolver ---------------------------------------------------------------


def routes(patterns=None, prefix: str = "", namespace: str = "") -> dict[str, str]:
    """{namespace:name: pattern} of every URL of the app (an unnamed one as ``<any other path>``)."""
    found = {}
    for entry in orchestrator.urls.urlpatterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}:{entry.namespace}".strip(":") if entry.namespace else namespace
            found.update(routes(entry.url_patterns, prefix + str(entry.pattern), inner))
        elif isinstance(entry, URLPattern):
            name = entry.name or "<any other path>"
            found[f"{namespace}:{name}".strip(":")] = "/" + prefix + (str(entry.pattern) if entry.name else name)
    return found


def url_of(case: Case, world: World, pattern: str) -> str:
    if pattern.endswith("<any other path>"):
        return pattern.replace("<any other path>", "no/such/thing/")
    # Fill the pattern's converters with the case's arguments in order (the reverse of resolving).
    values = iter(case.args(world))
    return re.sub(r"<[^>]+>", lambda _: str(next(values)), pattern)


# --- asking --------------------------------------------------------------------------------------


def snapshot() -> tuple:
    """What an action may change."""
    return (sorted(Run.objects.values_list("id", "state")), sorted(TaskRun.objects.values_list("id", "state",
                                                                                              "attempts")),
            sorted(Workflow.objects.values_list("id", "paused")), sorted(Approval.objects.values_list("id", "state")),
            Backfill.objects.count(), sorted(TenantGrant.objects.values_list("id", "role", "tenant")),
            sorted(Note.objects.values_list("id", "text")), DatasetEvent.objects.count())


def ask(client: Client, case: Case, world: World, pattern: str, markers: tuple[str, ...]) -> str:
    """One cell: what ``client`` got for ``case`` on ``world``'s objects."""
    url = url_of(case, world, pattern)
    headers = {"HX-Request": "true"} if case.htmx else {}
    with transaction.atomic():
        if "(paused first)" in case.label:
            Workflow.objects.filter(pk=world.workflow.pk).update(paused=True)
        if case.setup is not None:
            case.setup(world)
        before = snapshot()
        if case.method == "get":
            response = client.get(url, case.query(world), headers=headers)
        elif url.startswith("/api/"):
            response = getattr(client, case.method)(url, case.data(world) if case.data else None,
                                                    content_type="application/json", headers=headers)
        else:
            response = client.post(url, case.data(world) if case.data else {}, headers=headers)
        changed = snapshot() != before
        transaction.set_rollback(True)
    try:
        return outcome(case, response, changed, markers)
    finally:
        # A download's file, closed without response.close(): its request_finished signal would
        # close the test's database connection (it is inside a transaction).
        for close in response._resource_closers:
            close()


def outcome(case: Case, response, changed: bool, markers: tuple[str, ...]) -> str:
    status = response.status_code
    if status in (301, 302) and "/login/" in response.get("Location", ""):
        return "login"
    if case.kind == OPEN:
        return str(status)
    if status in (401, 403, 404, 405):
        return str(status)
    if case.kind == ACT:
        return "done" if changed else f"{status}, unchanged"
    if case.kind == LIST:
        body = b"".join(response.streaming_content) if response.streaming else response.content
        return "shown" if any(marker.encode() in body for marker in markers) else "hidden"
    return "shown"


IDENTITIES = ["Viewer of A", "Operator of A", "global Viewer", "global Operator", "superuser", "anonymous"]


def people() -> dict[str, User | None]:
    viewer_a = make_user("va", None)
    operator_a = make_user("oa", None)
    TenantGrant.objects.create(user=operator_a, role=TenantGrant.Role.OPERATOR, tenant=TENANTS["A"][0])
    superuser = make_user("root", None)
    User.objects.filter(pk=superuser.pk).update(is_superuser=True, is_staff=True)
    return {"Viewer of A": viewer_a, "Operator of A": operator_a, "global Viewer": make_user("gv", access.VIEWERS),
            "global Operator": make_user("go", access.OPERATORS), "superuser": User.objects.get(pk=superuser.pk),
            "anonymous": None}


def matrix(tmp_path, settings, identity: str) -> dict:
    """One identity's column: what it got for every case on tenant A's objects and on B's."""
    settings.ORCHESTRATOR_METRICS_TOKEN = METRICS_TOKEN
    who = people()
    sync(tmp_path)
    worlds = {key: build(tenant, name, who["Viewer of A"] if key == "A" else who["global Viewer"])
              for key, (tenant, name) in TENANTS.items()}
    known = routes()
    user = who[identity]
    cells = {}
    for case in CASES:
        client = Client()
        if user is not None:
            client.force_login(user)
        cells[(case.route, case.label)] = {key: ask(client, case, worlds[key], known[case.route], TENANTS[key])
                                           for key in TENANTS}
    return cells


def row_name(case: Case, known: dict) -> str:
    return f"{case.method.upper()} `{known[case.route]}`" + (f" {case.label}" if case.label else "")


def cell_text(cell: dict) -> str:
    return cell["A"] if cell["A"] == cell["B"] else f"{cell['A']} / {cell['B']}"


def readme_table() -> dict[str, list[str]]:
    """The README's access table: each row's route and its cells, in IDENTITIES' order."""
    text = README.read_text().split(START)[1].split(END)[0].strip()
    rows = {}
    for line in text.splitlines()[2:]:
        parts = [part.strip() for part in line.strip().strip("|").split(" | ")]
        rows[parts[0]] = parts[1:]
    return rows


def write_column(identity: str, cells: dict, known: dict) -> None:
    """Write one identity's column into the README's table, in CASES' order (a row the table does
    not have yet gets "?" in the other columns until their tests write them)."""
    old = readme_table()
    column = IDENTITIES.index(identity)
    lines = ["| route | " + " | ".join(IDENTITIES) + " |", "|---|" + "---|" * len(IDENTITIES)]
    for case in CASES:
        name = row_name(case, known)
        row = old.get(name, ["?"] * len(IDENTITIES))
        row[column] = cell_text(cells[(case.route, case.label)])
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    text = README.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    README.write_text(f"{head}{START}\n" + "\n".join(lines) + f"\n{END}{tail}")


def test_every_route_is_in_the_matrix_and_every_case_names_a_route():
    known = routes()
    covered = {case.route for case in CASES}
    assert sorted(set(known) - covered) == [], "routes the authorization matrix does not know: add a Case"
    assert sorted(covered - set(known)) == [], "cases of routes that no longer exist"
    if not os.environ.get("ORCHESTRATOR_WRITE_MATRIX"):
        assert list(readme_table()) == [row_name(case, known) for case in CASES], (
            "the README's access table has other rows than the matrix; write it with "
            "ORCHESTRATOR_WRITE_MATRIX=1 ./dev test tests/test_tenant_access.py -n 0")


# Which cells each identity must have, beyond the README's table: B's objects are absent from every
# list, refused (404 when unseen) or unchanged by every action for A's people, and A's own objects
# are read by A's viewer and changed by A's operator.
SHOWN_TO_A = ("web:run", "web:task_run", "web:attempt_log", "web:dataset", "web:task_run_result",
              "web:workflow_code", "web:workflow_calendar", "api:run", "api:task-run", "api:task-run-result", "api:attempt-log",
              "api:job", "api:backfill")
LISTED_TO_A = ("web:runs", "web:dashboard", "web:dead_letter", "web:workflows", "web:datasets", "api:runs",
               "api:dlq", "api:dataset-events", "api:jobs", "api:metrics", "api:workflows")
DONE_BY_A = ("web:run_cancel", "web:workflow_pause", "web:task_run_action", "web:run_mark", "web:run_note",
             "web:task_run_note", "api:run-cancel", "api:task-run-mark", "api:dlq-retry", "api:workflow-pause",
             "api:approval-answer", "api:run-clear", "api:run-mark", "api:runs-bulk", "api:task-run-clear")


@pytest.mark.parametrize("identity", IDENTITIES)
def test_the_matrix_refuses_tenant_b_to_tenant_a_and_matches_the_readme(tmp_path, settings, identity):
    cells = matrix(tmp_path, settings, identity)
    for case in CASES:
        cell = cells[(case.route, case.label)]
        if case.kind != OPEN and identity in ("Viewer of A", "Operator of A"):
            assert cell["B"] not in ("shown", "done"), (case.route, case.label, cell)
        if case.kind != OPEN and identity in ("Viewer of A", "global Viewer", "anonymous"):
            assert cell["B"] != "done", (case.route, case.label, cell)
    if identity == "Viewer of A":
        for route in SHOWN_TO_A:
            assert cells[(route, "")] == {"A": "shown", "B": "404"}, route
        for route in LISTED_TO_A:
            assert cells[(route, "")] == {"A": "shown", "B": "hidden"}, route
        for route in DONE_BY_A:
            assert cells[(route, "")]["A"] in ("403", "404"), route
    if identity == "Operator of A":
        for route in DONE_BY_A:
            assert cells[(route, "")]["A"] == "done", route
        assert cells[("api:audit", "")] == {"A": "shown", "B": "hidden"}
    if identity == "global Operator":
        for route in ("web:run_cancel", "api:run-cancel", "api:dlq-retry"):
            assert cells[(route, "")] == {"A": "done", "B": "done"}, route

    known = routes()
    if os.environ.get("ORCHESTRATOR_WRITE_MATRIX"):
        write_column(identity, cells, known)
    shown = readme_table()
    column = IDENTITIES.index(identity)
    differ = [(row_name(case, known), shown.get(row_name(case, known), ["(no row)"] * len(IDENTITIES))[column],
               cell_text(cells[(case.route, case.label)])) for case in CASES
              if shown.get(row_name(case, known), [None] * len(IDENTITIES))[column]
              != cell_text(cells[(case.route, case.label)])]
    assert differ == [], ("the README's access table differs from the matrix (row, README, matrix); write it with "
                          "ORCHESTRATOR_WRITE_MATRIX=1 ./dev test tests/test_tenant_access.py -n 0")
