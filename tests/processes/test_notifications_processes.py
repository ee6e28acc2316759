"""Notifications with real worker processes: 200 failing runs executed by a real worker give each
recipient one digest, an email received by a real SMTP server and chat posts by a real HTTP
server."""

from __future__ import annotations

import pytest

from orchestrator import notifications
from orchestrator.models import Notification, NotificationMessage, Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support.inbox_support import ChatReceiver, Mailbox, SmtpServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_200_failures_on_real_workers_send_one_digest_per_recipient(processes, tmp_path):
    chat = ChatReceiver().start()
    try:
        with SmtpServer() as mailbox:
            spec = {
                "tasks": {"boom": {"kind": "python", "ref": "tests.support.tasks_for_tests:always_fails", "upstream": [],
                                   "max_attempts": 1}},
                "notify": [{"on": ["run_failed"], "email": ["ops@example.com", "lead@example.com"],
                            "slack": [f"{chat.url}/slack"], "teams": [f"{chat.url}/teams"]}],
            }
            workflow = Workflow.objects.create(name="storm")
            workflow.current_version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="h1", spec=spec)
            workflow.save()
            env = process_env(EMAIL_HOST="127.0.0.1", EMAIL_PORT=mailbox.port, ORCHESTRATOR_POLL_SECONDS="0.2",
                              ORCHESTRATOR_DATA_DIR=str(tmp_path), ORCHESTRATOR_BASE_URL="https://orch.example.com",
                              # Longer than the storm can take on a slow machine: everything gathers.
                              ORCHESTRATOR_NOTIFY_DIGEST_SECONDS="600")
            processes.start("worker", "--concurrency", "4", env=env)
            for _ in range(200):
                create_run(workflow, trigger="manual")
            wait_for(lambda: Run.objects.filter(workflow=workflow, state="failed").count() == 200, 120,
                     message="200 failed runs")
            recipients = {"email:ops@example.com", "email:lead@example.com", f"slack:{chat.url}/slack",
                          f"teams:{chat.url}/teams"}
            messages = NotificationMessage.objects.filter(state="pending")
            assert set(messages.values_list("recipient", flat=True)) == recipients
            assert Notification.objects.count() == 800 and mailbox.received == [] and chat.posts == []

            # The end of the window, brought forward (the admin's "send now") rather than waited for.
            assert notifications.send_now(messages.values_list("pk", flat=True)) == 4
            jobs = TaskRun.objects.filter(task=notifications.SEND_REF)
            wait_for(lambda: set(jobs.values_list("state", flat=True)) == {"succeeded"}, 60,
                     message="the four messages to be sent")
            for address in ("ops@example.com", "lead@example.com"):
                (mail,) = mailbox.to(address)
                assert mail["Subject"] == "[orchestrator] Digest of 200 notifications: 200 run failed"
                assert mail["From"] == "orchestrator@localhost"
                assert "Run failed: 200 (storm 200)" in Mailbox.body(mail)
            assert len(chat.to("/slack")) == 1 and len(chat.to("/teams")) == 1
            assert jobs.count() == 4 and set(NotificationMessage.objects.values_list("count", flat=True)) == {200}
    finally:
        chat.stop()
