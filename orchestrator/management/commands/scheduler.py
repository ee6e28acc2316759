"""manage.py scheduler: turn cron schedules into runs (one leader at a time; run as many as you like)."""

from orchestrator.dispatcher import Dispatcher
from orchestrator.management.roles import RoleCommand, require_migrated
from orchestrator.scheduler import Scheduler, SchedulerRole


class Command(RoleCommand):
    help = ("Run the scheduler. Any number may run: one holds the lease and creates runs, the others stand by "
            "and take over within the lease time (ORCHESTRATOR_LEASE_SECONDS) if it dies.")

    def add_arguments(self, parser):
        parser.add_argument("--no-lease", action="store_true",
                            help="FOR TESTS ONLY: act as leader without the lease, to show that two schedulers "
                                 "that both believe they lead still create each run once")
        parser.add_argument("--batch-size", type=int, default=1000,
                            help="schedules locked and fired per transaction (default 1000)")
        parser.add_argument("--dispatch", action="store_true",
                            help="also do a dispatcher's work in this process (one process fewer for a small "
                                 "deployment; any number of separate dispatchers may run beside it)")

    def handle(self, *args, no_lease=False, batch_size=1000, dispatch=False, **options):
        require_migrated()
        role = SchedulerRole(Scheduler(use_lease=not no_lease, batch_size=max(1, batch_size)))
        if dispatch:
            role.serve(also=Dispatcher())
        else:
            role.serve()
