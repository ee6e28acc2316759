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
                                                         became due, or was queued under a limit)
``orchestrator_due``       tasks released, retries,      every worker (work became due in queues
                           control, scheduler            the sender did not look up)
``orchestrator_cancel``    ``control`` cancelling runs   the workers (payload: task run ids, or
                                                         empty: "check what is still yours")
``orchestrator_schedules`` schedule edits, dataset       the schedulers (a schedule changed, or a
                           events                        dataset event may fire one)
``orchestrator_code``      ``sync_workflows``            the workers (payload: the new code
                                                         generation: replace the children, see
                                                         ``orchestrator.reload``)
=========================  ============================  ===========================================
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from django.db import connection

DISPATCH_CHANNEL = "orchestrator_dispatch"
DUE_CHANNEL = "orchestrator_due"
SCHEDULES_CHANNEL = "orchestrator_schedules"
CANCEL_CHANNEL = "orchestrator_cancel"
QUEUE_CHANNEL_PREFIX = "orchestrator_queue_"
CODE_CHANNEL = "orchestrator_code"

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

# One statement for any number of channels: one NOTIFY per queue that received work.
_NOTIFY_MANY = "SELECT pg_notify(channel, '') FROM unnest(%(channels)s::text[]) AS channel"


def wake_due(queues: Iterable[str] | None = None) -> None:
    """Work became due now (a run was created, a task was released or retried): the dispatchers
    look (work under a concurrency limit is theirs to admit), and so do the workers of these
    queues, which claim the rest themselves; without ``queues``, every worker looks."""
    channels = [DISPATCH_CHANNEL]
    channels += sorted({queue_channel(queue) for queue in queues}) if queues is not None else [DUE_CHANNEL]
    with connection.cursor() as cursor:
        cursor.execute(_NOTIFY_MANY, {"channels": channels})


def wake_dispatchers() -> None:
    """Room freed under a concurrency limit (a task run ended): the dispatchers look again."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [DISPATCH_CHANNEL])


def wake_schedulers() -> None:
    """A schedule was created, changed or resumed, or a dataset event may fire one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [SCHEDULES_CHANNEL])


def wake_queues(queues: Iterable[str]) -> None:
    """Task runs were queued: the workers of these queues claim them."""
    channels = sorted({queue_channel(queue) for queue in queues})
    if channels:
        with connection.cursor() as cursor:
            cursor.execute(_NOTIFY_MANY, {"channels": channels})


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
    from django.core.exceptions import ImproperlyConfigured

    from orchestrator.conf import app_settings
    from orchestrator.database_url import connect_params, is_transaction_pooled, parse_database_url

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
    import psycopg
    from psycopg import sql

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
