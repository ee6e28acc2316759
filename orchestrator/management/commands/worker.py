from django.core.management.base import CommandError

from orchestrator.management.roles import RoleCommand, require_migrated
from orchestrator.worker import Worker


class Command(RoleCommand):
    help = "Run queued task runs of the given queues in a pool of child processes."

    def add_arguments(self, parser):
        parser.add_argument("--queues", default="default", help="Comma-separated queues (default: default).")
        parser.add_argument("--concurrency", type=int, default=4,
                            help="At most this many child processes, i.e. tasks at once (default 4).")
        parser.add_argument("--min-children", type=int, default=None,
                            help="Child processes kept forked and waiting (default: ORCHESTRATOR_WORKER_MIN_CHILDREN, "
                                 "0: all, a fixed pool); more are forked up to --concurrency when work is "
                                 "queued.")
        parser.add_argument("--grace", type=float, default=30.0,
                            help="Seconds running tasks may take to finish after SIGTERM (default 30).")
        parser.add_argument("--max-tasks-per-child", type=int, default=None,
                            help="Replace a child process after this many tasks (default: "
                                 "ORCHESTRATOR_WORKER_MAX_TASKS_PER_CHILD, 0: never).")
        parser.add_argument("--inprocess", type=int, default=0,
                            help="Places for jobs declared @job(executor='async') or executor='thread', run "
                                 "concurrently in one in-process executor child (default 0: none, every job runs "
                                 "in a forked child). Such a worker claims for these places too: give them to "
                                 "workers of the queues that hold such jobs.")
        parser.add_argument("--name", default=None, help="Name prefix shown in the UI (default: the host name); the pid is appended.")

    def handle(self, *args, queues, concurrency, grace, name, max_tasks_per_child, min_children, inprocess,
               **options):
        require_migrated()
        names = [q.strip() for q in queues.split(",") if q.strip()]
        try:
            worker = Worker(names, concurrency=concurrency, grace=grace, name=name,
                            max_tasks_per_child=max_tasks_per_child, min_children=min_children,
                            inprocess=inprocess)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        worker.serve()
