"""The scheduler's leadership: one row in the lease table, with a holder, a fencing epoch and an
expiry. Every comparison uses the database server's clock, so the clocks of the machines that run
schedulers never matter. ``clock_timestamp()`` rather than ``now()``: ``now()`` is frozen at the
start of the transaction, and a lease check inside a long transaction must see real time.

* acquire: one upsert that succeeds only if the lease is free, expired, or already ours; each new
  acquisition increments the epoch.
* renew: a guarded update (holder = me, epoch = mine, not yet expired); a row count of 0 means the
  lease was lost and this process must stop writing at once.
* release: on a clean shutdown the lease expires at once, so a standby takes over without waiting.
* fencing: :meth:`LeaderLease.fence` starts the leader's write transactions with a ``FOR SHARE``
  lock on the lease row under the same conditions. A standby's takeover (an update of that row)
  waits for the leader's transaction to end, and a leader whose lease lapsed fails the check and
  writes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from contextlib import contextmanager

from django.db import connection, transaction

from orchestrator.conf import app_settings

log = logging.getLogger(__name__)

SCHEDULER_LEASE = "scheduler"


class LeaseLost(Exception):
    """The lease is no longer ours (expired and taken, or released); stop writing."""


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_seconds() -> float:
    return float(app_settings.LEASE_SECONDS)


# A new acquisition: insert the row, or take it over when it expired (or is ours already, e.g.
# after this process restarted its loop). The epoch grows on every acquisition, so writes of a
# previous term can be told apart from this one.
_ACQUIRE = """
INSERT INTO orchestrator_lease AS lease (name, holder, epoch, acquired_at, expires_at)
VALUES (%(name)s, %(holder)s, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder, epoch = lease.epoch + 1,
       acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
 WHERE lease.expires_at < clock_timestamp() OR lease.holder = EXCLUDED.holder
RETURNING epoch
"""

# Renewal only extends a lease that is still ours in this term and has not lapsed: once it
# lapsed a standby may already be writing, so the old leader must not resurrect it.
_RENEW = """
UPDATE orchestrator_lease SET expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
 WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
"""

# On a clean shutdown the lease expires now, so a standby takes over at its next try instead of
# waiting out the term; guarded like renewal, so a deposed leader cannot end its successor's term.
_RELEASE = """
UPDATE orchestrator_lease SET expires_at = clock_timestamp()
 WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
"""

# Taken at the start of every write transaction of the leader (see the module docstring).
_FENCE = """
SELECT 1 FROM orchestrator_lease
 WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
   FOR SHARE
"""


class LeaderLease:
    def __init__(self, name: str = SCHEDULER_LEASE, holder: str | None = None, seconds: float | None = None):
        self.name = name
        self.holder = holder or default_holder()
        self.seconds = float(seconds if seconds is not None else lease_seconds())
        self.epoch: int | None = None
        self._renewed_at = 0.0  # time.monotonic() of the last successful acquire or renew

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    def _params(self) -> dict:
        return {"name": self.name, "holder": self.holder, "epoch": self.epoch, "seconds": self.seconds}

    def acquire(self) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(_ACQUIRE, self._params())
            row = cursor.fetchone()
        if row is None:
            self.epoch = None
            return False
        self.epoch = row[0]
        self._renewed_at = time.monotonic()
        log.info("acquired the %s lease (epoch %s)", self.name, self.epoch,
                 extra={"action": "lease_acquired", "holder": self.holder, "epoch": self.epoch})
        return True

    def renew(self) -> bool:
        if self.epoch is None:
            return False
        with connection.cursor() as cursor:
            cursor.execute(_RENEW, self._params())
            renewed = cursor.rowcount == 1
        if renewed:
            self._renewed_at = time.monotonic()
        else:
            log.warning("lost the %s lease (epoch %s)", self.name, self.epoch,
                        extra={"action": "lease_lost", "holder": self.holder, "epoch": self.epoch})
            self.epoch = None
        return renewed

    def ensure(self) -> bool:
        """Called every loop: renew about every third of the lease time while leading, otherwise
        try to acquire. Returns whether this process leads now."""
        if self.epoch is None:
            return self.acquire()
        if time.monotonic() - self._renewed_at >= self.seconds / 3:
            return self.renew()
        return True

    def release(self) -> None:
        if self.epoch is None:
            return
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE, self._params())
        log.info("released the %s lease (epoch %s)", self.name, self.epoch,
                 extra={"action": "lease_released", "holder": self.holder, "epoch": self.epoch})
        self.epoch = None

    def check(self) -> None:
        """Inside a transaction: lock the lease row for share if it is still ours, else raise."""
        with connection.cursor() as cursor:
            cursor.execute(_FENCE, self._params())
            held = cursor.fetchone() is not None
        if not held:
            self.epoch = None
            raise LeaseLost(f"the {self.name} lease is no longer held by {self.holder}")

    @contextmanager
    def fence(self):
        """A transaction in which the leader may write: it begins by checking the lease."""
        with transaction.atomic():
            if self.epoch is None:
                raise LeaseLost(f"{self.holder} does not hold the {self.name} lease")
            self.check()
            yield


class NoLease:
    """Acts as leader without any lease: only for tests that make two schedulers both believe they
    lead, to show that the unique constraints alone prevent duplicate runs."""

    name = SCHEDULER_LEASE
    epoch = 0
    is_leader = True

    def __init__(self, holder: str | None = None):
        self.holder = holder or default_holder()

    def ensure(self) -> bool:
        return True

    def release(self) -> None:
        pass

    @contextmanager
    def fence(self):
        with transaction.atomic():
            yield
