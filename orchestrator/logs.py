"""Task logs: one log per attempt through Django's storage API (``ORCHESTRATOR_LOG_STORAGE``: files
under ``ORCHESTRATOR_DATA_DIR/logs`` by default, S3 and friends through django-storages).

On a storage with local paths the log is appended and flushed as the task writes, so it can be
read while the task runs. Other storages receive the whole log when the attempt ends. A log is
created on the first write only: a task that prints nothing costs no file.
"""

from __future__ import annotations

import io
import os

from django.core.files.base import ContentFile

from orchestrator.conf import log_storage
from orchestrator.models import Attempt


def name_for(run_id: int, task_run_id: int, number: int) -> str:
    """The storage name of an attempt's log (ids only: task names may hold any character)."""
    return f"runs/{run_id}/{task_run_id}-{number}.log"


def attempt_log_name(attempt: Attempt) -> str:
    if attempt.log_path:
        return attempt.log_path
    task_run = attempt.task_run
    return name_for(task_run.run_id, task_run.pk, attempt.number)


def local_path(name: str) -> str | None:
    try:
        return log_storage().path(name)
    except NotImplementedError:
        return None


def written_name(run_id: int, task_run_id: int, number: int) -> str:
    """The attempt's log name if its log was written on this machine, else "" (a killed task's)."""
    name = name_for(run_id, task_run_id, number)
    path = local_path(name)
    return name if path and os.path.exists(path) else ""


def private_folders(folder: str) -> None:
    """Make ``folder`` (mode 0700), and close the folders between it and the storage's root to
    everyone but the service user, folders made by an earlier version included."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    root = os.path.abspath(getattr(log_storage(), "location", folder))
    current = os.path.abspath(folder)
    while True:
        try:
            if os.stat(current).st_mode & 0o077:
                os.chmod(current, 0o700)
        except OSError:
            break  # not ours to change: the storage's parent folders are the deployer's
        if current == root or os.path.dirname(current) == current or not current.startswith(root):
            break
        current = os.path.dirname(current)


class AttemptLog(io.TextIOBase):
    """A write-only text stream for stdout, stderr and logging of one attempt, opened lazily."""

    def __init__(self, name: str, append: bool = False):
        self.name = name
        self.append = append  # a waiting sensor's later check adds to its try's log
        self.file = None
        self.buffer_ = None  # for storages without local paths
        self.written = False

    def writable(self) -> bool:
        return True

    def _open(self) -> None:
        path = local_path(self.name)
        if path is not None:
            private_folders(os.path.dirname(path))
            # "w": one opener per attempt; a leftover file of a reset database is replaced. Logs
            # can hold anything a task prints: readable by the service user only.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.append else os.O_TRUNC), 0o600)
            os.fchmod(fd, 0o600)  # a leftover file keeps its mode through O_CREAT
            self.file = open(fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed in finish()
        else:
            self.buffer_ = io.StringIO()
        self.written = True

    def write(self, text: str) -> int:
        if not text:
            return 0
        if not self.written:
            self._open()
        if self.file is not None:
            self.file.write(text)
            self.file.flush()  # readable while the task runs
        elif self.buffer_ is not None:
            self.buffer_.write(text)
        return len(text)

    def fileno_for_subprocess(self) -> int | None:
        """A file descriptor a child process can write to directly, when the storage is local."""
        if not self.written:
            self._open()
        return self.file.fileno() if self.file is not None else None

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def finish(self) -> str:
        """Close the log; returns its storage name, or "" when nothing was written."""
        if not self.written:
            return ""
        if self.file is not None:
            self.file.close()
            self.file = None
            return self.name
        if self.buffer_ is None:  # already finished
            return self.name
        text, self.buffer_ = self.buffer_.getvalue(), None
        return log_storage().save(self.name, ContentFile(text.encode()))


def read(attempt: Attempt, offset: int = 0, limit: int = 65536) -> tuple[str, int, bool]:
    """A page of an attempt's log: (text, next_offset, eof). Offsets are in bytes; a page never
    splits a UTF-8 character. eof is True when the attempt has ended and the log is read to its
    end (a running attempt's log may still grow)."""
    offset = max(0, int(offset))
    limit = max(1, min(int(limit), 4 * 1024 * 1024))
    name = attempt_log_name(attempt)
    finished = attempt.outcome != "running"
    if not log_storage().exists(name):
        return "", offset, finished
    with log_storage().open(name, "rb") as handle:
        handle.seek(offset)
        data = handle.read(limit + 3)
    chunk = data[:limit]
    if len(data) > limit:
        # Back up to the start of a UTF-8 character so the next page begins cleanly.
        cut = limit
        while cut > 0 and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        chunk = data[:cut] if cut > 0 else data[:limit]
    next_offset = offset + len(chunk)
    eof = finished and len(data) <= len(chunk)
    return chunk.decode("utf-8", errors="replace"), next_offset, eof


def open_for_download(attempt: Attempt):
    """The whole log as a binary file object (an empty one when the attempt wrote nothing)."""
    name = attempt_log_name(attempt)
    if not log_storage().exists(name):
        return io.BytesIO(b"")
    return log_storage().open(name, "rb")
