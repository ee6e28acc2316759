# ruff: noqa: F811 - pytest fixtures imported from tests.api_support
"""The API against a real server: concurrent requests with one idempotency key create one run."""

import json
import threading
import urllib.error
import urllib.request

import pytest
from rest_framework.authtoken.models import Token

from orchestrator.models import Run, TaskRun
from tests.api_support import operator, start_server, workflow  # noqa: F401 - fixtures

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
    token = Token.objects.create(user=operator).key
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
