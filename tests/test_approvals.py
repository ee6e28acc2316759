"""Approval tasks: a short attempt asks the question, then the task run awaits the answer holding
no worker; a person answers on the "Waiting for you" page, the run's page, the API or a signed
link in an email; the answer is the task's result downstream, recorded in the audit log; a
rejecting answer fails the task; no answer in time follows the retry rule. Runs execute in this
process with an injected clock, as a worker's claims and completions."""

from __future__ import annotations

import re
import threading

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from orchestrator import access, approvals
from orchestrator import clock as process_clock
from orchestrator.models import Approval, Attempt, AuditEvent, Run, TaskRun
from orchestrator.runs import trigger_workflow
from tests.support.api_support import client_for, make_user
from tests.support.features_support import sync_module, worker_loop
from tests.support.inbox_support import Mailbox, SmtpServer
from tests.test_execution_rules import execute_claimed

MODULE = '''
from orchestrator.dsl import Notify, Param, Workflow

payout = Workflow("payout", params={{"amount": Param(int, default=100)}},
                  notify=[Notify(on="approval_requested", email=["boss@example.com"])])

@payout.task
def check(ctx):
    return {{"iban_ok": True}}

pay_ok = payout.approval("pay_ok", ask="Pay out {{params[amount]}} EUR? IBAN ok: {{upstream[check][iban_ok]}}",
                         options=["approve", "reject"], form={{"comment": Param(str, default="")}},
                         timeout=3600, groups=["payments"], retries={retries})

@payout.task
def pay(ctx):
    return ctx.upstream["pay_ok"]

check >> pay_ok >> pay
'''


def workflow(tmp_path, retries=0):
    return sync_module(tmp_path, MODULE.format(retries=retries))["payout"]


@pytest.fixture
def loop(db):
    return worker_loop()


@pytest.fixture(autouse=True)
def one_clock(clock):
    """The pages and the API read the process clock: the test's clock, so an answer is due when the
    claims (on the test's clock) look."""
    with process_clock.pinned(clock):
        yield


def run_all(loop, clock, rounds: int = 50) -> int:
    claimed = 0
    for _ in range(rounds):
        done = execute_claimed(loop, 10, clock)
        if not done:
            return claimed
        claimed += len(done)
    raise AssertionError("work kept coming")


def states(run) -> dict:
    return dict(TaskRun.objects.filter(run=run).values_list("task", "state"))


def asked(tmp_path, loop, clock, retries=0):
    run, _ = trigger_workflow(workflow(tmp_path, retries), now=clock.now())
    run_all(loop, clock)
    return run, Approval.objects.get(run=run)


def payments_member(name="pat"):
    """A viewer (who reads the pages) in the group the approval names (who may answer it)."""
    user = make_user(name, access.VIEWERS)
    user.groups.add(Group.objects.get_or_create(name="payments")[0])
    return user


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_an_approval_waits_holding_no_worker_and_the_pages_answer_goes_downstream(tmp_path, loop, clock):
    run, approval = asked(tmp_path, loop, clock)
    assert states(run) == {"check": "succeeded", "pay_ok": "awaiting", "pay": "waiting"}
    assert approval.question == "Pay out 100 EUR? IBAN ok: True" and approval.state == "open"
    assert Attempt.objects.get(task_run=approval.task_run).outcome == "asked"
    # Waiting holds nothing: a worker finds nothing of the run to claim, however long it waits
    # (only the job that mails the notification of the question).
    clock.advance(1800)
    assert [m["task"] for m in execute_claimed(loop, 10, clock)] == ["orchestrator.notifier:send_message"]
    assert execute_claimed(loop, 10, clock) == []

    member, outsider = payments_member(), make_user("vic", access.VIEWERS)
    page = logged_in(member).get(reverse("orchestrator:web:approvals")).content.decode()
    assert "Pay out 100 EUR?" in page and f'id="answer-{approval.pk}-approve"' in page
    assert "No approval waits for your answer" in logged_in(outsider).get(
        reverse("orchestrator:web:approvals")).content.decode()
    answer_url = reverse("orchestrator:web:approval_answer", args=[approval.pk])
    assert logged_in(outsider).post(answer_url, {"answer": "approve"}).status_code == 403
    # The run's page shows it to those who may answer, with the same form.
    assert f'id="answer-{approval.pk}-approve"' in logged_in(member).get(
        reverse("orchestrator:web:run", args=[run.pk])).content.decode()

    response = logged_in(member).post(answer_url, {"answer": "approve", "field-comment": "looks right"}, follow=True)
    assert "Recorded: approve for pay_ok" in response.content.decode()
    approval.refresh_from_db()
    assert (approval.state, approval.answer, approval.values, approval.answered_by, approval.answered_via) == (
        "answered", "approve", {"comment": "looks right"}, member, "page")
    run_all(loop, clock)
    assert states(run) == {"check": "succeeded", "pay_ok": "succeeded", "pay": "succeeded"}
    result = TaskRun.objects.get(run=run, task="pay").result
    assert {key: result[key] for key in ("answer", "form", "by")} == {
        "answer": "approve", "form": {"comment": "looks right"}, "by": "pat"}
    assert Run.objects.get(pk=run.pk).state == "succeeded"
    event = AuditEvent.objects.get(action="answer")
    assert (event.actor_name, event.target_id, event.detail["answer"], event.detail["via"]) == (
        "pat", str(approval.task_run_id), "approve", "page")
    # A second answer does not count, and says why.
    again = logged_in(member).post(answer_url, {"answer": "reject"}, follow=True).content.decode()
    assert "Your answer was not recorded: already answered: pat chose &#x27;approve&#x27; at" in again


@pytest.mark.django_db
def test_the_api_answers_a_reject_fails_the_task_and_bad_answers_are_refused_clearly(tmp_path, loop, clock):
    run, approval = asked(tmp_path, loop, clock)
    operator = make_user("olga", access.OPERATORS)
    api = client_for(operator)
    listed = api.get("/api/approvals/").json()
    assert [(a["id"], a["question"], a["options"]) for a in listed] == [
        (approval.pk, "Pay out 100 EUR? IBAN ok: True", ["approve", "reject"])]
    url = f"/api/approvals/{approval.pk}/answer/"
    bad = api.post(url, {"answer": "maybe"}, format="json")
    assert bad.status_code == 400 and "'maybe' is not an answer to this question" in bad.json()["detail"]
    assert api.post(url, {"answer": "approve", "form": {"tip": 1}}, format="json").json()["tip"] == [
        "unknown param 'tip' (declared params: comment)"]
    assert client_for(make_user("vic", access.VIEWERS)).post(url, {"answer": "approve"}, format="json").status_code == 403
    answered = api.post(url, {"answer": "reject", "form": {"comment": "wrong IBAN"}}, format="json")
    assert answered.status_code == 200 and answered.json()["answered_by_name"] == "olga"
    run_all(loop, clock)
    assert states(run) == {"check": "succeeded", "pay_ok": "failed", "pay": "upstream_failed"}
    assert TaskRun.objects.get(run=run, task="pay_ok").error == "rejected by olga: reject"
    assert Run.objects.get(pk=run.pk).state == "failed"
    late = api.post(url, {"answer": "approve"}, format="json")
    assert late.status_code == 409 and late.json()["detail"].startswith("already answered: olga chose 'reject' at ")


@pytest.mark.django_db
def test_no_answer_in_time_asks_again_then_dead_letters_and_the_run_fails(tmp_path, loop, clock):
    run, first = asked(tmp_path, loop, clock, retries=1)
    clock.advance(3599)
    assert approvals.expire(clock.now()) == 0
    clock.advance(1)
    assert approvals.expire(clock.now()) == 1
    run_all(loop, clock)  # asked again
    first.refresh_from_db()
    second = Approval.objects.get(run=run, number=2)
    assert first.state == "timed_out" and second.state == "open" and states(run)["pay_ok"] == "awaiting"
    clock.advance(3600)
    assert approvals.expire(clock.now()) == 1
    task_run = TaskRun.objects.get(run=run, task="pay_ok")
    assert (task_run.state, task_run.error) == ("dead", "no answer within 3600s")
    assert states(run)["pay"] == "upstream_failed" and Run.objects.get(pk=run.pk).state == "failed"
    with pytest.raises(approvals.AnswerRefused, match="no longer open: no answer came before its timeout"):
        approvals.answer(second.pk, approvals.Answer("approve", {}, by_name="late"))


@pytest.mark.django_db(transaction=True)
def test_an_emails_signed_link_answers_and_of_two_clicks_at_once_one_counts(tmp_path, loop, clock, settings):
    settings.ORCHESTRATOR_BASE_URL = "https://orch.example.com"
    with SmtpServer() as mailbox:
        settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                                        "OPTIONS": {"host": "127.0.0.1", "port": mailbox.port, "timeout": 10}}}
        run, approval = asked(tmp_path, loop, clock)
        clock.advance(60)  # the notification's window
        run_all(loop, clock)
        (mail,) = mailbox.to("boss@example.com")
    assert mail["Subject"] == "[orchestrator] Approval needed: Pay out 100 EUR? IBAN ok: True"
    body = Mailbox.body(mail)
    links = dict(re.findall(r"  (approve|reject): https://orch\.example\.com(/approvals/answer/\S+/)", body))
    assert set(links) == {"approve", "reject"}
    # Opening a link answers nothing (mail scanners follow links): it asks to confirm.
    page = Client().get(links["approve"])
    assert page.status_code == 200 and 'id="confirm"' in page.content.decode()
    assert Approval.objects.get(pk=approval.pk).state == "open"
    assert Client().get(links["approve"][:-5] + "xxxx/").status_code == 400

    answers, start = {}, threading.Barrier(2)

    def click(option):
        client = Client()
        client.get(links[option])  # the CSRF cookie, as a browser would have it
        start.wait(10)
        answers[option] = client.post(links[option], {"csrfmiddlewaretoken": client.cookies["csrftoken"].value})

    threads = [threading.Thread(target=click, args=(option,)) for option in ("approve", "reject")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    statuses = sorted(response.status_code for response in answers.values())
    assert statuses == [200, 409]
    approval.refresh_from_db()
    winner = approval.answer
    loser = next(option for option in answers if option != winner)
    assert f"Recorded: {winner}" in answers[winner].content.decode()
    assert "Already answered: boss@example.com chose" in answers[loser].content.decode()
    assert (approval.answered_by_name, approval.answered_via) == ("boss@example.com", "link")
    assert AuditEvent.objects.filter(action="answer").count() == 1
    assert states(run)["pay_ok"] == ("succeeded" if winner == "approve" else "failed")
