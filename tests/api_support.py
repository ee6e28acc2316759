"""Fixtures of the API tests: users with each role and their token clients, and a workflow
package of their own (params, a schedule, a small graph)."""

from __future__ import annotations

import textwrap
import uuid

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from orchestrator import access
from orchestrator.models import Attempt, Backfill, Run, Schedule, TaskRun, Workflow
from orchestrator.sync import sync_workflows

WORKFLOW = '''
from orchestrator.dsl import Param, Schedule, Workflow

wf = Workflow("{name}", description="Reports.",
              schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin")],
              params={{"orders": Param(int, default=5), "currency": Param(str, default="EUR", choices=["EUR", "USD"]),
                      "day": Param("date")}})

@wf.task(retries=2)
def extract(ctx):
    return 1

@wf.task
def load(ctx):
    return 2

extract >> load
'''


def make_user(username: str, group: str | None) -> User:
    user = User.objects.create_user(username, password="pw-" + username)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def operator():
    return make_user("olga", access.OPERATORS)


@pytest.fixture
def viewer():
    return make_user("victor", access.VIEWERS)


@pytest.fixture
def api(operator):
    """An operator's token client."""
    return client_for(operator)


@pytest.fixture
def viewer_api(viewer):
    return client_for(viewer)


@pytest.fixture
def anonymous():
    return APIClient()


@pytest.fixture
def workflow(tmp_path) -> Workflow:
    package = f"apiwf_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "reports.py").write_text(textwrap.dedent(WORKFLOW.format(name="reports")))
    report = sync_workflows(folder, package)
    assert report.created == ["reports"], report
    return Workflow.objects.get(name="reports")


def stored() -> dict:
    """Row counts of everything a request could change, to show a bad request changed nothing."""
    return {model.__name__: model.objects.count() for model in (Run, TaskRun, Attempt, Backfill, Schedule, Workflow)} | {
        "paused": list(Workflow.objects.filter(paused=True).values_list("name", flat=True)),
        "states": sorted(Run.objects.values_list("id", "state")),
        "task_states": sorted(TaskRun.objects.values_list("id", "state")),
    }
