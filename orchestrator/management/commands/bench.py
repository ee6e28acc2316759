from django.core.management.base import BaseCommand, CommandError

from orchestrator import bench


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"expected comma-separated whole numbers, got {text!r}") from None


class Command(BaseCommand):
    help = ("Measure jobs/s, start delay (also under steady load, per stage), cost with a backlog and with a "
            "finished history, DAG wall time, a fleet's transactions per job and PostgreSQL's own ceiling with "
            "real worker processes, in a dedicated database 'orchestrator_bench' (dropped and recreated).")

    def add_arguments(self, parser):
        parser.add_argument("--only", default=",".join(bench.SECTIONS),
                            help=f"Comma-separated sections (default all): {','.join(bench.SECTIONS)}")
        parser.add_argument("--jobs", type=int, default=20000, help="No-op jobs in the throughput section.")
        parser.add_argument("--concurrency", type=int, default=16,
                            help="Children per worker process in the jobs section (default 16).")
        parser.add_argument("--rates", default="500,2000", help="Arrival rates (jobs/s) of the steady section.")
        parser.add_argument("--seconds", type=float, default=5.0,
                            help="How long each steady rate runs (the backlog and history windows: at least 8 s).")
        parser.add_argument("--backlog", default="0,100000,1000000",
                            help="Due task runs waiting, one window each (backlog section).")
        parser.add_argument("--delayed", type=int, default=1_000_000,
                            help="Delayed task runs (due tomorrow) in the backlog section; 0 leaves it out.")
        parser.add_argument("--fleet", default="1,4,16,64",
                            help="Worker processes (concurrency 1) in the fleet section, one measure each.")
        parser.add_argument("--fleet-rate", type=float, default=50.0,
                            help="Jobs per second arriving in the fleet section (default 50).")
        parser.add_argument("--rounds", type=int, default=3,
                            help="Interleaved rounds of the peers section (this product, then PgQueuer, each).")
        parser.add_argument("--places", type=int, default=None,
                            help="In-process places per worker of the async executor in the peers and statements "
                                 "sections (default 500, as the io section).")
        parser.add_argument("--history", type=int, default=1_000_000,
                            help="Finished runs, task runs and attempts filled in the history section.")
        parser.add_argument("--map-items", default="1000,10000,100000",
                            help="Items of each map in the map section, one map each.")

    def handle(self, *args, only, jobs, concurrency, rates, seconds, backlog, delayed, history, fleet, fleet_rate,
               rounds, map_items, places, **options):
        sections = [s.strip() for s in only.split(",") if s.strip()]
        if not 0 < fleet_rate <= 10_000:
            raise CommandError("--fleet-rate must be more than 0 and at most 10000 jobs a second")
        if places is not None and not 1 <= places <= 10_000:
            raise CommandError("--places must be from 1 to 10000")
        if not 1 <= rounds <= 20:
            raise CommandError("--rounds must be from 1 to 20")
        if seconds <= 0 or seconds > 600:
            raise CommandError("--seconds must be more than 0 and at most 600")
        try:
            bench.run(lambda line: (self.stdout.write(line), self.stdout.flush()), only=sections, jobs=jobs,
                      concurrency=concurrency, rates=_ints(rates), seconds=seconds, backlog=_ints(backlog),
                      delayed=delayed, history=history, fleet_sizes=_ints(fleet), fleet_rate=fleet_rate,
                      rounds=rounds, map_items=_ints(map_items), places=places)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
