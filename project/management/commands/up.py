"""The development run command: one process that prepares everything and supervises the rest.

It checks the configuration (every missing setting in one message), migrates, syncs the
workflows, creates an admin on first start, collects the static files when DEBUG is off and they
are outdated, then starts the web server, a scheduler with the dispatcher's work, and a worker as
child processes. Ctrl-C, SIGTERM or SIGHUP (the terminal closed) stops the children, then the
embedded PostgreSQL. Killed outright (SIGKILL), it takes its children with it (each ends when
its parent does, see orchestrator.supervisor); the embedded PostgreSQL then keeps running, and
the next start uses it.

The roles are forks of this process (``ForkedRole``), not new interpreters: they share the memory
of Django's start-up, which keeps the idle stack small. So this process does its own work
(migrate, sync, the admin) in a short-lived fork too: it stays as the start-up left it, and never
imports a workflow module (a worker must not inherit one, or it could not load a changed one).
"""

import gc
import importlib
import os
import pkgutil
import secrets
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from orchestrator import preflight
from orchestrator.supervisor import Child, Supervisor, die_with_parent, role_argv, write_line

# The development worker's in-process places (see README, "Executors").
DEV_INPROCESS_PLACES = 50


class Command(BaseCommand):
    help = "Run the whole product for development: database, web UI, scheduler, dispatcher and a worker."
    # Checked in handle(), the deployment checks' errors with the others: one message for all.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))

    def handle(self, *args, port, host, **options):
        started = process_started()
        supervisor = Supervisor([], self.say, grace=10)
        supervisor.catch_stop_signals()  # a stop while preparing: nothing is started
        advice = "For development instead, leave DEBUG unset: ./dev run turns it on, whatever the database."
        for warning in preflight.require_configured("manage.py up", advice):
            self.say(str(warning))
        preflight.require_free_address(host, port, "--port (or PORT)")
        # No collection in this process from here: it would leave holes in pages the roles share,
        # which their allocations would then fill (and copy). Each fork collects again.
        gc.disable()
        try:
            login = self.in_fork(self.prepare)
        except BaseException:
            self.stop_database()
            raise
        preload()

        supervisor.children = [
            Child("web", role_argv("runserver", f"{host}:{port}", "--noreload", "--skip-checks"), fork=True),
            # The dispatcher's work (admitting work under a concurrency limit) in the scheduler's process:
            # one process and two database connections fewer for the idle footprint.
            Child("scheduler", role_argv("scheduler", "--dispatch"), fork=True),
            # --inprocess: jobs declared @job(executor="async"/"thread") run in development as they
            # do on a production worker given places (one host process more, forked at start).
            Child("worker", role_argv("worker", "--queues", "default,batch", "--concurrency", "4", "--min-children", "1",
                                      "--inprocess", str(DEV_INPROCESS_PLACES), "--grace", "10"),
                  fork=True),
        ]
        url = f"http://{host}:{port}/"

        def announce():
            write_line(self.stdout, self.style.SUCCESS(f"\nReady in {time.time() - started:.1f}s: {url}"))
            write_line(self.stdout, f"Admin: {url}admin/   {login}")
            database = " (the embedded database included)" if settings.EMBEDDED_DATABASE else ""
            write_line(self.stdout, f"Press Ctrl-C to stop everything{database}.\n")

        try:
            clean = supervisor.run(on_started=announce, ready=lambda: listening(host, port))
        finally:
            self.stop_database()
        if supervisor.gave_up:
            sys.exit(supervisor.exit_code)  # why was said when it happened
        if not clean:
            raise CommandError("some processes did not stop cleanly (see above)")

    def prepare(self) -> str:
        """Migrate, sync the workflows, make sure an admin exists and, with DEBUG off, that the
        static files are collected; returns the login line."""
        from orchestrator.sync import sync_workflows

        call_command("migrate", interactive=False, verbosity=0)
        preflight.collect_static_files(self.say)
        report = sync_workflows(notice=lambda message: self.say(f"workflows: {message}"))
        synced = len(report.created) + len(report.new_versions) + len(report.unchanged)
        self.stdout.write(f"workflows: {synced} synced, {len(report.broken)} broken")
        for name, error in report.broken.items():
            self.stderr.write(self.style.WARNING(f"  broken {name}: {error.splitlines()[0]}"))
        for module, error in report.import_errors.items():
            self.stderr.write(self.style.WARNING(f"  module {module} failed to import: {error}"))
        return self.ensure_admin()

    def in_fork(self, work) -> str:
        """``work()`` in a fork of this process, which then exits; returns what it returned (text)."""
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        read, write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 1
            try:
                # Ends with the launcher, as the roles do; a stop of the launcher is its own.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                die_with_parent(parent)
                os.write(write, work().encode())
                code = 0
            except KeyboardInterrupt:
                code = 130
            except BaseException:  # noqa: BLE001 - reported, and the parent says it failed
                traceback.print_exc()
            finally:
                try:
                    connections.close_all()
                    self.stdout.flush()
                    self.stderr.flush()
                finally:
                    os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise CommandError(f"preparing the database failed (exit code {code}, see above)")
        return answer

    def say(self, message: str) -> None:
        write_line(self.stderr, f"[up] {message}")

    def ensure_admin(self) -> str:
        User = get_user_model()
        password_file = Path(settings.DATA_DIR) / "admin-password.txt"
        if User.objects.filter(is_superuser=True).exists():
            if password_file.exists():
                return f"login: admin (the first start's password is in {password_file})"
            return "login: your existing admin user"
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "admin@localhost", password)
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
        return f"login: admin / {password}   (created now; also saved in {password_file})"

    def stop_database(self) -> None:
        if not settings.EMBEDDED_DATABASE:
            return
        from django.db import connections

        from orchestrator import embedded
        from project import database

        connections.close_all()
        if embedded.stop(database.pgdata()):
            write_line(self.stdout, "embedded PostgreSQL stopped")


def preload() -> None:
    """Import what the roles import before forking them, so each module is in memory once, shared
    by every role, rather than once in each (workflow modules excepted: see the module's doc)."""
    from django.core.management import get_commands, load_command_class
    from django.db.migrations.loader import MigrationLoader
    from django.urls import get_resolver

    import orchestrator

    for module in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if not module.name.startswith(("orchestrator.bench", "orchestrator.migrations")):
            importlib.import_module(module.name)  # the app's modules import nothing of the project's
    commands = get_commands()
    for name in ("runserver", "scheduler", "dispatcher", "worker"):
        load_command_class(commands[name], name)
    get_resolver().url_patterns  # noqa: B018 - the web server's views, the API and its schema
    MigrationLoader(None, ignore_no_migrations=True)  # runserver reads every migration at start


def listening(host: str, port: int) -> bool:
    """Whether the web server accepts connections yet (a wildcard address is reached locally)."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host.strip("[]"), host.strip("[]"))
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


def process_started() -> float:
    """When this process started (``./dev run`` execs it), as time.time(): the embedded database
    started before handle(), and the check of the virtual environment before that, are part of the
    wait. Read from the kernel's start time of the process, in clock ticks since boot, against the
    clock since boot (to a hundredth of a second; psutil's create_time adds the boot time, which the
    kernel gives to the whole second only, so it can be a second off). Where there is no /proc:
    when this module was imported."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED
    return time.time() - age


_IMPORTED = time.time()
