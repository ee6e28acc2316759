"""Fixtures of the API tests: users with each role and their token clients, and a workflow
package of their own (params, a schedule, a small graph)."""

from __future__ import annotations

import textwrap
import uuid

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from orchestrator import access
from orchestrator.api.permissions import create_token
from orchestrator.models import Attempt, Backfill, Run, Schedule, TaskRun, Workflow
from orchestrator.sync import sync_workflows

WORKFLOW = '''
from orchestrator.dsl import Param, Schedule, Workflow

wf = Workflow("{name}", description="Reports.",
              schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin", params={{"day": "2026-03-01"}})],
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


def make_user(username: str, group: str | None, password: str | None = None) -> User:
    # No password unless asked for: hashing one costs most of a test's setup time.
    user = User.objects.create_user(username, password=password)
    if group:
        # get_or_create: a transactional test before this one may have flushed the migration's groups.
        access.add_to_group(user, group)
    return user


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {create_token(user)}")
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


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(processes, **env) -> str:
    """``manage.py runserver`` on a free port against the test database; returns its base URL."""
    import urllib.error
    import urllib.request

    from tests.conftest import process_env, wait_for

    port = free_port()
    proc = processes.start("runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks",
                           env=process_env(**env), name="web")
    url = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, processes.output(proc)
        try:
            with urllib.request.urlopen(f"{url}/api/schema/", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    wait_for(up, timeout=30, interval=0.1, message="the API server to answer")
    return url
