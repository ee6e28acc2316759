"""Notifications people get: an email or a chat post when a run fails or succeeds, a deadline is
missed, a sensor times out or an approval is asked for.

Who hears of what comes from two kinds of rules:

* a workflow's own, in its module: ``Workflow(..., notify=[Notify(on=["run_failed"],
  email=["data-team@example.com"], slack=["https://hooks.slack.com/..."])])``, stored with its graph;
* the installation's, in the admin (``NotificationRule``): the same for every workflow, or for
  the workflows or tenants it names.

An event is recorded where it happens, in that transaction (a worker's completion batch, the
scheduler's deadline check), as one ``Notification`` per recipient; nothing is sent there. The
rules are read in the statement that already reads the ended runs for their webhooks, so a run
end costs no statement more when no rule applies.

**Digests.** Each recipient's notifications gather in its pending ``NotificationMessage``: the
first event for a quiet recipient opens one, due ``ORCHESTRATOR_NOTIFY_DIGEST_SECONDS`` (60)
later, with its sending job (``orchestrator.notifier:send_message``) due then; every event until
then joins it. At the due time the job sends one message: the event itself when it is alone, a
digest otherwise. A storm of 200 failures in a minute is one digest per recipient, and nobody
gets more than one message per window.

**No event lost, none sent twice.** The database holds at most one pending message per recipient
(a unique partial index). Every transaction that adds to it locks it (``OPEN_MESSAGES``, an
upsert), and the job closes it with a guarded update that waits for those locks, then reads its
notifications in a statement of its own: an event is either in the message the job sends or,
committed after the close, opens the next one. (Sending is a job, so it runs at least once: an
attempt that fails after the server took the mail sends it again.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction

from orchestrator import clock, retries
from orchestrator.channels import wake_due
from orchestrator.conf import app_settings
from orchestrator.jobs import enqueue
from orchestrator.models import Notification, NotificationMessage, TaskRun
from orchestrator.people import MessageState
from orchestrator.states import TaskState

SEND_REF = "orchestrator.notifier:send_message"
SEND_ATTEMPTS = retries.DELIVERY_ATTEMPTS
CHANNELS = ("email", "slack", "teams")

# --- SQL ---------------------------------------------------------------------------------------

# The installation's rules that apply to an event of a workflow, as a JSON list (never more than a
# handful of rows: the rules table is the admin's).
_INSTALLATION_RULES = """
    SELECT jsonb_agg(jsonb_build_object('email', n.emails, 'slack', n.slack, 'teams', n.teams))
    FROM orchestrator_notificationrule n
    WHERE n.enabled AND {event} = ANY (n.events)
      AND (cardinality(n.workflows) = 0 OR w.name = ANY (n.workflows))
      AND (cardinality(n.tenants) = 0 OR w.tenant = ANY (n.tenants))"""

# What the end of some workflow runs calls for: their webhooks (notifier) and the rules that
# apply (the workflow's, from the graph the run follows, and the installation's). The event of a
# run is "run_" and its state (run_failed, run_succeeded), or the one given (deadline_missed).
ABOUT_RUNS = f"""
SELECT r.id, e.event, w.name, w.webhooks, COALESCE(v.spec->'notify', '[]'::jsonb),
       COALESCE(({_INSTALLATION_RULES.format(event="e.event")}), '[]'::jsonb)
FROM orchestrator_run r
JOIN orchestrator_workflow w ON w.id = r.workflow_id
LEFT JOIN orchestrator_workflowversion v ON v.id = r.version_id
CROSS JOIN LATERAL (SELECT COALESCE(%(event)s, 'run_' || r.state) AS event) e
WHERE r.id = ANY (%(runs)s)
"""

# The same for events of task runs (a sensor timed out, an approval is asked for).
ABOUT_TASK_RUNS = f"""
SELECT t.id, t.task, r.id, w.name, COALESCE(v.spec->'notify', '[]'::jsonb),
       COALESCE(({_INSTALLATION_RULES.format(event="%(event)s")}), '[]'::jsonb)
FROM orchestrator_taskrun t
JOIN orchestrator_run r ON r.id = t.run_id
JOIN orchestrator_workflow w ON w.id = r.workflow_id
LEFT JOIN orchestrator_workflowversion v ON v.id = r.version_id
WHERE t.id = ANY (%(ids)s)
"""

# The pending message of each recipient: opened (due at the end of its window) where there is
# none, and locked either way (the no-op update of ON CONFLICT locks the row it finds), so the
# job cannot close it before this transaction's notifications are in. Recipients in sorted
# order: two transactions lock the messages they share in the same order. ``opened``: whether
# this statement inserted the row (xmax is 0 only for a row version no one locked or updated).
OPEN_MESSAGES = f"""
INSERT INTO orchestrator_notificationmessage AS m
    (recipient, state, due_at, created_at, sent_at, count, attempts, last_error)
SELECT recipient, '{MessageState.PENDING}', %(due)s, %(now)s, NULL, 0, 0, ''
FROM unnest(%(recipients)s::text[]) AS recipient
ORDER BY recipient
ON CONFLICT (recipient) WHERE state = '{MessageState.PENDING}' DO UPDATE SET recipient = m.recipient
RETURNING m.id, m.recipient, m.xmax = 0 AS opened, m.due_at
"""


# --- recording events --------------------------------------------------------------------------

@dataclass
class Event:
    """One thing that happened, and who is to hear of it (``recipients``: "email:…", "slack:…",
    "teams:…")."""

    event: str
    workflow: str
    run_id: int | None = None
    task: str = ""
    task_run_id: int | None = None
    detail: dict = field(default_factory=dict)
    recipients: list[str] = field(default_factory=list)


@dataclass
class RunFacts:
    """What ABOUT_RUNS says of one run: its webhooks, and who is to hear of the event."""

    run_id: int
    event: str
    workflow: str
    webhooks: list[str]
    recipients: list[str]


def _json(value):
    return json.loads(value) if isinstance(value, str) else (value or [])


def recipients_of(event: str, workflow_rules, installation_rules) -> list[str]:
    """The recipients the rules name for ``event``: the workflow's rules that list it, and the
    installation's (which the query chose by event already), each recipient once."""
    found: dict[str, None] = {}
    rules = [rule for rule in _json(workflow_rules) if event in rule.get("on", [])] + _json(installation_rules)
    for rule in rules:
        for channel in CHANNELS:
            for address in rule.get(channel) or []:
                found[f"{channel}:{address}"] = None
    return list(found)


def about_runs(run_ids: Sequence[int], event: str | None = None) -> list[RunFacts]:
    """The webhooks and recipients of workflow runs' ``event`` (by default their end, from their
    state: run_failed, run_succeeded, ...). Runs of no workflow (jobs) are left out."""
    if not run_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(ABOUT_RUNS, {"runs": sorted(set(run_ids)), "event": event})
        rows = cursor.fetchall()
    return [RunFacts(run_id, name, workflow, _json(webhooks), recipients_of(name, own, installation))
            for run_id, name, workflow, webhooks, own, installation in rows]


def runs_event(facts: Iterable[RunFacts], detail: dict[int, dict] | None = None, now: datetime | None = None) -> int:
    """Record the notifications of runs' events (``about_runs``); returns how many were made."""
    detail = detail or {}
    return record([Event(f.event, f.workflow, run_id=f.run_id, detail=detail.get(f.run_id, {}),
                         recipients=f.recipients) for f in facts if f.recipients], now=now)


def task_runs_event(event: str, task_run_ids: Sequence[int], detail: dict[int, dict] | None = None,
                    now: datetime | None = None) -> int:
    """Record the notifications of an event of some task runs (a sensor timed out, an approval is
    asked for); returns how many were made. One statement when no rule names the event."""
    if not task_run_ids:
        return 0
    detail = detail or {}
    with connection.cursor() as cursor:
        cursor.execute(ABOUT_TASK_RUNS, {"ids": sorted(set(task_run_ids)), "event": event})
        rows = cursor.fetchall()
    return record([Event(event, workflow, run_id=run_id, task=task, task_run_id=task_run_id,
                         detail=detail.get(task_run_id, {}), recipients=recipients_of(event, own, installation))
                   for task_run_id, task, run_id, workflow, own, installation in rows], now=now)


def sensor_timed_out(task_run_ids: Sequence[int], errors: dict[int, str] | None = None, now=None) -> int:
    return task_runs_event("sensor_timed_out", task_run_ids,
                           {key: {"error": error} for key, error in (errors or {}).items()}, now=now)


def record(events: Sequence[Event], now: datetime | None = None) -> int:
    """Add the events to their recipients' pending messages, opening (and scheduling the sending
    of) those that are not gathering yet; in the caller's transaction. Returns how many
    notifications were made."""
    events = [event for event in events if event.recipients]
    if not events:
        return 0
    now = now or clock.now()
    due = now + timedelta(seconds=app_settings.NOTIFY_DIGEST_SECONDS)
    recipients = sorted({recipient for event in events for recipient in event.recipients})
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(OPEN_MESSAGES, {"recipients": recipients, "due": due, "now": now})
        messages = {recipient: (message_id, opened, due_at)
                    for message_id, recipient, opened, due_at in cursor.fetchall()}
        made = Notification.objects.bulk_create([
            Notification(message_id=messages[recipient][0], event=event.event, run_id=event.run_id,
                         workflow=event.workflow[:200], task=event.task[:255], task_run_id=event.task_run_id,
                         detail=event.detail, created_at=now)
            for event in events for recipient in event.recipients
        ])
        for message_id, opened, due_at in messages.values():
            if opened:
                _schedule(message_id, due_at, now)
    return len(made)


def _schedule(message_id: int, due_at: datetime, now: datetime) -> None:
    """The job that sends a message, due when its window ends: retried with backoff, and in the
    dead-letter queue after its last attempt."""
    enqueue(SEND_REF, kwargs={"message_id": message_id}, run_after=due_at, retry=retries.webhooks(), timeout=120,
            now=now)


def send_now(message_ids: Iterable[int], now: datetime | None = None) -> int:
    """Send gathering messages at once rather than at the end of their window (the admin's
    action); returns how many were brought forward."""
    now = now or clock.now()
    ids = list(NotificationMessage.objects.filter(pk__in=list(message_ids), state=NotificationMessage.State.PENDING)
               .values_list("pk", flat=True))
    if not ids:
        return 0
    with transaction.atomic():
        NotificationMessage.objects.filter(pk__in=ids, state=NotificationMessage.State.PENDING).update(due_at=now)
        # The sending job of each: the one scheduled run of SEND_REF for that message id.
        brought = TaskRun.objects.filter(
            task=SEND_REF, state=TaskState.SCHEDULED, spec__kwargs__message_id__in=ids, due_at__gt=now,
        ).update(due_at=now)
        wake_due()
    return brought


def prune_messages(before: datetime, batch: int = 1000, max_batches: int = 20) -> int:
    """Delete messages sent (or given up on) before ``before``, with the notifications they carry,
    in batches (retention calls it with its cutoff); returns how many messages went."""
    done = (MessageState.SENT, MessageState.FAILED)
    deleted = 0
    for _ in range(max_batches):
        ids = list(NotificationMessage.objects.filter(state__in=done, created_at__lt=before)
                   .order_by("id").values_list("pk", flat=True)[:batch])
        if not ids:
            break
        with transaction.atomic():
            Notification.objects.filter(message_id__in=ids).delete()
            deleted += NotificationMessage.objects.filter(pk__in=ids).delete()[0]
    return deleted
