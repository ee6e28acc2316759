"""Approvals with real processes: a real worker asks the question and runs what follows the
answer; a real scheduler times an unanswered one out; answers come from the API while the worker
runs, with the approval's email received by a real SMTP server."""

from __future__ import annotations

import pytest

from orchestrator import access, notifications
from orchestrator.models import Approval, NotificationMessage, Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support.api_support import client_for, make_user
from tests.support.inbox_support import Mailbox, SmtpServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def approval_spec(timeout=None):
    return {"kind": "python", "ref": "orchestrator.approvals:ask", "upstream": ["check"], "max_attempts": 1,
            "approval": {"ask": "Pay out {params[amount]} EUR?", "options": ["approve", "reject"],
                         "reject": ["reject"], "form": {"comment": {"type": "str", "required": False, "default": ""}},
                         "timeout": timeout, "groups": []}}


def payout(timeout=None) -> Workflow:
    echo = "tests.support.tasks_for_tests:context_echo"
    spec = {"tasks": {"check": {"kind": "python", "ref": echo, "upstream": []},
                      "pay_ok": approval_spec(timeout),
                      "pay": {"kind": "python", "ref": echo, "upstream": ["pay_ok"]}},
            "notify": [{"on": ["approval_requested"], "email": ["boss@example.com"], "slack": [], "teams": []}]}
    workflow = Workflow.objects.create(name=f"payout-{timeout}")
    workflow.current_version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="h1", spec=spec)
    workflow.save()
    return workflow


def task_state(run, task):
    return TaskRun.objects.filter(run=run, task=task).values_list("state", flat=True).first()


def test_a_real_worker_asks_the_api_answers_and_the_worker_runs_what_follows(processes):
    with SmtpServer() as mailbox:
        env = process_env(EMAIL_HOST="127.0.0.1", EMAIL_PORT=mailbox.port, ORCHESTRATOR_POLL_SECONDS="0.2",
                          ORCHESTRATOR_BASE_URL="https://orch.example.com")
        processes.start("worker", "--concurrency", "2", env=env)
        run, _ = create_run(payout(), trigger="manual", params={"amount": 250})
        wait_for(lambda: task_state(run, "pay_ok") == "awaiting", 60, message="the question to be asked")
        approval = Approval.objects.get(run=run)
        assert approval.question == "Pay out 250 EUR?"
        notifications.send_now(NotificationMessage.objects.values_list("pk", flat=True))
        (mail,) = wait_for(lambda: mailbox.to("boss@example.com"), 30, message="the approval's email")
        assert "https://orch.example.com/approvals/answer/" in Mailbox.body(mail)

        api = client_for(make_user("olga", access.OPERATORS))
        answered = api.post(f"/api/approvals/{approval.pk}/answer/", {"answer": "approve", "form": {"comment": "ok"}},
                            format="json")
        assert answered.status_code == 200
        wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", 60, message="the run to end")
        upstream = TaskRun.objects.get(run=run, task="pay").result["upstream"]["pay_ok"]
        assert (upstream["answer"], upstream["form"], upstream["by"]) == ("approve", {"comment": "ok"}, "olga")


def test_an_approval_nobody_answers_times_out_through_a_real_scheduler(processes):
    env = process_env(ORCHESTRATOR_POLL_SECONDS="0.2", ORCHESTRATOR_LEASE_SECONDS="2")
    processes.start("worker", "--concurrency", "2", env=env)
    processes.start("scheduler", env=env)
    run, _ = create_run(payout(timeout=1), trigger="manual", params={"amount": 5})
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "failed", 60, message="the run to fail")
    task_run = TaskRun.objects.get(run=run, task="pay_ok")
    assert (task_run.state, task_run.error) == ("dead", "no answer within 1s")
    assert task_state(run, "pay") == "upstream_failed"
    assert Approval.objects.get(run=run).state == "timed_out"
