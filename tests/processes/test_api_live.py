# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The API against a real server: concurrent requests with one idempotency key create one run,
and the README's curl examples work as printed."""

import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.api.permissions import create_token
from orchestrator.models import Backfill, Run, TaskRun, Trigger
from orchestrator.sync import sync_workflows
from tests.conftest import ROOT, process_env
from tests.support.api_support import operator, start_server, workflow  # noqa: F401 - fixtures

THREADS = 8


def post(url: str, token: str, data: dict, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST", headers={
        "Authorization": f"Token {token}", "Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.django_db(transaction=True)
def test_concurrent_triggers_with_one_key_create_one_run(processes, operator, workflow):
    base = start_server(processes)
    token = create_token(operator)
    url = f"{base}/api/workflows/reports/runs/"
    barrier = threading.Barrier(THREADS)
    answers = []

    def fire():
        barrier.wait(timeout=30)
        answers.append(post(url, token, {"params": {"day": "2026-03-01"}}, "one-key"))

    threads = [threading.Thread(target=fire) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(answers) == THREADS
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * (THREADS - 1) + [201], answers
    assert len({body["id"] for _, body in answers}) == 1
    run = Run.objects.get()
    assert run.idempotency_key == "one-key" and TaskRun.objects.filter(run=run).count() == 2

    # The same key with another payload, concurrently with nothing: a 409 that names the key.
    status, body = post(url, token, {"params": {"day": "2026-03-02"}}, "one-key")
    assert status == 409 and "one-key" in body["detail"]
    assert Run.objects.count() == 1


def readme_api_examples() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## API\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


@pytest.mark.django_db(transaction=True)
def test_the_readme_curl_examples_work_as_printed(processes, tmp_path):
    from django.contrib.auth.models import User

    sync_workflows()
    User.objects.create_superuser("admin", "admin@example.com", None)
    base = start_server(processes)
    script = readme_api_examples()
    assert "./dev manage create_token admin" in script and "http://127.0.0.1:8000/api" in script
    # Only what the test needs: the test database's server, manage.py without ./dev's first-run
    # setup, and curl failing loudly on an HTTP error; every command runs as printed otherwise.
    script = (script.replace("./dev manage", f"{sys.executable} {ROOT / 'manage.py'}")
              .replace("http://127.0.0.1:8000", base).replace("curl -s ", "curl -s -S --fail-with-body "))
    answers = tmp_path / "answers"
    lines = script.replace("\\\n", " ").splitlines()
    script = "set -eu\n" + "\n".join(f"{line} >> {answers}; echo >> {answers}" if line.startswith("curl") else line
                                      for line in lines)
    done = subprocess.run(["bash", "-c", script], env=process_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = [json.loads(line) for line in Path(answers).read_text().splitlines() if line.strip()]
    assert len(bodies) == sum(line.startswith("curl") for line in lines) == 8
    assert "nightly_etl" in [w["name"] for w in bodies[0]]
    assert Run.objects.filter(workflow__name="nightly_etl", trigger=Trigger.API, idempotency_key="etl-manual-1",
                              params__currency="USD").count() == 1
    assert bodies[4]["ref"] == "workflows.jobs:send_welcome_email" and bodies[5]["dry_run"] is True
    assert bodies[5]["count"] == 7 and not Backfill.objects.exists()
    assert bodies[7] == {"requested": 2, "retried": 0}
