"""manage.py scheduler: turn cron schedules into runs (one leader at a time; run as many as you like)."""

import logging
import signal
import time

from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection

from orchestrator.scheduler import SCHEDULES_CHANNEL, Scheduler

log = logging.getLogger("orchestrator.scheduler")

MAX_SLEEP = 1.0  # standbys retry the lease, and leaders look for work, at least this often


class Listener:
    """LISTEN on the loop's own connection, so a schedule created, changed or resumed wakes the
    scheduler at once; re-subscribes whenever Django replaced the connection."""

    def __init__(self):
        self._subscribed_to = None

    def wait(self, timeout: float) -> None:
        if timeout <= 0:
            return
        connection.ensure_connection()
        raw = connection.connection
        if raw is not self._subscribed_to:
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {SCHEDULES_CHANNEL}")
            self._subscribed_to = raw
        for _ in raw.notifies(timeout=timeout, stop_after=1):
            pass


class Command(BaseCommand):
    help = ("Run the scheduler. Any number may run: one holds the lease and creates runs, the others stand by "
            "and take over within the lease time (ORCHESTRATOR_LEASE_SECONDS) if it dies.")

    def add_arguments(self, parser):
        parser.add_argument("--no-lease", action="store_true",
                            help="FOR TESTS ONLY: act as leader without the lease, to show that two schedulers "
                                 "that both believe they lead still create each run once")
        parser.add_argument("--batch-size", type=int, default=1000,
                            help="schedules locked and fired per transaction (default 1000)")

    def handle(self, *args, no_lease=False, batch_size=1000, **options):
        scheduler = Scheduler(use_lease=not no_lease, batch_size=max(1, batch_size))
        stopping = []

        def stop(signum, frame):
            stopping.append(signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        listener = Listener()
        was_leader = None
        # Through logging, not stdout: with LOG_FORMAT=json every line a process writes is JSON.
        log.info("scheduler %s started (lease %s%s)", scheduler.holder, scheduler.lease.name,
                 ", disabled for tests" if no_lease else "", extra={"action": "scheduler_start"})
        try:
            while not stopping:
                close_old_connections()
                try:
                    did = scheduler.tick()
                    leader = scheduler.lease.is_leader
                    wait = MAX_SLEEP
                    if leader:
                        due = scheduler.seconds_until_due()
                        wait = MAX_SLEEP if due is None else min(MAX_SLEEP, due)
                        if not did:
                            # Due rows it could not take (locked by another scheduler): no busy loop.
                            wait = max(wait, 0.05)
                    if leader != was_leader:
                        log.info("scheduler %s: %s", scheduler.holder, "leader" if leader else "standby",
                                 extra={"action": "scheduler_role"})
                        was_leader = leader
                    if not stopping:
                        listener.wait(wait)
                except Exception:  # the loop outlives a database restart or a bad row
                    log.exception("scheduler tick failed", extra={"action": "tick_failed"})
                    connection.close()
                    listener = Listener()
                    time.sleep(MAX_SLEEP)
        finally:
            try:
                scheduler.lease.release()
            except Exception:  # the lease then simply expires
                log.exception("could not release the lease")
            log.info("scheduler %s stopped: created %s runs", scheduler.holder, scheduler.created,
                     extra={"action": "scheduler_stop"})
