"""Run the production set of processes on one machine, without Docker.

The same roles as ``docker/compose.yaml``: gunicorn, schedulers (one leads, the others stand
by), dispatchers and workers, each a separate OS process against ``DATABASE_URL``. This
command only starts them, restarts one that dies, and on SIGTERM or Ctrl-C passes SIGTERM on
to each (so each drains its in-flight work), waits for them, and reports how each one ended.
Unlike ``up`` it creates no user and prints no password: it is for servers, where
``migrate``, ``sync_workflows`` and ``createsuperuser`` are deployment steps of their own
(``--migrate`` runs the first two first).

Before it starts anything it checks what would make a role fail (see orchestrator.preflight):
every missing setting is reported in one message, and it exits with code 78 (EX_CONFIG), as
it does when a role exits on a configuration error later. With DEBUG off it collects the static
files when they are outdated. Its processes end when it ends, however it ends (SIGHUP and
SIGKILL included): see orchestrator.supervisor.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from orchestrator import preflight
from orchestrator.management.roles import require_migrated
from orchestrator.supervisor import Child, Supervisor, role_argv, write_line

# gunicorn's exit codes for a worker that failed to boot and an application that failed to load.
GUNICORN_CONFIG_ERRORS = frozenset({3, 4})


def wsgi_target() -> str:
    """The project's WSGI application (settings.WSGI_APPLICATION) as gunicorn names it."""
    module, _, name = settings.WSGI_APPLICATION.rpartition(".")
    return f"{module}:{name}"


def plan(*, bind: str, web_workers: int, schedulers: int, dispatchers: int, workers: list[str],
         concurrency: int, grace: float) -> list[Child]:
    children = []
    if web_workers:
        children.append(Child("web", [
            sys.executable, "-m", "gunicorn", wsgi_target(), "--workers", str(web_workers), "--bind", bind,
            "--graceful-timeout", str(int(grace)), "--access-logfile", "-",
            # No control socket: its default path is per user, shared by every gunicorn on the machine.
            "--no-control-socket",
        ], config_error_codes=Child.config_error_codes | GUNICORN_CONFIG_ERRORS))
    children += [Child(f"scheduler-{i}", role_argv("scheduler")) for i in range(1, schedulers + 1)]
    children += [Child(f"dispatcher-{i}", role_argv("dispatcher")) for i in range(1, dispatchers + 1)]
    for i, queues in enumerate(workers, start=1):
        children.append(Child(f"worker-{i}", role_argv(
            "worker", "--queues", queues, "--concurrency", str(concurrency), "--grace", str(grace),
        )))
    return children


class Command(BaseCommand):
    help = ("Run gunicorn, schedulers, dispatchers and workers as separate processes, like docker/compose.yaml, "
            "without Docker. SIGTERM stops them all cleanly.")
    # Checked in handle(), the deployment checks' errors with the others: one message for all.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("BIND", "127.0.0.1:8000"),
                            help="Address of the web server (default %(default)s).")
        parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes; 0: no web server.")
        parser.add_argument("--schedulers", type=int, default=2, help="Scheduler processes (one leads).")
        parser.add_argument("--dispatchers", type=int, default=1, help="Dispatcher processes.")
        parser.add_argument("--worker", action="append", dest="workers", metavar="QUEUES",
                            help="One worker process serving these comma-separated queues; repeat for more "
                                 "(default: --worker default --worker default --worker batch).")
        parser.add_argument("--concurrency", type=int, default=8, help="Tasks at once per worker process.")
        parser.add_argument("--grace", type=float, default=30.0,
                            help="Seconds each process may take to finish its work after SIGTERM.")
        parser.add_argument("--log-dir", default=None,
                            help="Write each process's output to LOG_DIR/<name>.log instead of this terminal.")
        parser.add_argument("--migrate", action="store_true", help="Run migrate and sync_workflows first.")

    def handle(self, *args, bind, web_workers, schedulers, dispatchers, workers, concurrency, grace, log_dir,
               migrate, **options):
        workers = workers if workers is not None else ["default", "default", "batch"]
        _check_counts(web_workers, schedulers, dispatchers, concurrency, workers)
        children = plan(bind=bind, web_workers=web_workers, schedulers=schedulers, dispatchers=dispatchers,
                        workers=workers, concurrency=concurrency, grace=grace)
        if not children:
            raise CommandError("nothing to run: every role count is 0")

        supervisor = Supervisor(children, self.say, grace=grace)
        supervisor.catch_stop_signals()  # a stop while preparing: nothing is started
        for warning in preflight.require_configured("manage.py deploy_local"):
            self.say(str(warning))
        address = preflight.bind_address(bind) if web_workers else None
        if address:
            preflight.require_free_address(*address, "--bind (or BIND)")
        _prepare_database(migrate)
        if web_workers:
            preflight.collect_static_files(self.say)
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            for child in children:
                child.log_path = Path(log_dir) / f"{child.name}.log"

        clean = supervisor.run()
        if supervisor.gave_up:
            sys.exit(supervisor.exit_code)  # why was said when it happened
        if not clean:
            raise CommandError("some processes did not stop cleanly (see above)")

    def say(self, message: str) -> None:
        write_line(self.stderr, f"[deploy_local] {message}")


def _check_counts(web_workers: int, schedulers: int, dispatchers: int, concurrency: int, workers: list[str]) -> None:
    for name, value in (("--web-workers", web_workers), ("--schedulers", schedulers),
                        ("--dispatchers", dispatchers)):
        if value < 0:
            raise CommandError(f"{name} must be 0 or more, got {value}")
    if concurrency < 1:
        raise CommandError(f"--concurrency must be at least 1, got {concurrency}")
    for queues in workers:
        if not [q for q in queues.split(",") if q.strip()]:
            raise CommandError(f"--worker {queues!r}: name at least one queue, e.g. --worker default,batch")


def _prepare_database(migrate: bool) -> None:
    """Migrate and sync first (--migrate), or refuse to start on a database not migrated."""
    if migrate:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("sync_workflows")
        return
    try:
        require_migrated()
    except CommandError as exc:
        raise CommandError(f"{exc} Or start deploy_local with --migrate.", returncode=exc.returncode) from None
