"""manage.py schedules: every schedule, its state and its next fire times in local time and UTC."""

from django.core.management.base import BaseCommand, CommandError

from orchestrator import clock, cron
from orchestrator.models import Schedule


def state_of(schedule: Schedule, now) -> str:
    workflow = schedule.workflow
    if schedule.paused:
        return "paused"
    if workflow.paused:
        return "workflow paused"
    if not workflow.present:
        return "workflow removed"
    if workflow.current_version_id is None:
        return "workflow not valid"
    if schedule.next_fire_at is None:
        return "never fires"
    if schedule.next_fire_at <= now:
        return f"due since {schedule.next_fire_at:%Y-%m-%d %H:%M:%S} UTC"
    return "active"


class Command(BaseCommand):
    help = "List the schedules with their state and next fire times (local time and UTC)."

    def add_arguments(self, parser):
        parser.add_argument("--workflow", help="only this workflow's schedules")
        parser.add_argument("--next", type=int, default=1, metavar="N", help="show the next N fire times (default 1)")

    def handle(self, *args, workflow=None, next=1, **options):
        if not 1 <= next <= 100:
            raise CommandError("--next must be between 1 and 100")
        now = clock.now()
        schedules = Schedule.objects.select_related("workflow").order_by("workflow__name", "name")
        if workflow:
            schedules = schedules.filter(workflow__name=workflow)
            if not schedules.exists():
                raise CommandError(f"workflow {workflow!r} has no schedules (or does not exist)")
        if not schedules:
            self.stdout.write("No schedules.")
            return
        for schedule in schedules:
            try:
                meaning = cron.describe(schedule.cron)
                upcoming = cron.preview(schedule.cron, schedule.timezone, now, next)
            except cron.CronError as exc:
                meaning, upcoming = f"invalid: {exc}", []
            self.stdout.write(
                f"{schedule.workflow.name}/{schedule.name}  [{schedule.source}]  {state_of(schedule, now)}\n"
                f"    '{schedule.cron}' {schedule.timezone}: {meaning}; catchup {schedule.catchup}, "
                f"overlap {schedule.overlap}"
                + (f", jitter {schedule.jitter}s" if schedule.jitter else "")
                + (f", start deadline {schedule.start_deadline}s" if schedule.start_deadline else "")
            )
            for utc, local in upcoming:
                self.stdout.write(f"    next  {local:%a %Y-%m-%d %H:%M:%S %Z}  =  {utc:%Y-%m-%d %H:%M:%S} UTC")
