"""The tables of what reaches people and what people answer: the installation's notification
rules, the notifications events make, the messages (one email or chat post each) that carry them,
the approvals that wait for a person's answer, what each user chose for the pages, and the notes
operators leave on runs and task runs.

Defined here rather than in ``models.py`` to keep that module to the core of runs and tasks;
``models.py`` imports them, so they are the app's models like the others.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from orchestrator.definition import NOTIFY_EVENTS
from orchestrator.limits import EMAIL, URL


class NotificationRule(models.Model):
    """An installation's rule, kept in the admin: on these events of these workflows (every
    workflow when none is named) and tenants, email these people and post to these chat webhooks.
    A workflow's own rules are in its module (``Workflow(notify=[Notify(...)])``)."""

    name = models.CharField(max_length=200)
    events = ArrayField(models.CharField(max_length=30, choices=[(event, event.replace("_", " "))
                                                                 for event in NOTIFY_EVENTS]),
                        help_text="Comma-separated: " + ", ".join(NOTIFY_EVENTS) + ".")
    workflows = ArrayField(models.CharField(max_length=200), default=list, blank=True,
                           help_text="Only runs of these workflows (comma-separated); empty: every workflow.")
    tenants = ArrayField(models.CharField(max_length=200), default=list, blank=True,
                         help_text="Only runs of these tenants' workflows; empty: every tenant.")
    emails = ArrayField(models.EmailField(max_length=EMAIL), default=list, blank=True,
                        help_text="Email addresses, comma-separated.")
    slack = ArrayField(models.URLField(max_length=URL), default=list, blank=True,
                       help_text="Slack incoming webhook URLs (or any receiver of Slack's JSON).")
    teams = ArrayField(models.URLField(max_length=URL), default=list, blank=True,
                       help_text="Microsoft Teams incoming webhook (Workflows) URLs.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class MessageState(models.TextChoices):
    PENDING = "pending", "gathering"
    SENDING = "sending", "sending"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"


class NotificationMessage(models.Model):
    """One email or chat post to one recipient: a single event, or a digest of every event that
    came in its window. ``pending`` while it gathers (one per recipient at most, which the
    database enforces), ``sending`` once closed, then ``sent`` or ``failed``."""

    State = MessageState

    # "email:<address>", "slack:<url>" or "teams:<url>".
    recipient = models.CharField(max_length=600)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    due_at = models.DateTimeField()
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    count = models.PositiveIntegerField(default=0, help_text="The events it carries (known once it is closed).")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["recipient"], condition=Q(state=MessageState.PENDING),
                                    name="notificationmessage_one_pending"),
        ]

    def __str__(self):
        return f"message #{self.pk} to {self.recipient}"

    @property
    def channel(self) -> str:
        return self.recipient.partition(":")[0]

    @property
    def address(self) -> str:
        return self.recipient.partition(":")[2]


class Notification(models.Model):
    """One event for one recipient, gathered into that recipient's message."""

    message = models.ForeignKey(NotificationMessage, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=30)
    # Deleted with its run by retention; the workflow and task are kept by name for the message.
    run = models.ForeignKey("orchestrator.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    workflow = models.CharField(max_length=200, blank=True)
    task = models.CharField(max_length=255, blank=True)
    task_run_id = models.BigIntegerField(null=True, blank=True)
    # What the message says beyond the names: the run's state, an error, an approval's question.
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.event} of {self.workflow or 'a job'} for {self.message.recipient}"


class ApprovalState(models.TextChoices):
    OPEN = "open", "waiting for an answer"
    ANSWERED = "answered", "answered"
    TIMED_OUT = "timed_out", "no answer in time"
    CLOSED = "closed", "closed unanswered"  # its task run was cancelled, cleared or asked again


class Approval(models.Model):
    """One question of an approval task to people (one per ask: a timeout with asks left asks
    again), and its answer: who chose what, when, from where, with the form's values. Exactly one
    answer counts: answering is a guarded update of an open approval."""

    State = ApprovalState

    task_run = models.ForeignKey("orchestrator.TaskRun", on_delete=models.CASCADE, related_name="approvals")
    # The attempt that asked (the task run's attempt number then): an answer counts only while the
    # task run still awaits this ask.
    number = models.PositiveIntegerField()
    run = models.ForeignKey("orchestrator.Run", on_delete=models.CASCADE, related_name="+", db_index=False)
    workflow = models.CharField(max_length=200, blank=True)
    task = models.CharField(max_length=255)
    tenant = models.CharField(max_length=200, default="default")
    question = models.TextField()
    options = ArrayField(models.CharField(max_length=50))
    reject = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    form = models.JSONField(default=dict, blank=True, help_text="The fields to fill in, as declared (param specs).")
    groups = ArrayField(models.CharField(max_length=150), default=list, blank=True)
    state = models.CharField(max_length=10, choices=ApprovalState.choices, default=ApprovalState.OPEN)
    asked_at = models.DateTimeField()
    due_at = models.DateTimeField(null=True, blank=True)
    answer = models.CharField(max_length=50, blank=True)
    values = models.JSONField(default=dict, blank=True)
    answered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    # Who answered, kept by name (a user, or the address a signed link was sent to).
    answered_by_name = models.CharField(max_length=254, blank=True)
    answered_via = models.CharField(max_length=10, blank=True)  # page, api or link
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["task_run", "number"], name="approval_one_per_ask")]
        indexes = [models.Index(fields=["asked_at"], condition=Q(state=ApprovalState.OPEN), name="approval_open")]

    def __str__(self):
        return f"approval of {self.workflow}.{self.task} (run #{self.run_id})"


class UserPreference(models.Model):
    """What one user chose for the pages: the clock times are shown in (their browser's local
    time or UTC), used by every page, the filters and the admin."""

    class Clock(models.TextChoices):
        LOCAL = "local", "local time"
        UTC = "utc", "UTC"

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="orchestrator_preference")
    clock = models.CharField(max_length=5, choices=Clock.choices, default=Clock.LOCAL)

    def __str__(self):
        return f"{self.user} prefers {self.get_clock_display()}"


NOTE_LENGTH = 1000  # a note is a short text, as Airflow's


class Note(models.Model):
    """An operator's note on a run (``task_run`` empty) or on one of its task runs: one each,
    edited in place; who wrote it last and when. Deleted with its run (retention follows the
    foreign keys)."""

    # Named reverse relations (not "+"): retention finds what to delete with a run through them.
    run = models.ForeignKey("orchestrator.Run", on_delete=models.CASCADE, related_name="notes", db_index=False)
    task_run = models.ForeignKey("orchestrator.TaskRun", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="notes")
    text = models.TextField(max_length=NOTE_LENGTH)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    # Who wrote it, kept by name when the user is deleted.
    author_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        # One note per run and one per task run (NULLS NOT DISTINCT: the run's own, task_run
        # empty, is one too); the index leads with the run, so a run page reads its notes at once.
        constraints = [models.UniqueConstraint(fields=["run", "task_run"], nulls_distinct=False,
                                               name="note_one_per_object")]

    def __str__(self):
        where = f"task run {self.task_run_id}" if self.task_run_id else f"run #{self.run_id}"
        return f"note on {where} by {self.author_name or 'someone'}"
