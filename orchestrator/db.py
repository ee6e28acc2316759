"""How the statements of the hot path reach PostgreSQL: the worker's batch (outcomes and claims)
and the dispatcher's tick.

* **Parameters apart from the SQL text** (server-side binding). Django's psycopg cursors bind on
  the client: every id of a batch is formatted into the text as a literal, in Python, and the
  server parses it again. Here an array of a thousand ids is one binary value.
* **Prepared once per connection**: parsed and planned at the first execution, not at every
  batch (planning the worker's statements took about a third of the server's time per batch).
  Not behind a pooler in transaction mode, where a statement prepared on one server session is
  unknown to the next (``database_url.is_transaction_pooled``).
* **Pipelined**: ``pipeline()`` sends the statements of a batch without waiting for each answer,
  so a batch costs one round trip, not one per statement; the first read of a result waits for
  what was sent before it.

These cursors share Django's connection and its transaction (``transaction.atomic`` applies).
"""

from __future__ import annotations

from django.db import connection

from orchestrator.database_url import is_transaction_pooled

# psycopg prepares nothing on a connection whose prepare_threshold is None (Django's default).
# This threshold lets the statements below be prepared when asked to (``prepare=True``) and still
# leaves Django's own queries alone: none repeats two billion times on one connection.
ONLY_WHEN_ASKED = 2**31 - 1


def _pooled() -> bool:
    return is_transaction_pooled(connection.settings_dict)


def cursor():
    """A server-side binding cursor on Django's connection (use it in a ``with``)."""
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None and not _pooled():
        raw.prepare_threshold = ONLY_WHEN_ASKED
    return psycopg.Cursor(raw)


def execute(cur, sql: str, params=None):
    """Run ``sql`` on ``cur``, prepared unless the connection goes through a transaction pooler."""
    return cur.execute(sql, params, prepare=not _pooled())


def pipeline():
    """Send what follows without waiting for each answer (psycopg's pipeline mode; nested ones
    are allowed, each one's end waits for what it sent)."""
    connection.ensure_connection()
    return connection.connection.pipeline()
