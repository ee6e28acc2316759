"""manage.py backfill WORKFLOW --start … --end … [--dry-run] [--reprocess none|failed|all]"""

import json
import sys
import time
from datetime import UTC, date, datetime
from datetime import time as dtime

from django.core.management.base import BaseCommand, CommandError

from orchestrator import audit, backfill

BAR_WIDTH = 30


def parse_when(text: str, name: str, *, end_of_day: bool = False) -> datetime:
    """ISO date or date-time. Without an offset it is UTC; a bare date as --end means the end of
    that day, so "--start 2026-01-01 --end 2026-01-31" covers all of January."""
    try:
        if len(text.strip()) == 10:
            day = date.fromisoformat(text.strip())
            return datetime.combine(day, dtime.max if end_of_day else dtime.min, tzinfo=UTC)
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"--{name} {text!r} is not a date (2026-01-31) or date and time "
                           f"(2026-01-31T02:30, 2026-01-31T02:30+01:00)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}"


class Command(BaseCommand):
    help = ("Create one run per fire time of a workflow's schedule between --start and --end (both included), "
            "in the backfill lane (after live work). Dates without an offset are UTC.")

    def add_arguments(self, parser):
        parser.add_argument("workflow")
        parser.add_argument("--start", required=True, help="first fire time to include: 2026-01-01 or 2026-01-01T02:30[+01:00]")
        parser.add_argument("--end", required=True, help="last fire time to include; a bare date means the end of that day")
        parser.add_argument("--dry-run", action="store_true", help="list the fire times and their count; write nothing")
        parser.add_argument("--reprocess", choices=backfill.REPROCESS_CHOICES, default="none",
                            help="none: skip fire times that have a run (default); failed: re-run those that did not "
                                 "succeed; all: re-run every finished one")
        parser.add_argument("--schedule", help="the schedule's name, when the workflow has several")
        parser.add_argument("--cron", help="fire times from this expression instead (for a workflow without schedule)")
        parser.add_argument("--timezone", default="UTC", help="time zone of --cron (default UTC)")
        parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                            help="override a param of every run (repeatable; VALUE may be JSON)")
        parser.add_argument("--wait", action="store_true", help="after creating the runs, follow them until all end")

    def handle(self, *args, **options):
        start = parse_when(options["start"], "start")
        end = parse_when(options["end"], "end", end_of_day=True)
        params = self.parse_params(options["param"])
        common = {"schedule": options["schedule"], "reprocess": options["reprocess"], "expr": options["cron"],
                  "timezone": options["timezone"]}
        try:
            if options["dry_run"]:
                return self.dry_run(backfill.plan(options["workflow"], start, end, **common))
            created = backfill.start(options["workflow"], start, end, params=params, on_progress=self.show, **common)
        except backfill.BackfillError as exc:
            raise CommandError(f"{exc.field}: {exc}") from None
        audit.record("backfill", target=created, workflow=created.workflow.name, start=start.isoformat(),
                     end=end.isoformat(), runs=created.total)
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS(
            f"backfill #{created.pk} of {created.workflow.name}: {created.total} runs in the backfill lane"))
        if options["wait"]:
            self.follow(created)

    def parse_params(self, items):
        params = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--param {item!r}: expected KEY=VALUE")
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
        return params

    def dry_run(self, plan):
        where = f"schedule {plan.schedule.name}" if plan.schedule else "--cron"
        self.stdout.write(f"{plan.workflow.name} ({where}: '{plan.cron}' {plan.timezone}), "
                          f"{plan.start.isoformat()} to {plan.end.isoformat()}")
        existing = set(plan.existing)
        for at in plan.fire_times:
            note = "  (has a run)" if at in existing else ""
            self.stdout.write(f"  {at.isoformat()}{note}")
        self.stdout.write(f"{plan.count} fire times: {len(plan.to_create)} new runs, "
                          f"{len(plan.to_reprocess)} to re-run, {len(plan.existing) - len(plan.to_reprocess)} skipped "
                          f"(dry run: nothing written)")

    def show(self, done, total):
        out = self.stdout
        if out.isatty():
            out.write(f"\rcreating runs {bar(done, total)}", ending="")
            out.flush()
        elif done == total or done % 2000 < backfill.CHUNK:
            out.write(f"creating runs {bar(done, total)}")

    def follow(self, created):
        # Only ends when every run has finished; Ctrl-C stops following, not the backfill.
        try:
            while True:
                done, total = backfill.progress(created)
                sys.stdout.write(f"\rfinished {bar(done, total)}")
                sys.stdout.flush()
                if done >= total:
                    break
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        self.stdout.write("")
