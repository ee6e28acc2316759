"""Every NOTIFY channel of the product, the statements that send on them, and the LISTEN helpers.

The processes wake each other through PostgreSQL's LISTEN/NOTIFY; a notification is only a
hint ("look now"), each role also polls, so a lost one costs latency, never work. A NOTIFY sent
inside a transaction is delivered when it commits (never if it rolls back), and PostgreSQL folds
identical notifications of one transaction into one, so callers may send freely.

=========================  ============================  ===========================================
channel                    sent by                       listened to by
=========================  ============================  ===========================================
``orchestrator_dispatch``  runs created, tasks released  the dispatchers (due work under a
                                                         concurrency limit may now be queued)
``orchestrator_queue_Q``   runs created, the dispatcher  the workers serving queue Q (work of Q
                                                         became due, or was queued under a limit;
                                                         payload ``N T``: N rows, wake-up token T)
``orchestrator_due``       tasks released, retries,      every worker (work became due in queues
                           control, scheduler            the sender did not look up)
``orchestrator_cancel``    ``control`` cancelling runs   the workers (payload: task run ids, or
                                                         empty: "check what is still yours")
``orchestrator_schedules`` schedule edits, dataset       the schedulers (a schedule changed, or a
                           events                        dataset event may fire one)
``orchestrator_code``      ``sync_workflows``            the workers (payload: the new code
                                                         generation: replace the children, see
                                                         ``orchestrator.reload``)
``orchestrator_fleet``     a worker registering,         the workers (the set of workers serving
                           draining or stopping          each queue changed: see ``worker.wakeup``)
=========================  ============================  ===========================================

**Wake by work, not by worker.** A notification of a queue says how many rows became due (N) and
carries a wake-up token T, the last of N values the sender drew from one sequence in the same
statement as the NOTIFY (no extra query). Each worker serving the queue places the fleet's slots
on a ring (every live worker of the queue, by id, as many places as its concurrency, read with
its heartbeat) and answers only if one of the places T-N+1 .. T (mod the ring) is its own: about
N slots answer, in turn around the fleet, and the others stay asleep; N at least the ring's size
wakes everyone. An empty payload (a sender that did not count, the due channel) wakes every
listener as before. See ``worker.wakeup`` for what a worker does with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from psycopg import sql

from orchestrator.conf import app_settings
from orchestrator.database_url import connect_params, is_transaction_pooled, parse_database_url

DISPATCH_CHANNEL = "orchestrator_dispatch"
DUE_CHANNEL = "orchestrator_due"
SCHEDULES_CHANNEL = "orchestrator_schedules"
CANCEL_CHANNEL = "orchestrator_cancel"
QUEUE_CHANNEL_PREFIX = "orchestrator_queue_"
CODE_CHANNEL = "orchestrator_code"
FLEET_CHANNEL = "orchestrator_fleet"

# The sequence the wake-up tokens are drawn from (migration 0018).
WAKE_SEQUENCE = "orchestrator_wake_token"
# A notification draws at most this many tokens; a larger count wakes every listener of its queue
# (a burst that size needs every free slot anyway), so a bulk insert draws no more.
MAX_TOKENS = 1024

# PostgreSQL takes a NOTIFY payload of under 8000 bytes.
MAX_PAYLOAD = 7000


def queue_channel(queue: str) -> str:
    """The NOTIFY channel of a queue. PostgreSQL channel names end at 63 bytes, so a long queue
    name is replaced by its hash (the same on both sides: dispatchers and workers)."""
    channel = f"{QUEUE_CHANNEL_PREFIX}{queue}"
    if len(channel.encode()) > 63:
        channel = f"{QUEUE_CHANNEL_PREFIX}{hashlib.sha256(queue.encode()).hexdigest()[:40]}"
    return channel


# --- NOTIFY (all delivered at commit) ----------------------------------------------------------

# One statement for any number of channels: one NOTIFY per queue that received work. A counted
# channel (count not NULL) carries "N T": the rows and the last of the N tokens drawn for them
# (the nextval calls are the only cost: no row is read). An uncounted one carries nothing, so
# PostgreSQL folds it with its twins of the same transaction.
_NOTIFY_MANY = f"""
SELECT pg_notify(c.channel, CASE WHEN c.n IS NULL OR c.n > {MAX_TOKENS} THEN '' ELSE c.n || ' ' || (
    SELECT max(nextval('{WAKE_SEQUENCE}')) FROM generate_series(1, c.n)) END)
FROM unnest(%(channels)s::text[], %(counts)s::int[]) AS c(channel, n)
"""


def _notify(channels: dict[str, int | None]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_NOTIFY_MANY, {"channels": list(channels), "counts": list(channels.values())})


def _queue_channels(queues: Iterable[str] | Mapping[str, int]) -> dict[str, int | None]:
    """Each queue's channel with its count (None: not counted, which wakes every listener)."""
    counted = isinstance(queues, Mapping)
    channels: dict[str, int | None] = {}
    for queue in sorted(set(queues)):
        channel = queue_channel(queue)
        if counted and queues[queue] > 0:
            channels[channel] = (channels.get(channel) or 0) + queues[queue]
        elif counted:
            continue
        else:
            channels[channel] = None
    return channels


def wake_due(queues: Iterable[str] | Mapping[str, int] | None = None) -> None:
    """Work became due now (a run was created, a task was released or retried): the dispatchers
    look (work under a concurrency limit is theirs to admit), and so do the workers of these
    queues, which claim the rest themselves. ``queues`` as a mapping counts the rows of each
    queue, and about that many free slots answer; as queue names, every worker of these queues
    looks; without ``queues``, every worker of every queue."""
    channels: dict[str, int | None] = {DISPATCH_CHANNEL: None}
    channels.update(_queue_channels(queues) if queues is not None else {DUE_CHANNEL: None})
    _notify(channels)


def wake_dispatchers() -> None:
    """Room freed under a concurrency limit (a task run ended): the dispatchers look again."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [DISPATCH_CHANNEL])


def wake_schedulers() -> None:
    """A schedule was created, changed or resumed, or a dataset event may fire one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [SCHEDULES_CHANNEL])


def wake_queues(queues: Iterable[str] | Mapping[str, int]) -> None:
    """Task runs were queued: the workers of these queues claim them (about as many free slots
    as ``queues`` counts, when it is a mapping)."""
    channels = _queue_channels(queues)
    if channels:
        _notify(channels)


def parse_wake(payload: str) -> tuple[int, int] | None:
    """A queue notification's (rows, token), or None when it counted nothing (wake everyone).
    Anything else than two whole numbers is read as uncounted: waking too many is safe."""
    parts = payload.split()
    if len(parts) != 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    count, token = int(parts[0]), int(parts[1])
    return (count, token) if count > 0 else None


def announce_code(generation: int) -> None:
    """A sync completed: the workers replace their children, which then run the code on disk."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CODE_CHANNEL, str(generation)])


def announce_cancelled(task_run_ids: list[int]) -> None:
    """Running task runs were cancelled: the workers running them stop them. Past the payload
    limit, an empty payload tells every worker to check which of its task runs are still its own."""
    payload = json.dumps(task_run_ids)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CANCEL_CHANNEL, payload if len(payload) < MAX_PAYLOAD else ""])


# --- LISTEN ------------------------------------------------------------------------------------


# How the LISTEN connections show in pg_stat_activity (unless the URL names its own).
LISTEN_APPLICATION_NAME = "orchestrator listen"
LISTEN_POLL = "poll"


def listen_params() -> dict | None:
    """psycopg.connect() arguments of the LISTEN connection, or None when the processes poll.

    A pooler in transaction mode cannot carry LISTEN: the session that listens goes back to the
    pool after the statement, and its notifications reach whichever client borrows it next, or no
    one. So behind one, LISTEN goes to ``ORCHESTRATOR_LISTEN_DATABASE_URL`` (a direct
    connection), and without it nothing listens and the roles poll."""


    url = app_settings.LISTEN_DATABASE_URL.strip()
    if url == LISTEN_POLL:
        return None
    if url:
        try:
            database = parse_database_url(url)
        except ValueError as exc:
            raise ImproperlyConfigured(f"ORCHESTRATOR_LISTEN_DATABASE_URL: {exc}") from None
        if is_transaction_pooled(database):
            raise ImproperlyConfigured("ORCHESTRATOR_LISTEN_DATABASE_URL must be a direct connection to "
                                       "PostgreSQL, not a pooler in transaction mode")
        params = connect_params(database)
    elif is_transaction_pooled(connection.settings_dict):
        return None
    else:
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "server_side_binding"):
            params.pop(key, None)
    params.setdefault("application_name", LISTEN_APPLICATION_NAME)
    return params


def listen_connection(*channels: str):
    """A separate autocommit connection that LISTENs (Django's connection stays free for work), or
    None when the processes poll instead (see ``listen_params``)."""

    params = listen_params()
    if params is None:
        return None
    conn = psycopg.connect(**params, autocommit=True)
    for channel in channels:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


def drain_notifies(conn) -> list:
    """Every notification already received, without waiting."""
    return list(conn.notifies(timeout=0))
