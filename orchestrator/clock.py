"""Injected time. Loops take a clock so tests can pin and advance it instead of sleeping; code
without a clock of its own (views, the API, model helpers) reads ``clock.now()``, the process
clock, which tests replace with ``clock.pinned(FakeClock(...))``.

Lease and heartbeat comparisons use the database's ``now()`` instead (every process must agree
on them); a FakeClock also answers ``db_now()`` so those paths can be tested the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone


class SystemClock:
    # When the database server started: None means the server's own pg_postmaster_start_time().
    server_started = None

    def now(self) -> datetime:
        return timezone.now()

    def db_now(self) -> datetime:
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0]


class FakeClock:
    def __init__(self, start: datetime | None = None, server_started: datetime | None = None):
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs an aware datetime")
        # The real server's start time means nothing on a fake timeline: long ago, unless a test
        # sets it to play a database restart.
        self.server_started = server_started or datetime(1, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def db_now(self) -> datetime:
        return self._now

    def advance(self, seconds: float = 0, **kwargs) -> datetime:
        self._now += timedelta(seconds=seconds, **kwargs)
        return self._now

    def set(self, when: datetime) -> datetime:
        self._now = when
        return self._now


system = SystemClock()
_current = system


def current():
    """The process clock: the system clock, or the one a test pinned."""
    return _current


def now() -> datetime:
    return _current.now()


def db_now_param() -> datetime | None:
    """For SQL that compares with the database clock (leases, heartbeats) without a query of
    its own: ``COALESCE(%(db_now)s::timestamptz, now())``. None under the system clock (the
    database's ``now()`` applies); the pinned time under a test's clock."""
    return None if _current is system else _current.db_now()


@contextmanager
def pinned(clock) -> Iterator:
    """Make ``clock`` the process clock for the duration of the block."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous
