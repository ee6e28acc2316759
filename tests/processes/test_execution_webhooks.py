"""Webhooks on run completion: delivered as a job by a real worker to a local HTTP server, signed
with HMAC-SHA256, retried after a 500."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.models import Run, WebhookDelivery, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "webhook-test-secret"


@pytest.fixture
def receiver():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((body, dict(self.headers)))
            # The first call fails: the delivery must be retried.
            self.send_response(500 if len(received) == 1 else 204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


def test_a_finished_run_posts_a_signed_webhook_and_retries_after_a_500(processes, receiver, tmp_path):
    url, received = receiver
    workflow = Workflow.objects.create(name="hooked", webhooks=[url])
    spec = {"tasks": {"only": {"kind": "python", "ref": "tests.support.tasks_for_tests:no_argument", "upstream": []}}}
    workflow.current_version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="h1", spec=spec)
    workflow.save()
    env = process_env(ORCHESTRATOR_WEBHOOK_SECRET=SECRET, ORCHESTRATOR_WEBHOOK_RETRY_SECONDS="0.2",
                      ORCHESTRATOR_POLL_SECONDS="0.2", ORCHESTRATOR_DATA_DIR=str(tmp_path))
    processes.start("dispatcher", env=env)
    processes.start("worker", "--concurrency", "2", env=env)
    run, _ = create_run(workflow, trigger="manual")

    delivery = wait_for(lambda: WebhookDelivery.objects.filter(run=run, state="delivered").first(), 20,
                        message="the webhook to be delivered")
    assert (delivery.attempts, delivery.status_code, delivery.event) == (2, 204, "run.succeeded")
    assert len(received) == 2
    body, headers = received[-1]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Orchestrator-Signature"], expected)
    payload = json.loads(body)
    run.refresh_from_db()
    assert payload["run_id"] == run.pk and payload["workflow"] == "hooked" and payload["state"] == "succeeded"
    assert payload["finished_at"] == run.finished_at.isoformat()
    # The delivery job is itself a run (of a job, without webhooks of its own). The delivery row
    # is written by the job's task, which the worker records as succeeded a moment later.
    job = wait_for(lambda: Run.objects.filter(trigger="job", state="succeeded").first(), 20,
                   message="the delivery job to succeed")
    assert job.workflow_id is None and Run.objects.filter(trigger="job").count() == 1
