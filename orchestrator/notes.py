"""Notes on runs and task runs: a short text an operator leaves ("rerun after the vendor fixed the
file"), one per run and one per task run, edited in place, with who wrote it last and when. The
pages and the API show them; writing one is an operator's action, recorded in the audit log by
the caller. An empty text deletes the note."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from orchestrator import clock
from orchestrator.models import Note, Run, TaskRun
from orchestrator.people import NOTE_LENGTH


class NoteError(ValueError):
    """A note that cannot be stored as given; the message says why."""


def clean_text(text) -> str:
    if not isinstance(text, str):
        raise NoteError(f"a note is text, got {type(text).__name__}")
    text = text.strip()
    if "\x00" in text:
        raise NoteError("a note cannot hold a NUL character")
    if len(text) > NOTE_LENGTH:
        raise NoteError(f"a note holds at most {NOTE_LENGTH} characters, got {len(text)}")
    return text


def set_note(run: Run, text, *, task_run: TaskRun | None = None, by=None, now: datetime | None = None) -> Note | None:
    """Write the note of ``run`` (or of ``task_run``, one of its task runs); an empty text deletes
    it. Returns the note, or None when there is none now."""
    text = clean_text(text)
    now = now or clock.now()
    where = {"run_id": run.pk, "task_run_id": task_run.pk if task_run else None}
    user = by if getattr(by, "is_authenticated", False) else None
    with transaction.atomic():
        if not text:
            Note.objects.filter(**where).delete()
            return None
        note, _ = Note.objects.update_or_create(
            **where, defaults={"text": text, "author": user, "author_name": user.get_username() if user else "",
                               "updated_at": now}, create_defaults={
                "text": text, "author": user, "author_name": user.get_username() if user else "",
                "created_at": now, "updated_at": now})
    return note


def note_of(run_id: int, task_run_id: int | None = None) -> Note | None:
    return Note.objects.filter(run_id=run_id, task_run_id=task_run_id).first()


def task_notes(run_id: int, task_run_ids) -> dict[int, Note]:
    """The notes of these task runs of a run (a page of them), by task run id: one query."""
    return {note.task_run_id: note for note in Note.objects.filter(run_id=run_id, task_run_id__in=list(task_run_ids))}
