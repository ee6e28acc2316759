from django.core.management.base import BaseCommand, CommandError

from orchestrator import bench


class Command(BaseCommand):
    help = ("Measure jobs/s, start delay, DAG wall time and PostgreSQL's own ceiling with real worker "
            "processes, in a dedicated database 'orchestrator_bench' (dropped and recreated).")

    def add_arguments(self, parser):
        parser.add_argument("--only", default=",".join(bench.SECTIONS),
                            help=f"Comma-separated sections (default all): {','.join(bench.SECTIONS)}")
        parser.add_argument("--jobs", type=int, default=20000, help="No-op jobs in the throughput section.")
        parser.add_argument("--concurrency", type=int, default=16,
                            help="Children per worker process in the jobs section (default 16).")

    def handle(self, *args, only, jobs, concurrency, **options):
        sections = [s.strip() for s in only.split(",") if s.strip()]
        try:
            bench.run(lambda line: (self.stdout.write(line), self.stdout.flush()), only=sections, jobs=jobs,
                      concurrency=concurrency)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
