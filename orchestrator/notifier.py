"""What goes out: webhooks when a run ends or misses its deadline, and the messages of
notifications (``orchestrator.notifications``): emails and chat posts.

**Webhooks**: each URL in ``workflow.webhooks`` receives a POST. Each delivery is a
WebhookDelivery row plus a job (``orchestrator.notifier:deliver``) created in the same
transaction as the run's end, so a delivery is never lost and is retried with the jobs' backoff.
The body is JSON; the header ``X-Orchestrator-Signature: sha256=<hex>`` is the HMAC-SHA256 of the
exact body bytes with ``ORCHESTRATOR_WEBHOOK_SECRET`` (a secret of its own, never ``SECRET_KEY``;
without one, in development, calls carry no signature). A receiver checks it with
``hmac.compare_digest``. A delivery can arrive more than once (jobs run at least once).

**Messages**: ``send_message`` (a job) sends one NotificationMessage: an email through Django's
email backend (the ``EMAIL_*`` settings), or a chat post through the same signed POST as the
webhooks, with a body Slack's incoming webhooks (``text`` and ``blocks``) or Teams' (a message
with an Adaptive Card) take. The words are ``orchestrator.notices``'.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from collections.abc import Sequence

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction

from orchestrator import clock, notices, notifications, retries
from orchestrator.conf import app_settings
from orchestrator.jobs import enqueue
from orchestrator.models import NotificationMessage, Run, WebhookDelivery
from orchestrator.registry import job

DELIVER_REF = "orchestrator.notifier:deliver"
TIMEOUT_SECONDS = 10
SIGNATURE_HEADER = "X-Orchestrator-Signature"


class DeliveryFailed(Exception):
    pass


def sign(body: bytes, secret: str | None = None) -> str:
    secret = app_settings.WEBHOOK_SECRET if secret is None else secret
    return "sha256=" + hmac.new((secret or "").encode(), body, hashlib.sha256).hexdigest()


def runs_finished(finished: Sequence[tuple[int, str]], now=None) -> int:
    """The webhooks and notifications of workflow runs that just ended (inside their transaction):
    one read of their workflows and rules for both. Returns how many deliveries were made."""
    facts = notifications.about_runs([run_id for run_id, _ in finished])
    states = dict(finished)
    notifications.runs_event(facts, now=now)
    return _deliveries([(f.run_id, url, f"run.{states[f.run_id]}") for f in facts for url in f.webhooks])


def deadline_missed(run_ids: Sequence[int], now=None) -> int:
    """The webhooks (event ``deadline_missed``) and notifications of runs just recorded as late."""
    facts = notifications.about_runs(run_ids, event="deadline_missed")
    notifications.runs_event(facts, now=now)
    return _deliveries([(f.run_id, url, "deadline_missed") for f in facts for url in f.webhooks])


def _deliveries(calls: list[tuple[int, str, str]]) -> int:
    for run_id, url, event in calls:
        _enqueue(WebhookDelivery.objects.create(run_id=run_id, url=url, event=event))
    return len(calls)


def _enqueue(delivery: WebhookDelivery) -> None:
    """The delivery runs as a one-off job, retried by the webhooks' policy (``retries.webhooks``)."""
    enqueue(DELIVER_REF, kwargs={"delivery_id": delivery.pk}, retry=retries.webhooks(), timeout=60)


def payload(run: Run, event: str) -> dict:
    def iso(value):
        return value.isoformat() if value else None

    return {
        "event": event, "run_id": run.pk, "workflow": run.workflow.name if run.workflow_id else None,
        "state": run.state, "logical_date": iso(run.logical_date), "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at), "trigger": run.trigger, "params": run.params,
        "deadline_at": iso(run.deadline_at), "deadline_missed_at": iso(run.deadline_missed_at),
    }


def post(url: str, body: bytes, headers: dict) -> tuple[int | None, str]:
    """POST a JSON body, signed; returns (HTTP status or None, error text or "")."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", **({SIGNATURE_HEADER: sign(body)} if app_settings.WEBHOOK_SECRET else {}),
        "User-Agent": "orchestrator-webhook/1", **headers,
    })
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - operator's URL
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        return None, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"


@job
def deliver(delivery_id: int) -> dict:
    """The job: POST once; a non-2xx answer or a network error raises, so the job is retried."""
    delivery = WebhookDelivery.objects.select_related("run__workflow").get(pk=delivery_id)
    if delivery.state == WebhookDelivery.State.DELIVERED:
        return {"status": delivery.status_code, "already": True}
    body = json.dumps(payload(delivery.run, delivery.event), sort_keys=True).encode()
    status, error = post(delivery.url, body, {"X-Orchestrator-Event": delivery.event,
                                              "X-Orchestrator-Delivery": str(delivery.pk)})
    delivered = status is not None and 200 <= status < 300
    attempts = delivery.attempts + 1
    final = not delivered and attempts >= retries.webhooks().max_attempts
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts, status_code=status, last_error=error,
        state=WebhookDelivery.State.DELIVERED if delivered else (
            WebhookDelivery.State.FAILED if final else WebhookDelivery.State.PENDING),
        delivered_at=clock.now() if delivered else None,
    )
    if not delivered:
        raise DeliveryFailed(f"webhook {delivery.url} failed (attempt {attempts}): {error or status}")
    return {"status": status}


# --- notification messages ---------------------------------------------------------------------

def close(message_id: int) -> NotificationMessage | None:
    """Close a gathering message (or take up one whose sending failed): the guarded update waits
    for the transactions adding to it, so what it carries is known once it returns. None when it
    was sent already."""
    Message = NotificationMessage
    with transaction.atomic():
        Message.objects.filter(pk=message_id, state=Message.State.PENDING).update(state=Message.State.SENDING)
        message = Message.objects.get(pk=message_id)
        if message.state == Message.State.SENT:
            return None
        message.count = message.notifications.count()
        Message.objects.filter(pk=message_id).update(count=message.count)
    return message


@job
def send_message(message_id: int) -> dict:
    """The job that sends one message: the event alone, or the digest of its window. An error
    raises, so the job is retried; after its last attempt it is in the dead-letter queue (and the
    message ``failed``), from where a retry sends it again."""
    message = close(message_id)
    if message is None:
        return {"already": True}
    notice = notices.compose(message)
    if message.channel == "email":
        error = _email(message.address, notice)
    else:
        body = notices.slack(notice) if message.channel == "slack" else notices.teams(notice)
        status, error = post(message.address, json.dumps(body).encode(), {
            "X-Orchestrator-Event": "notification", "X-Orchestrator-Delivery": f"message-{message.pk}"})
        if not error and not (status is not None and 200 <= status < 300):
            error = f"HTTP {status}"
    attempts = message.attempts + 1
    Message = NotificationMessage
    if error:
        Message.objects.filter(pk=message.pk).update(
            attempts=attempts, last_error=error[:2000],
            state=Message.State.FAILED if attempts >= notifications.SEND_ATTEMPTS else Message.State.SENDING)
        raise DeliveryFailed(f"message #{message.pk} to {message.recipient} failed (attempt {attempts}): {error}")
    Message.objects.filter(pk=message.pk).update(attempts=attempts, last_error="", state=Message.State.SENT,
                                                 sent_at=clock.now())
    return {"recipient": message.recipient, "events": message.count}


def _email(address: str, notice: notices.Notice) -> str:
    """Send one email through the project's email backend; returns the error, or ""."""
    mail = EmailMessage(subject=notice.subject, body=notice.text_for_email(address),
                        from_email=settings.DEFAULT_FROM_EMAIL, to=[address])
    try:
        mail.send()
    except Exception as exc:  # noqa: BLE001 - any backend's failure (SMTP, socket, TLS) is a failed attempt
        return f"{type(exc).__name__}: {exc}"
    return ""
