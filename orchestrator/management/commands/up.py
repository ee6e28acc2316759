"""The development run command: one process that prepares everything and supervises the rest.

It migrates, syncs the workflows, creates an admin on first start, then starts the web server
and every long-running role as child processes. Ctrl-C stops the children, then the embedded
PostgreSQL.
"""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand

from orchestrator.sync import sync_workflows

ROLES = [
    ("scheduler", []),
    ("dispatcher", []),
    ("worker", ["--queues", "default,batch", "--concurrency", "4"]),
]


class Command(BaseCommand):
    help = "Run the whole product for development: database, web UI, scheduler, dispatcher and a worker."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))

    def handle(self, *args, port, host, **options):
        started = time.monotonic()
        call_command("migrate", interactive=False, verbosity=0)
        report = sync_workflows()
        synced = len(report.created) + len(report.new_versions) + len(report.unchanged)
        self.stdout.write(f"workflows: {synced} synced, {len(report.broken)} broken")
        for name, error in report.broken.items():
            self.stderr.write(self.style.WARNING(f"  broken {name}: {error.splitlines()[0]}"))
        login = self.ensure_admin()

        children = self.start_children(host, port)
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\nReady in {time.monotonic() - started:.1f}s: {url}"))
        self.stdout.write(f"Admin: {url}admin/   {login}")
        self.stdout.write("Press Ctrl-C to stop everything (the embedded database included).\n")
        self.supervise(children, host, port)

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

    def command_line(self, name, extra):
        return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), name, *extra]

    def start_children(self, host, port):
        available = get_commands()
        specs = [("web", self.command_line("runserver", [f"{host}:{port}", "--noreload", "--skip-checks"]))]
        specs += [(name, self.command_line(name, extra)) for name, extra in ROLES if name in available]
        return {name: [cmd, subprocess.Popen(cmd, start_new_session=True), 0] for name, cmd in specs}

    def supervise(self, children, host, port):
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, entry in children.items():
                    cmd, proc, restarts = entry
                    if proc.poll() is not None and not stopping:
                        if restarts >= 5:
                            self.stderr.write(self.style.ERROR(f"{name} keeps exiting (code {proc.returncode}); giving up"))
                            stopping = True
                            break
                        self.stderr.write(self.style.WARNING(f"{name} exited with {proc.returncode}; restarting"))
                        entry[1] = subprocess.Popen(cmd, start_new_session=True)
                        entry[2] = restarts + 1
                time.sleep(0.5)
        finally:
            self.shutdown(children)

    def shutdown(self, children):
        self.stdout.write("\nStopping...")
        for _, proc, _ in children.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name, (_, proc, _) in children.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in time; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if settings.EMBEDDED_DATABASE:
            from django.db import connections

            from orchestrator import embedded

            connections.close_all()
            embedded.stop(Path(settings.DATA_DIR) / "pgdata")
            self.stdout.write("embedded PostgreSQL stopped")
        self.stdout.write("stopped")
