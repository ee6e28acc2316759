"""Forms of the web pages and the admin: list filters, the trigger form built from a workflow's
declared params, and the backfill form."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django import forms
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from orchestrator import access, audit, backfill, reads
from orchestrator.limits import MAX_ID
from orchestrator.models import Backfill, Workflow
from orchestrator.states import RunState, TaskState, Trigger

JOBS = "-jobs"  # the workflow filter's value for one-off jobs (runs without a workflow)
PARAM_PREFIX = "param."


class RunFilterForm(forms.Form):
    workflow = forms.ChoiceField(required=False)
    state = forms.ChoiceField(required=False, choices=[("", "any state"), *RunState.choices])
    trigger = forms.ChoiceField(required=False, choices=[("", "any trigger"), *Trigger.choices])
    # Days in the user's clock (orchestrator.web.zones), as the page says next to the inputs.
    since = forms.DateField(required=False, label="logical date from")
    until = forms.DateField(required=False, label="to (inclusive)")
    # Keyset pagination: rows with a smaller id (older) or a larger id (newer) than this one.
    before = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    after = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID)

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        # Only the workflows this user may read (``user`` None: every workflow).
        names = (access.visible(user, Workflow.objects.all()) if user is not None else Workflow.objects.all()
                 ).order_by("name").values_list("name", flat=True)
        self.fields["workflow"].choices = [("", "all workflows"), (JOBS, "jobs (no workflow)")] + [
            (name, name) for name in names
        ]

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            self.add_error("until", "must not be before the start date")
        return data


class DeadLetterFilterForm(forms.Form):
    workflow = forms.ChoiceField(required=False)
    queue = forms.CharField(required=False, max_length=100)
    error = forms.CharField(required=False, max_length=200, label="error contains")
    since = forms.DateField(required=False, label="died from")
    until = forms.DateField(required=False, label="to (inclusive)")
    # Keyset pagination in the order of death, as the API's: "older.<microseconds>.<id>".
    cursor = forms.CharField(required=False, max_length=60)

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        # Only the workflows this user may read (``user`` None: every workflow).
        names = (access.visible(user, Workflow.objects.all()) if user is not None else Workflow.objects.all()
                 ).order_by("name").values_list("name", flat=True)
        self.fields["workflow"].choices = [("", "all workflows"), (JOBS, "jobs (no workflow)")] + [
            (name, name) for name in names
        ]

    def clean_cursor(self):
        text = self.cleaned_data["cursor"]
        if not text:
            return None
        cursor = reads.DEAD_LETTER_ORDER.parse(text)
        if cursor is None:
            raise forms.ValidationError(f"expected a cursor like {reads.DEAD_LETTER_ORDER.example!r} "
                                        "(from the page's older link)")
        return cursor


class ClearForm(forms.Form):
    """The clear dialog's options: what besides the picked task run runs again (a run's dialog
    offers only ``only_failed``)."""

    upstream = forms.BooleanField(required=False, label="upstream",
                                  help_text="the tasks it depends on, directly or not")
    downstream = forms.BooleanField(required=False, initial=True, label="downstream",
                                    help_text="the tasks that depend on it, directly or not")
    only_failed = forms.BooleanField(required=False, label="only failed",
                                     help_text="only task runs that failed, died or were upstream-failed")
    past = forms.BooleanField(required=False, label="past runs",
                              help_text="the same tasks in this workflow's runs with an earlier logical date")
    future = forms.BooleanField(required=False, label="future runs",
                                help_text="the same tasks in this workflow's runs with a later logical date")
    confirm = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    RUN_FIELDS = ("only_failed",)

    def __init__(self, *args, whole_run: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if whole_run:
            for name in [name for name in self.fields if name not in (*self.RUN_FIELDS, "confirm")]:
                del self.fields[name]

    def options(self):
        """The checkbox fields, in order (the hidden confirm aside)."""
        return [self[name] for name in self.fields if name != "confirm"]


RUN_BULK_ACTIONS = [("clear", "Clear"), ("clear-failed", "Clear failed tasks"),
                    ("mark-succeeded", "Mark succeeded"), ("mark-failed", "Mark failed")]


class RunBulkForm(forms.Form):
    """The runs list's action on the runs ticked."""

    action = forms.ChoiceField(choices=RUN_BULK_ACTIONS, error_messages={
        "invalid_choice": "%(value)s is not an action on runs: use clear, clear-failed, mark-succeeded or mark-failed",
    })
    ids = forms.TypedMultipleChoiceField(coerce=int, choices=(), error_messages={
        "required": "Tick at least one run.",
    })
    confirm = forms.CharField(required=False, max_length=64)

    MOST = 100  # runs one action takes

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        self.fields["ids"].valid_value = lambda value: bool(re.fullmatch(r"[0-9]{1,20}", str(value))) and (
            0 < int(value) <= MAX_ID)

    def clean_ids(self):
        ids = sorted(set(self.cleaned_data["ids"]))
        if len(ids) > self.MOST:
            raise forms.ValidationError(f"at most {self.MOST} runs at once, got {len(ids)}")
        return ids


class BulkTaskRunForm(forms.Form):
    action = forms.ChoiceField(choices=[("retry", "retry"), ("discard", "discard")])
    ids = forms.TypedMultipleChoiceField(coerce=int, choices=(), error_messages={
        "required": "Select at least one task run.",
    })
    confirmed = forms.BooleanField(required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Any id is a candidate (ASCII digits: str.isdigit() also accepts "²", which int() refuses;
        # within a bigint); the view keeps only those still in the dead-letter queue.
        self.fields["ids"].valid_value = lambda value: bool(re.fullmatch(r"[0-9]{1,20}", str(value))) and (
            0 < int(value) <= MAX_ID)


@dataclass
class ParamField:
    """One input of the trigger form, from one declared param."""

    name: str
    type: str
    required: bool
    description: str
    choices: list | None
    value: object
    error: str = ""

    @property
    def html_name(self) -> str:
        return PARAM_PREFIX + self.name

    @property
    def widget(self) -> str:
        if self.choices:
            return "select"
        return {"bool": "checkbox", "int": "number", "float": "number", "date": "date",
                "list": "textarea", "dict": "textarea"}.get(self.type, "text")

    @property
    def step(self) -> str:
        return "any" if self.type == "float" else "1"

    @property
    def checked(self) -> bool:
        return str(self.value).lower() in {"true", "1", "yes", "on"}

    @property
    def text(self) -> str:
        if self.value is None:
            return ""
        if isinstance(self.value, list | dict):
            return json.dumps(self.value)
        return str(self.value)

    @property
    def described_by(self) -> str:
        """The ids of the help text and the error that describe this input (aria-describedby)."""
        return " ".join(([f"h-{self.name}"] if self.description else []) + ([f"e-{self.name}"] if self.error else []))

    @property
    def choice_values(self) -> list[str]:
        return [str(choice) for choice in self.choices or []]


def param_order(spec: dict) -> list[str]:
    """The workflow's params in declaration order: the spec's ``param_order`` when sync wrote one
    (jsonb forgets key order), else alphabetical, never the database's key order."""
    declared = spec.get("params", {})
    order = [name for name in spec.get("param_order", []) if name in declared]
    return order + sorted(set(declared) - set(order))


def param_fields(workflow_spec: dict, submitted: dict | None = None,
                 errors: dict[str, str] | None = None) -> list[ParamField]:
    """The trigger form's inputs for the params of a workflow's spec, in declaration order."""
    submitted = submitted or {}
    errors = errors or {}
    declared = workflow_spec.get("params", {})
    fields = []
    for name in param_order(workflow_spec):
        spec = declared[name]
        value = submitted[name] if name in submitted else spec.get("default")
        fields.append(ParamField(
            name=name, type=spec.get("type", "str"), required=bool(spec.get("required")),
            description=spec.get("description", ""), choices=spec.get("choices"), value=value,
            error=errors.get(name, ""),
        ))
    return fields


def submitted_params(declared: dict[str, dict], post) -> dict:
    """The raw param values of a posted trigger form (``param.<name>`` inputs), unknown names
    included so that ``clean_params`` names them. An empty input means "use the default"."""
    values = {}
    for key in post:
        if not key.startswith(PARAM_PREFIX):
            continue
        name = key[len(PARAM_PREFIX):]
        value = post.get(key)
        if value is None or (isinstance(value, str) and value.strip() == ""):
            continue
        values[name] = value
    for name, spec in declared.items():
        # An unchecked checkbox sends nothing; the form marks its booleans so absence means false.
        if spec.get("type") == "bool" and name not in values and f"{PARAM_PREFIX}{name}.present" in post:
            values[name] = "false"
    values = {key: value for key, value in values.items() if not key.endswith(".present")}
    return values


def logical_date_of(text: str | None) -> datetime | None:
    """The trigger form's logical date: empty for now; a date and time read in UTC (the label
    says so) unless it names its offset. Raises ValueError saying what is wrong."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = parse_datetime(text)
    except ValueError:
        value = None
    if value is None:
        raise ValueError(f"expected a date and time like 2026-03-01T02:30 (UTC), got {text[:40]!r}")
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


class BackfillForm(forms.Form):
    start = forms.DateTimeField(
        label="from (UTC)", help_text="First logical date included, e.g. 2026-01-01 00:00.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    end = forms.DateTimeField(
        label="to (UTC)", help_text="Last logical date included.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    schedule = forms.ChoiceField(required=False, help_text="Whose fire times to backfill.")
    reprocess = forms.ChoiceField(choices=Backfill.Reprocess.choices, initial=Backfill.Reprocess.NONE,
                                  widget=forms.RadioSelect)
    params = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text='Optional JSON object of param values, e.g. {"orders": 10}. Unset params use their defaults.',
    )

    def __init__(self, *args, workflow: Workflow, **kwargs):
        super().__init__(*args, **kwargs)
        self.workflow = workflow
        schedules = list(workflow.schedules.all())
        self.schedules = {str(s.pk): s for s in schedules}
        self.fields["schedule"].choices = [("", "the workflow's first schedule")] + [
            (str(s.pk), f"{s.name}: {s.cron} ({s.timezone})") for s in schedules
        ]

    def clean_params(self):
        from orchestrator.params import ParamError, clean_params  # noqa: PLC0415 - the method's own name is clean_params

        raw = self.cleaned_data.get("params", "").strip()
        if not raw:
            values = {}
        else:
            try:
                values = json.loads(raw)
            except ValueError as exc:
                raise forms.ValidationError(f"not valid JSON: {exc}") from None
            if not isinstance(values, dict):
                raise forms.ValidationError("must be a JSON object of param values")
        try:
            return clean_params(self.workflow.spec.get("params", {}), values)
        except ParamError as exc:
            raise forms.ValidationError([f"{key}: {message}" for key, message in exc.errors.items()]) from None

    def _as_utc(self, name):
        # The labels say UTC: the wall time typed is read as UTC whatever zone the user's clock
        # activated for this request (Django reads it in the current zone).
        value = self.cleaned_data.get(name)
        if value is None:
            return value
        return timezone.make_naive(value).replace(tzinfo=UTC) if timezone.is_aware(value) else value.replace(tzinfo=UTC)

    def clean_start(self):
        return self._as_utc("start")

    def clean_end(self):
        return self._as_utc("end")

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["start"] > data["end"]:
            self.add_error("end", "must not be before the start")
        data["schedule_obj"] = self.schedules.get(data.get("schedule") or "")
        return data


def backfill_digest(data: dict) -> str:
    """A digest of a backfill form's cleaned values: the start button carries the one of the
    values previewed, so values edited after the preview show a new preview instead of starting."""
    schedule = data.get("schedule_obj")
    values = [data["start"].isoformat(), data["end"].isoformat(), data["reprocess"], data["params"],
              schedule.pk if schedule else None]
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:24]


def backfill_preview(plan, digest: str) -> dict:
    """What a dry run shows (``backfill.plan``'s answer): how many runs, and the first fire times
    in UTC, the zone the date inputs are read in, each with its wall time in the schedule's zone."""
    zone = ZoneInfo(plan.timezone)
    return {
        "count": plan.count,
        "existing": len(plan.existing),
        "to_create": len(plan.to_create),
        "to_reprocess": len(plan.to_reprocess),
        "total": plan.total,
        "first": [(at.astimezone(UTC), at.astimezone(zone)) for at in (plan.to_create[:10] or plan.fire_times[:10])],
        "cron": plan.cron,
        "timezone": plan.timezone,
        "digest": digest,
    }


TASK_STATE_CHOICES = TaskState.choices


def backfill_step(request, wf: Workflow, form: BackfillForm):
    """The backfill dialog's step for a valid form (the admin's and the workflow page's): the
    dry run, or the start when the request confirms the digest of the values previewed (audited).
    Returns (the backfill started, or None; the preview to show, or None); what went wrong is on
    the form."""
    data = form.cleaned_data
    schedule = data["schedule_obj"]
    try:
        plan = backfill.plan(wf, data["start"], data["end"], schedule=schedule, reprocess=data["reprocess"])
    except backfill.BackfillError as exc:
        field = getattr(exc, "field", None)
        form.add_error(field if field in form.fields else None, str(exc))
        return None, None
    digest = backfill_digest(data)
    if "go" in request.POST and request.POST.get("confirm") == digest:
        try:
            started = backfill.start(wf, data["start"], data["end"], reprocess=data["reprocess"],
                                     params=data["params"], created_by=request.user, schedule=schedule)
        except backfill.BackfillError as exc:
            form.add_error(None, str(exc))
        else:
            audit.record("backfill", request=request, target=started, workflow=wf.name,
                         start=data["start"].isoformat(), end=data["end"].isoformat(), runs=started.total,
                         reprocess=data["reprocess"], params=data["params"])
            return started, None
    return None, backfill_preview(plan, digest)
