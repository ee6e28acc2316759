"""Structured logging: one JSON object per line when LOG_FORMAT=json, and the run id, task and
attempt on every record emitted while a task runs (``with bind(run_id=…, task=…, attempt=…)``)."""

from __future__ import annotations

import contextvars
import json
import logging
from contextlib import contextmanager
from datetime import UTC, datetime

_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar("orchestrator_log_context", default=None)


@contextmanager
def bind(**fields):
    """Attach fields to every log record emitted inside the block (in this thread/task)."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record, so any formatter can use them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    """The plain format, with the bound task fields appended when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{key}={getattr(record, key)}" for key in ("run_id", "task", "attempt", "trace_id")
                          if getattr(record, key, None) is not None)
        return f"{text} [{fields}]" if fields else text
