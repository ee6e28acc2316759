"""Notifications: the rules of a workflow (Notify in its module) and of the installation (the
admin's NotificationRule) turn run failures, deadline misses and sensor timeouts into emails and
chat posts, gathered per recipient so that a storm sends one digest, sent as retried jobs.

Here runs are executed in this process with an injected clock (claims and completions like a
worker's); the emails reach a real SMTP server and the chat posts a real HTTP server.
tests/processes/test_notifications_processes.py does the same with real worker processes."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator import deadlines, notifications
from orchestrator.models import Notification, NotificationMessage, NotificationRule, Run, TaskRun
from orchestrator.runs import trigger_workflow
from orchestrator.validation import validate
from tests.support.features_support import sync_module, worker_loop
from tests.support.inbox_support import ChatReceiver, Mailbox, SmtpServer
from tests.test_execution_rules import execute_claimed

pytestmark = pytest.mark.django_db

SECRET = "notification-test-secret"

MODULE = '''
from orchestrator.dsl import Notify, Param, Workflow

storm = Workflow("storm", deadline=600, params={{"fail": Param(bool, default=True)}},
                 notify=[Notify(on=["run_failed", "deadline_missed"], email=["ops@example.com", "lead@example.com"],
                                slack=["{chat}/slack"], teams=["{chat}/teams"])])

@storm.task
def work(ctx):
    if ctx.params["fail"]:
        raise RuntimeError("the disk is full <!channel>")
    return "ok"

quiet = Workflow("quiet")

@quiet.task
def fails_too(ctx):
    raise RuntimeError("nobody hears of this")

watched = Workflow("watched")

@watched.sensor(every=10, timeout=30)
def never(ctx):
    return False
'''


@pytest.fixture
def chat():
    receiver = ChatReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def mailbox(settings):
    with SmtpServer() as box:
        settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                                        "OPTIONS": {"host": "127.0.0.1", "port": box.port, "timeout": 10}}}
        settings.DEFAULT_FROM_EMAIL = "orchestrator@example.com"
        settings.ORCHESTRATOR_WEBHOOK_SECRET = SECRET
        settings.ORCHESTRATOR_BASE_URL = "https://orch.example.com"
        yield box


@pytest.fixture
def workflows(tmp_path, chat):
    return sync_module(tmp_path, MODULE.format(chat=chat.url))


@pytest.fixture
def loop(db):
    return worker_loop()


def run_all(loop, clock, step: float = 0.0, rounds: int = 200):
    """Claim and execute what is due, as a worker does, until nothing is; ``step`` seconds pass between batches."""
    for _ in range(rounds):
        if not execute_claimed(loop, 50, clock):
            return
        clock.advance(step)
    raise AssertionError("work kept coming")


def pending(recipient: str) -> NotificationMessage:
    return NotificationMessage.objects.get(recipient=recipient, state="pending")


def send_jobs():
    return TaskRun.objects.filter(task=notifications.SEND_REF)


def signed(headers: dict, body: bytes) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("X-Orchestrator-Signature", ""), expected)


def test_200_failures_in_a_minute_send_one_digest_to_each_recipient(workflows, loop, clock, mailbox, chat):
    NotificationRule.objects.create(name="on call", events=["run_failed"], emails=["oncall@example.com"])
    first = clock.now()
    for _ in range(20):  # 200 failures in 50 seconds, 10 every 2.5 s
        for _ in range(10):
            trigger_workflow(workflows["storm"], now=clock.now())
        run_all(loop, clock)
        clock.advance(2.5)
    assert Run.objects.filter(workflow__name="storm", state="failed").count() == 200
    recipients = ["email:lead@example.com", "email:oncall@example.com", "email:ops@example.com",
                  f"slack:{chat.url}/slack", f"teams:{chat.url}/teams"]
    # Every failure went into the one gathering message of each recipient; nothing is sent before
    # the window (60 s from the first failure) ends.
    assert sorted(NotificationMessage.objects.values_list("recipient", flat=True)) == sorted(recipients)
    for recipient in recipients:
        message = pending(recipient)
        assert message.notifications.count() == 200
        assert message.due_at == first + timedelta(seconds=60)
    assert send_jobs().count() == len(recipients)
    assert mailbox.received == [] and chat.posts == []

    clock.set(first + timedelta(seconds=60))
    run_all(loop, clock)
    for address in ("ops@example.com", "lead@example.com", "oncall@example.com"):
        mails = mailbox.to(address)
        assert len(mails) == 1, address
        assert mails[0]["Subject"] == "[orchestrator] Digest of 200 notifications: 200 run failed"
        body = Mailbox.body(mails[0])
        assert "Run failed: 200 (storm 200)" in body
        assert "… and 150 more" in body and "https://orch.example.com/runs/?state=failed" in body
    (slack,) = chat.to("/slack")
    (teams,) = chat.to("/teams")
    assert signed(slack[1], slack[2]) and signed(teams[1], teams[2])
    assert slack[3]["text"] == "[orchestrator] Digest of 200 notifications: 200 run failed"
    assert slack[3]["blocks"][-1]["elements"][0]["url"] == "https://orch.example.com/runs/?state=failed"
    card = teams[3]["attachments"][0]
    assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert card["content"]["body"][0]["text"].startswith("[orchestrator] Digest of 200")
    assert set(NotificationMessage.objects.values_list("state", "count")) == {("sent", 200)}
    assert set(send_jobs().values_list("state", flat=True)) == {"succeeded"}


def test_a_lone_failure_is_one_message_and_a_failure_after_the_window_opens_the_next(workflows, loop, clock,
                                                                                     mailbox, chat):
    run, _ = trigger_workflow(workflows["storm"], now=clock.now())
    run_all(loop, clock)
    clock.advance(60)
    run_all(loop, clock)
    (mail,) = mailbox.to("ops@example.com")
    assert mail["Subject"] == f"[orchestrator] Run failed: storm (run #{run.pk})"
    body = Mailbox.body(mail)
    assert "work after 1 attempt(s): RuntimeError: the disk is full <!channel>" in body
    assert f"https://orch.example.com/runs/{run.pk}/" in body
    # Chat reads markup: the error's "<!channel>" would page a whole channel; it is escaped.
    (slack,) = chat.to("/slack")
    assert "&lt;!channel&gt;" in slack[3]["blocks"][1]["text"]["text"] and "<!channel>" not in slack[2].decode()

    # The window ended with the send: the next failure waits for a window of its own.
    clock.advance(5)
    second, _ = trigger_workflow(workflows["storm"], now=clock.now())
    run_all(loop, clock)
    assert pending("email:ops@example.com").due_at == clock.now() + timedelta(seconds=60)
    clock.advance(60)
    run_all(loop, clock)
    assert [m["Subject"] for m in mailbox.to("ops@example.com")][-1].endswith(f"(run #{second.pk})")
    assert len(mailbox.to("ops@example.com")) == 2


def test_a_run_end_no_rule_names_touches_no_notification_table(workflows, loop, clock):
    NotificationRule.objects.create(name="other events", events=["deadline_missed"], emails=["x@example.com"])
    trigger_workflow(workflows["quiet"], now=clock.now())
    with CaptureQueriesContext(connection) as queries:
        run_all(loop, clock)
    assert Run.objects.get(workflow__name="quiet").state == "failed"
    touched = [q["sql"] for q in queries if "orchestrator_notificationmessage" in q["sql"]
               or "INSERT INTO \"orchestrator_notification\"" in q["sql"]]
    assert touched == []
    assert not Notification.objects.exists()


def test_an_installation_rule_follows_its_workflows_tenants_and_events(workflows, loop, clock):
    NotificationRule.objects.create(name="quiet only", events=["run_failed"], workflows=["quiet"],
                                    emails=["quiet@example.com"])
    NotificationRule.objects.create(name="other tenant", events=["run_failed"], tenants=["finance"],
                                    emails=["finance@example.com"])
    NotificationRule.objects.create(name="disabled", events=["run_failed"], enabled=False, emails=["off@example.com"])
    trigger_workflow(workflows["quiet"], now=clock.now())
    trigger_workflow(workflows["storm"], params={"fail": False}, now=clock.now())
    run_all(loop, clock)
    assert list(Notification.objects.values_list("message__recipient", "event", "workflow")) == [
        ("email:quiet@example.com", "run_failed", "quiet")]


def test_a_missed_deadline_and_a_timed_out_sensor_are_notified(workflows, loop, clock, mailbox):
    NotificationRule.objects.create(name="sensors", events=["sensor_timed_out"], emails=["sensors@example.com"])
    late, _ = trigger_workflow(workflows["storm"], params={"fail": False},
                               logical_date=clock.now() - timedelta(seconds=700), now=clock.now())
    assert deadlines.record_misses(clock.now()) == 1
    sensing, _ = trigger_workflow(workflows["watched"], now=clock.now())
    for _ in range(5):
        run_all(loop, clock)
        clock.advance(10)
    assert TaskRun.objects.get(run=sensing).state == "dead"
    clock.advance(60)
    run_all(loop, clock)
    (miss,) = mailbox.to("ops@example.com")
    assert miss["Subject"] == f"[orchestrator] Deadline missed: storm (run #{late.pk})"
    assert "It was to end by" in Mailbox.body(miss)
    (timeout,) = mailbox.to("sensors@example.com")
    assert timeout["Subject"] == f"[orchestrator] Sensor timed out: watched.never (run #{sensing.pk})"
    assert "sensor timed out: no true answer in 30s" in Mailbox.body(timeout)


def test_a_message_that_cannot_be_sent_is_retried_then_dead_lettered_and_sent_by_a_retry(workflows, loop, clock,
                                                                                         mailbox, chat):
    from orchestrator import control

    NotificationRule.objects.create(name="chat", events=["run_failed"], slack=[f"{chat.url}/flaky"])
    chat.fail = 5
    trigger_workflow(workflows["quiet"], now=clock.now())
    run_all(loop, clock)
    clock.advance(60)
    for _ in range(notifications.SEND_ATTEMPTS):
        run_all(loop, clock)
        clock.advance(700)  # past the longest retry delay
    (job,) = send_jobs()
    message = NotificationMessage.objects.get(recipient=f"slack:{chat.url}/flaky")
    assert (job.state, job.attempts) == ("dead", notifications.SEND_ATTEMPTS)
    assert message.state == "failed" and message.last_error == "HTTP 500 Internal Server Error"
    assert chat.to("/flaky") == []
    control.retry_task_runs([job.pk], now=clock.now())
    run_all(loop, clock)
    assert len(chat.to("/flaky")) == 1
    message.refresh_from_db()
    assert message.state == "sent"


def test_a_gathering_message_can_be_sent_at_once(workflows, loop, clock, mailbox):
    trigger_workflow(workflows["storm"], now=clock.now())
    run_all(loop, clock)
    message = pending("email:ops@example.com")
    assert notifications.send_now([message.pk], now=clock.now()) == 1
    run_all(loop, clock)
    assert len(mailbox.to("ops@example.com")) == 1


def test_bad_notification_rules_are_reported_with_the_field_and_value(tmp_path):
    from orchestrator.dsl import Notify, Workflow

    wf = Workflow("bad", notify=[Notify(on=["run_exploded"], email=["not an address"], slack=["ftp://x"]),
                                 Notify(on="run_failed"), "every failure"])

    wf.shell("only", "true")
    messages = sorted(str(error) for error in validate(wf))
    assert messages == [
        "workflow 'bad': notify[0].email='not an address': must be an email address (at most 254 characters)",
        "workflow 'bad': notify[0].on='run_exploded': unknown event: use run_failed, run_succeeded, "
        "deadline_missed, sensor_timed_out, approval_requested",
        "workflow 'bad': notify[0].slack='ftp://x': must be an http:// or https:// URL",
        "workflow 'bad': notify[1]=Notify(on=['run_failed']): tells nobody: give email=, slack= or teams=",
        "workflow 'bad': notify[2]='every failure': a notification rule is Notify(on=[...], email=[...], "
        "slack=[...], teams=[...])",
    ]


def test_retention_deletes_sent_messages_with_their_notifications_and_keeps_gathering_ones(workflows, loop, clock,
                                                                                           mailbox):
    from orchestrator import retention

    trigger_workflow(workflows["storm"], now=clock.now())
    run_all(loop, clock)
    clock.advance(60)
    run_all(loop, clock)  # sent
    clock.advance(days=31)
    trigger_workflow(workflows["storm"], now=clock.now())
    run_all(loop, clock)  # gathering
    assert set(NotificationMessage.objects.values_list("state", flat=True)) == {"sent", "pending"}
    retention.prune(timedelta(days=30), clock=clock)
    assert set(NotificationMessage.objects.values_list("state", flat=True)) == {"pending"}
    assert not Notification.objects.filter(message__state="sent").exists()
    assert Notification.objects.count() == NotificationMessage.objects.count() == 4
