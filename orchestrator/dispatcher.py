"""The dispatcher: admits the due task runs that a concurrency limit applies to, moving them from
``scheduled`` to ``queued`` as far as the limits allow, in dispatch order (``orchestrator.due``:
live work before backfills, tenants in turn, priority), and wakes the workers of each queue. Due
work that no limit applies to is not its business: the workers claim it themselves, in the same
order (``worker.batch.CLAIM``), one hop and one write fewer. With no limit at all it does nothing.

``tick()`` is one short transaction, every statement of it prepared (``orchestrator.db``: the
statements of a throughput loop); ``serve()`` loops on it, woken by NOTIFY on
``orchestrator_dispatch`` (sent when work becomes due now), by the earliest future ``due_at``,
and by a polling fallback. Several dispatchers can run: rows are taken with SKIP LOCKED, and the
limit checks are serialized per limited queue/tenant (see ``_lock_limits``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import datetime

from django.db import transaction

from orchestrator import analyze, clock, db, due, tracing
from orchestrator.channels import DISPATCH_CHANNEL, wake_queues
from orchestrator.clock import system as system_clock
from orchestrator.conf import app_settings
from orchestrator.due import Limits, load_limits
from orchestrator.loop import SHORT_TRANSACTION, Loop, Role
from orchestrator.states import BUSY_TASK_STATES, TaskState, sql_list

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# Due work under a limit, in dispatch order (orchestrator.due), locked. Queues and tenants already
# at their limit are left out: their rows cannot move, and read first they would fill every batch
# and hold back everyone else's work. Rows another dispatcher holds are skipped, not waited for.
CANDIDATES = db.prepared(f"""
WITH RECURSIVE {due.ALL_KEYS}, {due.in_dispatch_order(
    f"{due.LIMITED} AND keys.queue <> ALL (%(full_queues)s::text[]) AND keys.tenant <> ALL (%(full_tenants)s::text[])",
    "%(batch)s")}
-- Each chosen row locked by its id (a join would let the planner read every scheduled row).
SELECT t.id, t.queue, t.tenant FROM chosen CROSS JOIN LATERAL (
    SELECT id, queue, tenant FROM orchestrator_taskrun
    WHERE id = chosen.id AND (state = '{TaskState.SCHEDULED}') IS TRUE
    FOR UPDATE SKIP LOCKED
) t
ORDER BY chosen.place
""")

# What is queued or running now, per queue and per tenant (the taskrun_busy index: the cost
# follows the busy rows, which the limits bound, not the backlog).
BUSY_ALL_QUEUES = db.prepared(f"""
SELECT queue, count(*) FROM orchestrator_taskrun WHERE state IN ({sql_list(BUSY_TASK_STATES)}) GROUP BY queue
""")
BUSY_ALL_TENANTS = db.prepared(f"""
SELECT tenant, count(*) FROM orchestrator_taskrun WHERE state IN ({sql_list(BUSY_TASK_STATES)}) GROUP BY tenant
""")

# What is queued or running now, per limited queue and per limited tenant.
BUSY_QUEUES = db.prepared(f"""
SELECT queue, count(*) FROM orchestrator_taskrun
WHERE state IN ({sql_list(BUSY_TASK_STATES)}) AND queue = ANY (%(keys)s::text[]) GROUP BY queue
""")
BUSY_TENANTS = db.prepared(f"""
SELECT tenant, count(*) FROM orchestrator_taskrun
WHERE state IN ({sql_list(BUSY_TASK_STATES)}) AND tenant = ANY (%(keys)s::text[]) GROUP BY tenant
""")

MARK_QUEUED = db.prepared(f"""
UPDATE orchestrator_taskrun SET state = '{TaskState.QUEUED}', queued_at = %(now)s
WHERE id = ANY (%(ids)s::bigint[]) AND (state = '{TaskState.SCHEDULED}') IS TRUE
""")

# The limit checks' locks (see _lock_limits), in the order of the keys.
LOCK_LIMITS = db.prepared(
    "SELECT pg_advisory_xact_lock(hashtextextended('orchestrator.limit.' || k, 0)) "
    "FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i")

HELD_BACK_PAUSE = 0.05

# When the next work under a limit is due (NULL: none is scheduled).
NEXT_DUE = db.prepared(due.next_due(due.ALL_KEYS, due.LIMITED))


def _lock_limits(cursor, queues: list[str], tenants: list[str]) -> None:
    """Serialize the limit check per limited queue and tenant, across dispatchers.

    Transaction-level advisory locks rather than row locks on QueueLimit/TenantLimit: a default
    limit has no row to lock, and an admin editing a limit should not wait on dispatchers. They
    are taken in one sorted order so two dispatchers cannot deadlock, and held to commit, so the
    second dispatcher counts the first one's queued rows.
    """
    keys = sorted([f"queue:{q}" for q in queues] + [f"tenant:{t}" for t in tenants])
    db.execute(cursor, LOCK_LIMITS, [keys])


def _full(cursor, limits: dict[str, int], default: int | None, busy_sql: str) -> list[str]:
    """The queues (or tenants) at their limit now. A hint only, read without the limit locks: the
    admission below re-counts under the locks, so a stale answer never lets a limit be exceeded."""
    if not limits and default is None:
        return []
    db.execute(cursor, busy_sql)
    busy = dict(cursor.fetchall())
    return sorted(name for name in set(busy) | set(limits)
                  if (limit := limits.get(name, default)) is not None and busy.get(name, 0) >= limit)


def _room(bound, keys: list[str], limits: dict, default, busy_sql: str) -> dict[str, int]:
    """The room left under each limited key (a queue or a tenant): its limit less its running
    work, read under the limits' locks."""
    if not keys:
        return {}
    db.execute(bound, busy_sql, {"keys": keys})
    busy = dict(bound.fetchall())
    return {key: limits.get(key, default) - busy.get(key, 0) for key in keys}


def _admit(bound, rows, limits: Limits) -> tuple[list[int], Counter]:
    """The candidates (task run, queue, tenant) the room under their limits admits, in order, and
    how many of them each queue got."""
    limited_queues = sorted({q for _, q, _ in rows if limits.queues.get(q, limits.queue_default) is not None})
    limited_tenants = sorted({t for _, _, t in rows if limits.tenants.get(t, limits.tenant_default) is not None})
    room_q: dict[str, int] = {}
    room_t: dict[str, int] = {}
    if limited_queues or limited_tenants:
        _lock_limits(bound, limited_queues, limited_tenants)
        room_q = _room(bound, limited_queues, limits.queues, limits.queue_default, BUSY_QUEUES)
        room_t = _room(bound, limited_tenants, limits.tenants, limits.tenant_default, BUSY_TENANTS)
    admitted, queues = [], Counter()
    for task_run_id, queue, tenant in rows:
        if room_q.get(queue, 1) <= 0 or room_t.get(tenant, 1) <= 0:
            continue
        if queue in room_q:
            room_q[queue] -= 1
        if tenant in room_t:
            room_t[tenant] -= 1
        admitted.append(task_run_id)
        queues[queue] += 1
    return admitted, queues


def tick(now: datetime | None = None, batch: int = 1000, limits: Limits | None = None) -> int:
    """Queue the due task runs under a limit that the limits allow; returns how many were queued.
    Work no limit applies to is the workers' to claim (``worker.batch.CLAIM``). ``limits`` (as
    returned by ``load_limits``) saves reading them on every tick."""
    now = now or clock.now()
    limits = limits or load_limits()
    if limits.none:
        return 0
    with transaction.atomic(), db.cursor() as bound:
        # Not waiting for the WAL flush: a queued mark lost in a database crash leaves the task
        # run scheduled, and the next tick queues it again. No JIT: the candidate query's row
        # estimates grow with the backlog (each key could hold it all) past jit_above_cost.
        db.execute(bound, SHORT_TRANSACTION)
        full_queues = _full(bound, limits.queues, limits.queue_default, BUSY_ALL_QUEUES)
        full_tenants = _full(bound, limits.tenants, limits.tenant_default, BUSY_ALL_TENANTS)
        db.execute(bound, CANDIDATES, {"now": now, "batch": batch, **limits.params(),
                                       "full_queues": full_queues, "full_tenants": full_tenants})
        rows = bound.fetchall()
        if not rows:
            return 0
        admitted, queues = _admit(bound, rows, limits)
        if admitted:
            db.execute(bound, MARK_QUEUED, {"ids": admitted, "now": now})
            wake_queues(queues)
            tracing.dispatched(admitted, now)
        return len(admitted)


def next_due(limits: Limits | None = None) -> datetime | None:
    """When the next work under a limit is due (None: none is scheduled)."""
    limits = limits or load_limits()
    if limits.none:
        return None
    with db.cursor() as cursor:
        db.execute(cursor, NEXT_DUE, limits.params())
        return cursor.fetchone()[0]


class Dispatcher(Role):
    """The dispatcher role on the shared loop: woken by NOTIFY on ``orchestrator_dispatch``, by
    the earliest future ``due_at`` and by the poll."""

    role = "dispatcher"
    channels = (DISPATCH_CHANNEL,)

    def __init__(self, poll: float | None = None, clock=None):
        self.poll = poll if poll is not None else app_settings.POLL_SECONDS
        self.clock = clock or system_clock
        self.limits, self.limits_at = None, -1e9
        self.last_tick = -1e9
        self.held_back = False
        self.announced = False
        self.freshness = analyze.Freshness()  # the job tables' statistics, analyzed once they doubled

    def serve(self, max_seconds: float | None = None) -> None:
        log.info("dispatcher started", extra={"action": "dispatcher_start"})
        Loop(self, poll=self.poll, max_seconds=max_seconds).run()

    def tick(self) -> bool:
        if self.held_back and not self.announced and self._pause_left() > 0:
            return False
        # A NOTIFY from here on is for work this tick may not see: it makes the next one look.
        self.announced = False
        if time.monotonic() - self.limits_at > self.poll:
            # A limit edited in the admin applies within one poll interval.
            self.limits, self.limits_at = load_limits(), time.monotonic()
        self.last_tick = time.monotonic()
        self.freshness.check(self.last_tick)
        return tick(self.clock.now(), limits=self.limits) > 0  # more due work than one batch: again

    def notified(self, notifies: list) -> None:
        self.announced = True

    def next_wait(self) -> float | None:
        """Until the next due time, or the poll. Due work that the last tick left is held back by
        a limit or a full queue, or new: committed after the tick's snapshot, and announced by a
        NOTIFY. Held-back work waits for the pause to end, and the ticks it causes are spaced
        out (each would read the same held-back keys again for nothing); a NOTIFY ends the pause
        at once, so work that arrives during a tick waits for no pause."""
        upcoming = next_due(self.limits)
        self.held_back = False
        if upcoming is None:
            return None
        until = (upcoming - self.clock.now()).total_seconds()
        if until > 0:
            return min(self.poll, until)
        self.held_back = True
        return 0.0 if self.announced else max(self._pause_left(), 0.0) or None

    def _pause_left(self) -> float:
        return self.last_tick + HELD_BACK_PAUSE - time.monotonic()

    def stop(self) -> None:
        log.info("dispatcher stopped", extra={"action": "dispatcher_stop"})


__all__ = ["Dispatcher", "tick", "next_due"]
