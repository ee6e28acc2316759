"""How the statements of the hot path reach PostgreSQL: the worker's batch (outcomes and claims)
and the dispatcher's tick.

* **Parameters apart from the SQL text** (server-side binding). Django's psycopg cursors bind on
  the client: every id of a batch is formatted into the text as a literal, in Python, and the
  server parses it again. Here an array of a thousand ids is one binary value.
* **Prepared once per connection**: parsed and planned at the first execution, not at every
  batch (planning the worker's statements took about a third of the server's time per batch).
  Behind a pooler in transaction mode (``database_url.is_transaction_pooled``) a statement
  prepared on one server session is unknown to the next, so they are prepared there only with
  ``ORCHESTRATOR_POOLER_PREPARED_STATEMENTS`` on, for PgBouncer 1.21 or later with
  ``max_prepared_statements``: it follows the protocol-level Parse/Bind that psycopg sends (never
  SQL ``PREPARE``) and prepares each statement again on whichever server connection runs it. An
  older pooler passes them through, and the second client whose transaction lands on the same
  server connection finds its statement name taken (or missing); that error is turned into one
  naming the setting (``PreparedStatementsLost``), which stops the role as a configuration error
  rather than being retried as an outage forever.
* **Pipelined**: ``pipeline()`` sends the statements of a batch without waiting for each answer,
  so a batch costs one round trip, not one per statement; the first read of a result waits for
  what was sent before it. A batch's transaction begins in its pipeline too (``atomic``): psycopg's
  own BEGIN would wait for its answer before anything else is sent.
* **Lists as binary arrays**: as text, psycopg escapes every element in Python and the server
  parses the text again.
* **Converted once per statement**: the statements are written with Python's placeholders
  (``%(name)s``, ``%s``) and comments; each one's text with PostgreSQL's own placeholders
  (``$1``), without its comments, is made once per process and cached. psycopg converts a
  statement at every execution and caches only short ones: the worker's claim took 0.2 ms of
  the worker's CPU per batch in that conversion alone.

These cursors share Django's connection and its transaction (``transaction.atomic`` applies).

**Which path a statement takes**, one rule per statement:

* ``execute`` (prepared, bound on the server, pipelined) for the statements that every turn of the
  two throughput loops runs, whatever its work: a worker's batch (``worker.batch``: its commit
  mode, the outcomes' ``resolver.END_TASK_RUNS``, the claim) and a dispatcher's tick
  (``dispatcher``). Their parse, plan and round trip would otherwise be paid per unit of
  throughput. Each is declared at module level with ``prepared()``, and ``execute`` runs nothing
  else. The one exception to "module level": the producers' insert of new runs and their task
  runs (``runs.insert_new_runs``, every enqueue and every run created), declared once per shape
  of its columns. It is long, and through Django's cursor its text was parsed and every value
  formatted into it in Python at each enqueue: more of a one-job producer's time than the
  database's work. Django's ``execute_wrapper`` (and ``CaptureQueriesContext``) does not see
  these statements; ``tests/support/sent.py`` sees both paths.
* Django's cursor or the ORM for every other statement: what a batch runs only for part of its
  work (a workflow task's children and the end of its run, mapping, the task context, callbacks,
  dataset events), and all that the scheduler, the reaper, control actions, pages and commands
  run. They follow events, not throughput; prepared, they would only leave plans in the session
  of every process that ran them once.

``tests/test_db_paths.py`` holds the product to it: no declared statement goes through Django's
cursor, and a worker's batch and a dispatcher's tick send nothing through Django's cursor.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from functools import cache

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from psycopg.types.array import ListBinaryDumper
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

from orchestrator.conf import app_settings
from orchestrator.database_url import is_transaction_pooled

# psycopg prepares nothing on a connection whose prepare_threshold is None (Django's default).
# This threshold lets the statements below be prepared when asked to (``prepare=True``) and still
# leaves Django's own queries alone: none repeats two billion times on one connection.
ONLY_WHEN_ASKED = 2**31 - 1


def _pooled() -> bool:
    return is_transaction_pooled(connection.settings_dict)


def _prepared() -> bool:
    """Whether the hot path's statements are prepared on this connection."""
    return not _pooled() or app_settings.POOLER_PREPARED_STATEMENTS


class PreparedStatementsLost(ImproperlyConfigured):
    """The pooler did not keep a prepared statement: it cannot carry them (PgBouncer before 1.21,
    or ``max_prepared_statements`` 0) while the setting says it can."""


# What a pooler that passes prepared statements through to any server connection makes of them:
# a name another client prepared on that connection, or one prepared on another connection.
_LOST = (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)


def _lost(exc: BaseException) -> BaseException | None:
    """The pooler's lost prepared statement behind ``exc``, if it is one: the error itself, or
    what it was raised from or during (Django's wrapper of it; a transaction's end that failed
    again after a pipeline was aborted by it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _LOST):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def explain_lost(exc: BaseException) -> None:
    """Raise PreparedStatementsLost when ``exc`` comes from a prepared statement that the pooler
    lost while the setting says it keeps them: a configuration error, not an outage to retry.
    The loop asks it of every database error, wherever in a batch the error surfaced."""
    lost = _lost(exc)
    if lost is not None and _pooled():
        raise PreparedStatementsLost(
            f"ORCHESTRATOR_POOLER_PREPARED_STATEMENTS is on, but the pooler in front of the database lost a "
            f"prepared statement ({type(lost).__name__}: {str(lost).strip().splitlines()[0]}). It needs PgBouncer "
            f"1.21 or later with max_prepared_statements above 0 in pgbouncer.ini; with an older pooler, turn "
            f"the setting off.") from exc


@contextmanager
def _explained():
    try:
        yield
    except _LOST as exc:
        explain_lost(exc)
        raise


# A quoted literal (kept as it is), a comment (dropped) or a placeholder (numbered).
_TOKEN = re.compile(r"'(?:[^']|'')*'|--[^\n]*|%\((\w+)\)s|%s|%%")


class Prepared(str):
    """A statement of the throughput loops, run with ``execute`` (see the rule above)."""


def prepared(sql: str) -> Prepared:
    """Declare ``sql`` a statement of the throughput loops."""
    return Prepared(sql)


@cache
def native(sql: str) -> tuple[str, tuple[str, ...] | None]:
    """``sql`` with PostgreSQL's placeholders and without comments, and the parameter names in
    placeholder order (None: positional ``%s`` parameters, passed in their own order)."""
    names: list[str] = []
    positional = 0

    def replace(match: re.Match) -> str:
        nonlocal positional
        token = match.group(0)
        if token.startswith("'"):
            return token
        if token.startswith("--"):
            return ""
        if token == "%%":
            return "%"
        if token == "%s":
            positional += 1
            return f"${positional}"
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _TOKEN.sub(replace, sql)
    if names and positional:
        raise ValueError("a statement takes named or positional parameters, not both")
    return text, tuple(names) if names else None


def cursor():
    """A cursor with PostgreSQL's own placeholders and server-side binding on Django's connection
    (use it in a ``with``); run statements on it with ``execute``."""

    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None and _prepared():
        raw.prepare_threshold = ONLY_WHEN_ASKED
    cur = psycopg.RawCursor(raw)
    # Every int as a bigint: left to choose, psycopg sends an array of small ids as int2[] and of
    # larger ones as int4[] or int8[], each a statement prepared (and planned) apart, after a scan
    # of every element to find its width.
    cur.adapters.register_dumper(int, Int8Dumper)
    cur.adapters.register_dumper(int, Int8BinaryDumper)
    # Every list as a binary array: as text, psycopg escapes each element in Python (two regular
    # expressions per string) and the server parses the text again; a batch's endings send ten
    # arrays of one element per job.
    cur.adapters.register_dumper(list, ListBinaryDumper)
    return cur


def execute(cur, sql: str, params=None):
    """Run ``sql`` (written with ``%(name)s`` or ``%s`` placeholders, declared with ``prepared``)
    on a ``cursor()``, prepared unless the connection goes through a transaction pooler that cannot
    keep them."""
    if not isinstance(sql, Prepared):
        raise TypeError("db.execute runs only the statements of the throughput loops, declared with "
                        "db.prepared(); run any other statement on Django's cursor (see orchestrator.db)")
    text, names = native(sql)
    if names is not None:
        params = [params[name] for name in names]
    with _explained():
        return cur.execute(text, params, prepare=_prepared())


# A transaction's ends as statements of a pipeline (``atomic``).
BEGIN = prepared("BEGIN")
COMMIT = prepared("COMMIT")


@contextmanager
def atomic():
    """Django's atomic block for statements sent in a pipeline (``pipeline``); yields whether it
    is the outermost one. The outermost one's transaction is begun by the caller: its first
    statement in the pipeline is ``BEGIN``, and its last one ``COMMIT`` (left out after something
    marked the block for a rollback: Django then rolls back what is open, as it does on an error).
    Left to itself, psycopg begins the transaction before the pipeline's first statement and waits
    for that BEGIN's answer: a round trip, with the server woken, before anything else is sent.
    Inside a caller's transaction the block is Django's savepoint, and nothing is to be sent."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:
            # Django's block stays open (nested blocks are savepoints); psycopg, told that nothing
            # is open, sends no BEGIN of its own. The end of Django's block commits or rolls back
            # whatever is still open and sets autocommit back.
            connection.connection.autocommit = True
        yield outermost


@contextmanager
def pipeline():
    """Send what follows without waiting for each answer (psycopg's pipeline mode; nested ones
    are allowed, each one's end waits for what it sent). A statement's error shows at the end of
    the pipeline or at the first read after it, hence the explanation around the whole of it."""
    connection.ensure_connection()
    with _explained(), connection.connection.pipeline() as pipe:
        yield pipe
