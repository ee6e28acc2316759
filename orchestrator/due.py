"""Due work in dispatch order: the SQL with which the workers claim the due task runs that no
concurrency limit holds back, and the dispatcher admits those that one does (``dispatcher``).

Dispatch order is one rule for both: the live lane before backfills; within a lane the tenants
take turns (every tenant's first task run, then every tenant's second, ...), so a tenant with ten
thousand due task runs cannot push out one with a single task run; within a tenant, higher
priority first, then the earlier due time.

The cost does not follow the backlog. ``keys`` walks the distinct (queue, lane, tenant, priority)
of the scheduled rows on the taskrun_due_by_queue index, one index probe per key (a loose index scan:
PostgreSQL has no skip scan); each key then reads at most a batch of due rows in (due_at, id)
order from the same index. A read therefore touches at most keys x batch rows whether 1,000 or
10,000,000 are due, and a delayed row costs one probe per key.

The statements are made of the pieces below: ``WITH RECURSIVE <keys>, <in dispatch order>``, then
what the caller does with ``chosen`` (id, place: its position in dispatch order).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.conf import app_settings
from orchestrator.models import QueueLimit, TenantLimit
from orchestrator.states import TaskState

SCHEDULED = TaskState.SCHEDULED

# Every key of the scheduled work (the dispatcher reads all queues).
ALL_KEYS = f"""keys AS (
    (SELECT queue, lane, tenant, priority FROM orchestrator_taskrun
     WHERE state = '{SCHEDULED}' ORDER BY queue, lane, tenant, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.lane, n.tenant, n.priority FROM keys CROSS JOIN LATERAL (
        SELECT queue, lane, tenant, priority FROM orchestrator_taskrun
        WHERE state = '{SCHEDULED}' AND (queue, lane, tenant, priority) > (keys.queue, keys.lane, keys.tenant, keys.priority)
        ORDER BY queue, lane, tenant, priority LIMIT 1
    ) n
)"""

# The keys of the queues in %(queues)s only (a worker's), walked from the first key of each.
QUEUE_KEYS = f"""keys AS (
    SELECT f.queue, f.lane, f.tenant, f.priority FROM unnest(%(queues)s::text[]) AS q(name) CROSS JOIN LATERAL (
        SELECT queue, lane, tenant, priority FROM orchestrator_taskrun
        WHERE state = '{SCHEDULED}' AND queue = q.name ORDER BY queue, lane, tenant, priority LIMIT 1
    ) f
    UNION ALL
    SELECT n.queue, n.lane, n.tenant, n.priority FROM keys CROSS JOIN LATERAL (
        SELECT queue, lane, tenant, priority FROM orchestrator_taskrun
        -- "queue <= keys.queue", not "queue = keys.queue": an equality on the index's first
        -- column would be where the scan starts, and the row comparison only a filter on every
        -- row of the queue (measured: 4.8 ms with 40,000 due, against 0.05 ms).
        WHERE state = '{SCHEDULED}' AND queue <= keys.queue
          AND (queue, lane, tenant, priority) > (keys.queue, keys.lane, keys.tenant, keys.priority)
        ORDER BY queue, lane, tenant, priority LIMIT 1
    ) n
)"""

# What a worker may claim itself: keys of a queue and a tenant that no limit applies to.
UNLIMITED = "keys.queue <> ALL (%(limited_queues)s::text[]) AND keys.tenant <> ALL (%(limited_tenants)s::text[])"

# What the dispatcher admits: keys that a limit applies to (every key when a default limit is set).
LIMITED = ("(%(every)s OR keys.queue = ANY (%(limited_queues)s::text[]) "
           "OR keys.tenant = ANY (%(limited_tenants)s::text[]))")


def in_dispatch_order(which: str, batch: str) -> str:
    """``due``: up to ``batch`` due rows of each key that ``which`` lets through, with each row's
    turn within its (lane, tenant); ``chosen``: the first ``batch`` of them in dispatch order, with
    their place in it. Nothing is locked here: the caller locks ``chosen`` in place order with
    SKIP LOCKED, so a row another process is taking is passed over, not waited for."""
    return f"""due AS (
    SELECT d.id, keys.lane, d.priority, d.due_at,
           row_number() OVER (PARTITION BY keys.lane, keys.tenant ORDER BY d.priority DESC, d.due_at, d.id) AS turn
    FROM keys CROSS JOIN LATERAL (
        SELECT id, priority, due_at FROM orchestrator_taskrun
        WHERE state = '{SCHEDULED}' AND queue = keys.queue AND lane = keys.lane AND tenant = keys.tenant
          AND priority = keys.priority AND due_at <= %(now)s
        ORDER BY due_at, id LIMIT {batch}
    ) d
    WHERE {which}
), chosen AS (
    SELECT id, row_number() OVER (ORDER BY lane, turn, priority DESC, due_at, id) AS place
    FROM due WHERE turn <= {batch}
    ORDER BY place LIMIT {batch}
)"""


def earliest(which: str, leaving_out: str = "") -> str:
    """A SELECT of the earliest due time of the scheduled rows of the keys ``which`` lets through
    (NULL: none), one index probe per key; ``leaving_out``: an array of ids not to count."""
    but = f" AND id <> ALL ({leaving_out})" if leaving_out else ""
    return f"""SELECT min(d.due_at) AS next_due FROM keys CROSS JOIN LATERAL (
    SELECT due_at FROM orchestrator_taskrun
    WHERE state = '{SCHEDULED}' AND queue = keys.queue AND lane = keys.lane AND tenant = keys.tenant
      AND priority = keys.priority{but}
    ORDER BY due_at LIMIT 1
) d
WHERE {which}"""


def next_due(keys: str, which: str) -> str:
    """The statement of ``earliest`` over ``keys``."""
    return f"WITH RECURSIVE {keys}\n{earliest(which)}"


@dataclass(frozen=True)
class Limits:
    """The concurrency limits: per queue and per tenant (the admin's rows), and the defaults that
    apply where no row does (None: unlimited)."""

    queues: dict[str, int]
    queue_default: int | None
    tenants: dict[str, int]
    tenant_default: int | None

    @property
    def every(self) -> bool:
        """A default limit is set: every queue (or tenant) is limited."""
        return self.queue_default is not None or self.tenant_default is not None

    @property
    def none(self) -> bool:
        return not (self.queues or self.tenants or self.every)

    def params(self) -> dict:
        """The statements' parameters (orchestrator.due.LIMITED and UNLIMITED)."""
        return {"every": self.every, "limited_queues": sorted(self.queues), "limited_tenants": sorted(self.tenants)}


def load_limits() -> Limits:
    """The limits as the admin and the settings have them now."""
    return Limits(dict(QueueLimit.objects.values_list("queue", "max_running")), app_settings.DEFAULT_QUEUE_LIMIT,
                  dict(TenantLimit.objects.values_list("tenant", "max_running")), app_settings.DEFAULT_TENANT_LIMIT)
