"""Delete finished history older than a given age (see orchestrator/retention.py)."""

from django.core.management.base import BaseCommand, CommandError

from orchestrator import audit, retention
from orchestrator.conf import app_settings


class Command(BaseCommand):
    help = ("Delete finished runs older than --older-than with their task runs, attempts and log files, "
            "in short batches. Active runs and runs with a task in the dead-letter queue are kept.")

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", default=f"{app_settings.RETENTION_DAYS}d",
            help="Age of the runs to delete: 30d, 12h or 90m (default: ORCHESTRATOR_RETENTION_DAYS, %(default)s).",
        )
        parser.add_argument("--batch-size", type=int, default=1000, help="Runs per transaction (default %(default)s).")

    def handle(self, *args, older_than, batch_size, **options):
        try:
            age = retention.parse_age(older_than)
        except retention.RetentionError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        if batch_size < 1:
            raise CommandError(f"--batch-size: {batch_size} must be at least 1")
        report = retention.prune(age, batch_size=batch_size)
        audit.record("prune", target_type="run", older_than=older_than, runs=report.runs)
        self.stdout.write(str(report))
        for error in report.log_errors[:20]:
            self.stderr.write(f"  could not delete log {error}")
