from orchestrator.management.roles import RoleCommand, require_migrated
from orchestrator.reaper import Reaper, reap_once


class Command(RoleCommand):
    help = "End the attempts of silent workers and of tasks past their timeout (also run by the scheduler leader)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Reap once and exit.")
        parser.add_argument("--interval", type=float, default=None,
                            help="Seconds between passes (default: the heartbeat interval).")

    def handle(self, *args, once, interval, **options):
        require_migrated()
        if once:
            reaped = reap_once()
            if reaped:
                self.stdout.write(f"reaped {reaped} attempt(s)")
            return
        Reaper(interval=interval, report=lambda n: self.stdout.write(f"reaped {n} attempt(s)")).serve()
