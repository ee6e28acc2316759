"""Webhooks: when a run of a workflow ends, each URL in ``workflow.webhooks`` receives a POST.

Each delivery is a WebhookDelivery row plus a job (``orchestrator.notifier:deliver``) created in
the same transaction as the run's end, so a delivery is never lost and is retried with the jobs'
backoff. The body is JSON; the header ``X-Orchestrator-Signature: sha256=<hex>`` is the
HMAC-SHA256 of the exact body bytes with ``ORCHESTRATOR_WEBHOOK_SECRET`` (a secret of its own,
never ``SECRET_KEY``; without one, in development, calls carry no signature). A receiver checks
it with ``hmac.compare_digest``. A delivery can arrive more than once (jobs run at least once).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from collections.abc import Sequence

from orchestrator import clock
from orchestrator.conf import app_settings
from orchestrator.jobs import enqueue
from orchestrator.models import Run, WebhookDelivery
from orchestrator.registry import job

DELIVER_REF = "orchestrator.notifier:deliver"
MAX_ATTEMPTS = 5
TIMEOUT_SECONDS = 10
SIGNATURE_HEADER = "X-Orchestrator-Signature"


class DeliveryFailed(Exception):
    pass


def sign(body: bytes, secret: str | None = None) -> str:
    secret = app_settings.WEBHOOK_SECRET if secret is None else secret
    return "sha256=" + hmac.new((secret or "").encode(), body, hashlib.sha256).hexdigest()


def runs_finished(finished: Sequence[tuple[int, str]]) -> int:
    """Create the deliveries for runs that just ended (inside their transaction)."""
    if not finished:
        return 0
    states = dict(finished)
    runs = Run.objects.filter(pk__in=states, workflow__isnull=False).select_related("workflow")
    count = 0
    for run in runs:
        for url in run.workflow.webhooks or []:
            delivery = WebhookDelivery.objects.create(run=run, url=url, event=f"run.{states[run.pk]}")
            _enqueue(delivery)
            count += 1
    return count


def deadline_missed(run_ids: Sequence[int]) -> int:
    """Deliveries of the event ``deadline_missed`` for runs just recorded as late."""
    count = 0
    for run in Run.objects.filter(pk__in=run_ids, workflow__isnull=False).select_related("workflow"):
        for url in run.workflow.webhooks or []:
            _enqueue(WebhookDelivery.objects.create(run=run, url=url, event="deadline_missed"))
            count += 1
    return count


def _enqueue(delivery: WebhookDelivery) -> None:
    """The delivery runs as a one-off job: up to MAX_ATTEMPTS POSTs in all, backing off between them."""
    enqueue(DELIVER_REF, kwargs={"delivery_id": delivery.pk}, max_attempts=MAX_ATTEMPTS, timeout=60,
            spec_extra={"retry_delay": app_settings.WEBHOOK_RETRY_SECONDS, "retry_backoff": 2.0,
                        "retry_max_delay": 600.0})


def payload(run: Run, event: str) -> dict:
    def iso(value):
        return value.isoformat() if value else None

    return {
        "event": event, "run_id": run.pk, "workflow": run.workflow.name if run.workflow_id else None,
        "state": run.state, "logical_date": iso(run.logical_date), "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at), "trigger": run.trigger, "params": run.params,
        "deadline_at": iso(run.deadline_at), "deadline_missed_at": iso(run.deadline_missed_at),
    }


@job
def deliver(delivery_id: int) -> dict:
    """The job: POST once; a non-2xx answer or a network error raises, so the job is retried."""
    delivery = WebhookDelivery.objects.select_related("run__workflow").get(pk=delivery_id)
    if delivery.state == WebhookDelivery.State.DELIVERED:
        return {"status": delivery.status_code, "already": True}
    body = json.dumps(payload(delivery.run, delivery.event), sort_keys=True).encode()
    request = urllib.request.Request(delivery.url, data=body, method="POST", headers={
        "Content-Type": "application/json", **({SIGNATURE_HEADER: sign(body)} if app_settings.WEBHOOK_SECRET else {}),
        "User-Agent": "orchestrator-webhook/1", "X-Orchestrator-Event": delivery.event,
        "X-Orchestrator-Delivery": str(delivery.pk),
    })
    status, error = None, ""
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - operator's URL
            status = response.status
    except urllib.error.HTTPError as exc:
        status, error = exc.code, f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    delivered = status is not None and 200 <= status < 300
    attempts = delivery.attempts + 1
    final = not delivered and attempts >= MAX_ATTEMPTS
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts, status_code=status, last_error=error,
        state=WebhookDelivery.State.DELIVERED if delivered else (
            WebhookDelivery.State.FAILED if final else WebhookDelivery.State.PENDING),
        delivered_at=clock.now() if delivered else None,
    )
    if not delivered:
        raise DeliveryFailed(f"webhook {delivery.url} failed (attempt {attempts}): {error or status}")
    return {"status": status}
