"""The words of a notification message: its subject, its text and its links, for one event or for
a digest of many, and the JSON bodies Slack's and Teams' incoming webhooks take.

Everything in a message that comes from a run (a workflow's name, an error, a param) is data: it
is escaped for the chat formats that read markup, and a subject is one line.

Links point at ``ORCHESTRATOR_BASE_URL`` (the address of the pages); without it a message has
none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Count
from django.urls import reverse

from orchestrator import approval_links
from orchestrator.conf import app_settings
from orchestrator.models import Approval, Notification, NotificationMessage, Run, TaskRun
from orchestrator.states import TaskState

# How many events a digest lists one by one (it counts all of them).
DIGEST_LINES = 50
# How many failed tasks the message of a failed run names.
FAILED_TASKS = 5
ERROR_CHARS = 300
SUBJECT_CHARS = 200

TITLES = {
    "run_failed": "Run failed", "run_succeeded": "Run succeeded", "deadline_missed": "Deadline missed",
    "sensor_timed_out": "Sensor timed out", "approval_requested": "Approval needed",
}


@dataclass
class Notice:
    subject: str
    lines: list[str]
    link: str = ""  # the page to open
    link_label: str = "Open"
    approval: Approval | None = None  # the question of an approval_requested event

    @property
    def text(self) -> str:
        return "\n".join(self.lines + ([f"\n{self.link_label}: {self.link}"] if self.link else []))

    def text_for_email(self, address: str) -> str:
        """The text, and for an open approval a link per answer that answers it as ``address``
        (signed: the address it was sent to is who answered)."""
        if self.approval is None or self.approval.state != Approval.State.OPEN or not app_settings.BASE_URL:
            return self.text + "\n"
        links = [f"  {option}: {url('orchestrator:web:approval_link', approval_links.token(self.approval.pk, option, address))}"
                 for option in self.approval.options]
        return self.text + "\n\nAnswer here (each link asks you to confirm):\n" + "\n".join(links) + "\n"


@dataclass
class _Counts:
    by_event: Counter = field(default_factory=Counter)
    by_workflow: dict = field(default_factory=dict)


def url(name: str, *args) -> str:
    """The absolute address of a page, or "" without ORCHESTRATOR_BASE_URL."""
    base = app_settings.BASE_URL.rstrip("/")
    return f"{base}{reverse(name, args=args)}" if base else ""


def one_line(text: str, limit: int = SUBJECT_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def compose(message: NotificationMessage) -> Notice:
    """The notice of a closed message: its one event, or the digest of all of them."""
    if message.count == 1:
        return single(message.notifications.get())
    return digest(message)


def single(notification: Notification) -> Notice:
    run = Run.objects.select_related("workflow").filter(pk=notification.run_id).first()
    title = TITLES.get(notification.event, notification.event)
    label = f"{notification.workflow}.{notification.task}" if notification.task else notification.workflow
    if notification.event == "approval_requested":
        approval = (Approval.objects.filter(task_run_id=notification.task_run_id).order_by("-number").first()
                    if notification.task_run_id else None)
        if approval is not None:
            return _approval_notice(notification, run, title, label, approval)
    subject = one_line(f"[orchestrator] {title}: {label}" + (f" (run #{run.pk})" if run else ""))
    lines = [f"{title}: {label}", *_run_lines(notification, run), *_event_lines(notification, run)]
    if notification.task_run_id is not None:
        link = url("orchestrator:web:task_run", notification.task_run_id)
    else:
        link = url("orchestrator:web:run", run.pk) if run is not None else ""
    return Notice(subject=subject, lines=lines, link=link)


def _run_lines(notification: Notification, run: Run | None) -> list[str]:
    if run is None:
        return []
    return [f"Run #{run.pk} of {notification.workflow}, logical date {_when(run.logical_date)}, now {run.state}."]


def _event_lines(notification: Notification, run: Run | None) -> list[str]:
    """What the event adds: a failed run's failed tasks and reason, a missed deadline's time, a
    task's error."""
    if notification.event == "run_failed" and run is not None:
        return _failed_tasks(run) + ([f"Reason: {one_line(run.reason, ERROR_CHARS)}"] if run.reason else [])
    if notification.event == "deadline_missed" and run is not None:
        return [f"It was to end by {_when(run.deadline_at)}."]
    if notification.event != "approval_requested" and notification.detail.get("error"):
        return [f"Error: {one_line(notification.detail['error'], ERROR_CHARS)}"]
    return []


def _approval_notice(notification: Notification, run: Run | None, title: str, label: str,
                     approval: Approval) -> Notice:
    """An approval request's notice: the question, the answers, when it times out."""
    lines = [f"{title}: {label}", *_run_lines(notification, run),
             f"Question: {approval.question}", f"Answers: {', '.join(approval.options)}"]
    if approval.due_at:
        lines.append(f"Without an answer by {_when(approval.due_at)} it times out.")
    return Notice(subject=one_line(f"[orchestrator] {title}: {approval.question}"), lines=lines,
                  link=url("orchestrator:web:approvals"), link_label="Waiting for you", approval=approval)


def _failed_tasks(run: Run) -> list[str]:
    failed = list(TaskRun.objects.filter(run=run, state__in=(TaskState.DEAD, TaskState.FAILED))
                  .order_by("id").values_list("task", "error", "attempts")[:FAILED_TASKS])
    return ["Failed tasks:"] + [f"  - {task} after {attempts} attempt(s): {one_line(error, ERROR_CHARS)}"
                                for task, error, attempts in failed] if failed else []


def digest(message: NotificationMessage) -> Notice:
    """Counts of every event of the window by kind and workflow, then the latest ones, one line each."""
    counts = _Counts()
    for row in message.notifications.order_by().values("event", "workflow").annotate(n=Count("id")):
        counts.by_event[row["event"]] += row["n"]
        counts.by_workflow.setdefault(row["event"], Counter())[row["workflow"]] += row["n"]
    summary = ", ".join(f"{n} {TITLES.get(event, event).lower()}" for event, n in counts.by_event.most_common())
    subject = one_line(f"[orchestrator] Digest of {message.count} notifications: {summary}")
    lines = [f"{message.count} notifications since {_when(message.created_at)}:"]
    for event, n in counts.by_event.most_common():
        workflows = ", ".join(f"{name or 'jobs'} {k}" for name, k in counts.by_workflow[event].most_common(10))
        lines.append(f"  {TITLES.get(event, event)}: {n} ({workflows})")
    latest = list(message.notifications.order_by("-id")[:DIGEST_LINES])
    lines += ["", f"The latest {len(latest)}:"]
    for notification in latest:
        label = f"{notification.workflow}.{notification.task}" if notification.task else notification.workflow
        run = f" run #{notification.run_id}" if notification.run_id else ""
        lines.append(f"  {_when(notification.created_at)}  {TITLES.get(notification.event, notification.event)}: "
                     f"{label}{run}")
    if message.count > len(latest):
        lines.append(f"  … and {message.count - len(latest)} more")
    failed = counts.by_event.get("run_failed")
    link = url("orchestrator:web:runs") + ("?state=failed" if failed else "") if app_settings.BASE_URL else ""
    return Notice(subject=subject, lines=lines, link=link, link_label="Runs")


# --- chat bodies ---------------------------------------------------------------------------------

def slack_escape(text: str) -> str:
    """Slack reads &, < and > as markup (links, mentions such as <!channel>): escaped, as Slack asks."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(notice: Notice) -> dict:
    """A Slack incoming webhook's body: ``text`` (what notifications show) and ``blocks``."""
    body = slack_escape("\n".join(notice.lines))
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": one_line(notice.subject, 150)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": body[:2900]}},
    ]
    if notice.link:
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": notice.link_label}, "url": notice.link}]})
    return {"text": slack_escape(notice.subject), "blocks": blocks}


def teams(notice: Notice) -> dict:
    """A Teams incoming webhook's body (Workflows): a message with one Adaptive Card."""
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": notice.subject, "weight": "Bolder", "size": "Medium", "wrap": True},
            {"type": "TextBlock", "text": "\n\n".join(notice.lines)[:20000], "wrap": True},
        ],
    }
    if notice.link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": notice.link_label, "url": notice.link}]
    return {"type": "message", "attachments": [
        {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}]}
