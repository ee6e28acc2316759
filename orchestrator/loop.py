"""One loop for every long-running role: scheduler, dispatcher, worker and reaper.

A role does its work in ``tick()``: one bounded unit of work that returns whether it did any.
The loop around it is the same for every role:

* **wait** until a NOTIFY on the role's channels, a file the role watches (a worker's children),
  a signal, or the role's next due time (``next_wait()``), whichever comes first; after a tick
  that did work, not at all (there may be more);
* **SIGTERM/SIGINT** are counted and wake the loop at once; the role says what stopping means in
  ``finished()`` (most stop after the current tick, a worker drains first);
* **any database error**, Django's or psycopg's, on Django's connection or on the LISTEN one, is
  handled the same way (a restart, a failover, a deadlock, tables not migrated yet): logged once
  per outage (and once a minute while it lasts), then the loop backs off (exponentially, with
  jitter, up to ``RECONNECT_MAX_SECONDS``), closes every connection, and tries again; once the
  database answers, the role's ``reconnected()`` runs (a worker re-checks its claims) and the
  loop logs how long the outage lasted. What the role keeps in memory (a worker's unrecorded
  outcomes, its running tasks) is untouched, so running tasks keep running through the outage
  and their outcomes are recorded afterwards.

Anything else a tick raises is a bug: it propagates, the process exits non-zero, and the
supervisor restarts it (with back-off).
"""

from __future__ import annotations

import logging
import random
import selectors
import signal
import socket
import time
from collections.abc import Callable, Sequence

import psycopg
from django.db import DatabaseError, InterfaceError, connections

from orchestrator import db
from orchestrator.channels import drain_notifies, listen_connection
from orchestrator.conf import app_settings

log = logging.getLogger(__name__)

# What "the database is away" looks like: Django wraps psycopg's errors on its own connections;
# the LISTEN connection is a plain psycopg one.
DATABASE_ERRORS = (DatabaseError, InterfaceError, psycopg.Error)

RECONNECT_FIRST_SECONDS = 0.2  # the first retry; each failure doubles it, up to the cap
REMIND_SECONDS = 60.0  # while the errors go on, one log line a minute says so
RECYCLE_SECONDS = 10.0  # how often CONN_MAX_AGE is checked

# The first statement of a dispatcher tick and of a worker's batch: commit without waiting for the
# WAL flush (each role says why a lost commit is harmless), and no JIT: their statements are short,
# and planner estimates inflated by a big backlog would otherwise compile one for far longer than
# it runs (700 ms of compiling for a 10 ms dispatcher tick was measured). Their prepared statements
# (orchestrator.db) keep one plan, made for any parameters: left to choose, PostgreSQL plans the
# claim anew at every batch (its plan for given values looks cheaper), which cost as much as
# running it. And no sequential scan: every row they read is found by id or on an index, but a
# plan made while a table was small (a new install, or right after a burst: statistics lag by up
# to a minute) would read the whole table instead, and a kept plan would go on doing so until the
# next ANALYZE (a claim of 15 rows reading 9,400 runs: 5.5 ms instead of 0.1).
SHORT_TRANSACTION = db.prepared(
    "SELECT set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)")

_SIGNAL = object()
_LISTEN = object()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class Role:
    """What a role gives the loop. Only ``tick`` is required."""

    role = "role"  # what the log lines say: "worker: database error (...)"
    channels: Sequence[str] = ()  # LISTEN on these; a notification wakes the loop

    def start(self, loop: Loop) -> None:
        """Set up (register, fork children, watch files). May touch the database: a database
        error here is retried like one in ``tick``."""

    def tick(self) -> bool:
        raise NotImplementedError

    def next_wait(self) -> float | None:
        """Seconds until the role has something to do without being woken (None: the poll)."""
        return None

    def notified(self, notifies: list) -> bool | None:
        """Notifications received on ``channels``. The loop then ticks, unless this returns False:
        nothing to do for them (a worker that is not one of those asked), so it waits on."""

    def finished(self, stop_requests: int) -> bool:
        return stop_requests > 0

    def reconnected(self) -> None:
        """The database answers again after an outage (called before the next tick)."""

    def stop(self) -> None:
        """Clean up on the way out (the database may be away: failures are the role's to log)."""


class Together(Role):
    """Several roles on one loop, for a small deployment that wants fewer processes (``manage.py
    scheduler --dispatch``): each keeps its own ticks, waits and notifications; the loop ticks all
    of them, waits for the earliest, and hands each notification to the roles that listen on its
    channel. A database error in any of them is one error of the process, handled as always."""

    def __init__(self, *roles: Role):
        self.roles = roles
        self.role = "+".join(role.role for role in roles)
        self.channels = tuple(dict.fromkeys(channel for role in roles for channel in role.channels))
        self.poll = None

    def start(self, loop: Loop) -> None:
        self.poll = loop.poll
        for role in self.roles:
            role.start(loop)

    def tick(self) -> bool:
        did = False
        for role in self.roles:
            did = role.tick() or did
        return did

    def next_wait(self) -> float | None:
        # A role's None is its own poll, not the loop's.
        waits = [wait if (wait := role.next_wait()) is not None else getattr(role, "poll", None) or self.poll
                 for role in self.roles]
        return min(waits)

    def notified(self, notifies: list) -> bool:
        tick = False
        for role in self.roles:
            mine = [note for note in notifies if note.channel in role.channels]
            if mine:
                tick = role.notified(mine) is not False or tick
        return tick

    def finished(self, stop_requests: int) -> bool:
        return all(role.finished(stop_requests) for role in self.roles)

    def reconnected(self) -> None:
        for role in self.roles:
            role.reconnected()

    def stop(self) -> None:
        for role in reversed(self.roles):
            role.stop()


class Backoff:
    """Exponential back-off with "equal jitter": half the delay is fixed, half random, so a fleet
    of processes that lost the database at the same instant does not reconnect in lockstep."""

    def __init__(self, first: float = RECONNECT_FIRST_SECONDS, cap: float | None = None, rng=random.random):
        self.first = first
        self.cap = float(cap if cap is not None else app_settings.RECONNECT_MAX_SECONDS)
        self.failures = 0
        self.rng = rng

    def next(self) -> float:
        # The exponent stops growing once the cap is reached for any sane first delay: an outage
        # of thousands of failures must not overflow a float (2 ** 1024) and end the process.
        delay = min(self.cap, self.first * 2 ** min(self.failures, 60))
        self.failures += 1
        return delay / 2 + self.rng() * delay / 2

    def reset(self) -> None:
        self.failures = 0


def close_all_connections() -> None:
    """Drop every Django connection of this thread; the next query opens a new one."""
    for conn in connections.all(initialized_only=True):
        try:
            conn.close()
        except DATABASE_ERRORS:
            conn.connection = None  # the socket is already gone; forget it


class Loop:
    def __init__(self, role: Role, *, poll: float | None = None, max_seconds: float | None = None,
                 backoff: Backoff | None = None, handle_signals: bool = True):
        self.role = role
        self.poll = poll if poll is not None else app_settings.POLL_SECONDS
        self.max_seconds = max_seconds
        self.backoff = backoff or Backoff()
        self.handle_signals = handle_signals
        self.selector = selectors.DefaultSelector()
        self.listener = None
        self.polling = False  # no LISTEN connection by configuration: the poll alone finds work
        self.stop_requests = 0
        self.outage_since: float | None = None  # time.monotonic() of the first failure of an outage
        self.reminded_at = 0.0
        self._recycled_at = 0.0
        self.outages = 0
        self.started_at = 0.0
        self._wake = None
        self._previous_handlers: dict = {}

    # --- what a role may call --------------------------------------------------------------------

    def watch(self, fileobj, callback: Callable[[object], None]) -> None:
        """Wake the loop when ``fileobj`` is readable and call ``callback(fileobj)``."""
        self.selector.register(fileobj, selectors.EVENT_READ, callback)

    def unwatch(self, fileobj) -> None:
        self.selector.unregister(fileobj)

    def request_stop(self, *_) -> None:
        self.stop_requests += 1

    @property
    def in_outage(self) -> bool:
        return self.outage_since is not None

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        self.started_at = time.monotonic()
        self._install_signals()
        try:
            self._start_role()
            while not self._done():
                self.turn()
        finally:
            self._close_listener()
            self._restore_signals()
            self.role.stop()

    def turn(self) -> None:
        """One tick and one wait; a database error instead waits out the back-off."""
        try:
            if self.in_outage:
                self._reconnect()
            did = self.role.tick()
            self._healthy()
            wait = 0.0 if did or self._done() else self._next_wait()
            self.wait(wait)
            self._recycle_connections()
        except DATABASE_ERRORS as exc:
            db.explain_lost(exc)
            self.wait(self._database_error(exc), listen=False)

    def wait(self, timeout: float, listen: bool = True) -> None:
        """Serve signals, the role's files and (unless ``listen`` is False) notifications for up
        to ``timeout`` seconds, returning at the first event that calls for a tick. Notifications
        the role has nothing to do for (``Role.notified`` returned False) do not: in a fleet every
        worker of a queue receives every notification of it, and a tick for each would cost each
        of them as much CPU as the one that claims."""
        if self.listener is not None and not listen:
            self._close_listener()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            events = self.selector.select(max(0.0, deadline - time.monotonic()))
            tick = not events  # the timeout
            for key, _ in events:
                if key.data is _SIGNAL:
                    try:
                        key.fileobj.recv(512)
                    except BlockingIOError:
                        pass
                    tick = True
                elif key.data is _LISTEN:
                    tick = self.role.notified(drain_notifies(self.listener)) is not False or tick
                else:
                    key.data(key.fileobj)
                    tick = True
            if tick or time.monotonic() >= deadline:
                return

    def _start_role(self) -> None:
        while not self.stop_requests:
            try:
                self.role.start(self)
                self._healthy()
                return
            except DATABASE_ERRORS as exc:
                db.explain_lost(exc)
                self.wait(self._database_error(exc), listen=False)

    def _done(self) -> bool:
        if self.max_seconds is not None and not self.stop_requests and \
                time.monotonic() - self.started_at > self.max_seconds:
            self.stop_requests = 1
        return self.role.finished(self.stop_requests)

    def _next_wait(self) -> float:
        wait = self.role.next_wait()
        return self.poll if wait is None else max(0.0, wait)

    def _recycle_connections(self) -> None:
        # CONN_MAX_AGE applies to loops too: a connection past its age is replaced. Not on every
        # turn: with CONN_HEALTH_CHECKS each call costs the next query a round trip.
        now = time.monotonic()
        if now - self._recycled_at < RECYCLE_SECONDS:
            return
        self._recycled_at = now
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:  # a closed one is not opened just to be looked at
                conn.close_if_unusable_or_obsolete()

    # --- database errors -------------------------------------------------------------------------

    def _database_error(self, exc: BaseException) -> float:
        """Log (once per outage, then a reminder a minute), drop every connection, and return how
        long to back off."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = self.reminded_at = now
            self.outages += 1
            log.warning("%s: database error (%s); retrying with back-off up to %gs, keeping the work in memory",
                        self.role.role, first_line(exc), self.backoff.cap,
                        extra={"action": "database_unavailable", "role": self.role.role})
        elif now - self.reminded_at >= REMIND_SECONDS:
            # A persistent error (tables not migrated yet, a permission) must stay visible.
            self.reminded_at = now
            log.warning("%s: still failing after %.0fs: %s", self.role.role, now - self.outage_since,
                        first_line(exc), extra={"action": "database_unavailable", "role": self.role.role})
        else:
            log.debug("%s: database error: %s", self.role.role, first_line(exc),
                      extra={"action": "database_retry", "role": self.role.role})
        self._close_listener()
        close_all_connections()
        return self.backoff.next()

    def _reconnect(self) -> None:
        """After an outage: connect (the next tick would anyway), LISTEN again, and let the role
        reconcile what it could not know while the database was away."""
        connections["default"].ensure_connection()
        self._ensure_listener()
        self.role.reconnected()

    def _healthy(self) -> None:
        self._ensure_listener()
        if self.outage_since is not None:
            log.info("%s: the database answers again after %.1fs (%d retries)", self.role.role,
                     time.monotonic() - self.outage_since, self.backoff.failures,
                     extra={"action": "database_available", "role": self.role.role,
                            "outage_seconds": round(time.monotonic() - self.outage_since, 3)})
            self.outage_since = None
        self.backoff.reset()

    # --- LISTEN ----------------------------------------------------------------------------------

    def _ensure_listener(self) -> None:
        if self.listener is not None or self.polling or not self.role.channels:
            return
        self.listener = listen_connection(*self.role.channels)
        if self.listener is None:
            self.polling = True
            log.info("%s: not listening for notifications (the database is behind a transaction pooler and "
                     "ORCHESTRATOR_LISTEN_DATABASE_URL is not set, or it is \"poll\"): looking for work every %gs",
                     self.role.role, self.poll, extra={"action": "listen_off", "role": self.role.role})
            return
        self.selector.register(self.listener.fileno(), selectors.EVENT_READ, _LISTEN)

    def _close_listener(self) -> None:
        if self.listener is None:
            return
        listener, self.listener = self.listener, None
        try:
            self.selector.unregister(listener.fileno())
        except (KeyError, ValueError, psycopg.Error):
            # The socket is gone: find the registration by its marker instead.
            for key in list(self.selector.get_map().values()):
                if key.data is _LISTEN:
                    self.selector.unregister(key.fileobj)
        try:
            listener.close()
        except psycopg.Error:
            pass

    # --- signals ---------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        if not self.handle_signals:
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self.request_stop)
        # A signal wakes the loop at once: the handler only counts, the loop does the work.
        wake_read, self._wake = socket.socketpair()
        wake_read.setblocking(False)
        self._wake.setblocking(False)
        signal.set_wakeup_fd(self._wake.fileno(), warn_on_full_buffer=False)
        self.selector.register(wake_read, selectors.EVENT_READ, _SIGNAL)

    def _restore_signals(self) -> None:
        if not self.handle_signals or self._wake is None:
            return
        signal.set_wakeup_fd(-1)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        for key in list(self.selector.get_map().values()):
            if key.data is _SIGNAL:
                self.selector.unregister(key.fileobj)
                key.fileobj.close()
        self._wake.close()
        self._wake = None
