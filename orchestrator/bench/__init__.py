"""``manage.py bench``: the product's speed figures, in a database of their own.

- ``sections``: which sections run, in order (``run``);
- ``core``: the database, the worker and dispatcher processes, and the execution-path sections
  (PostgreSQL's own ceiling, jobs end to end, start delay, DAG wall time);
- ``load``: start delay under a steady arrival rate, cost with a backlog and with a history;
- ``jobs``: the jobs the benchmark's workers run;
- ``scheduler``, ``pages``, ``cron``: the scheduler's insert and failover, page speed with a big
  history, cron over long ranges.
- ``footprint``: the idle memory of the whole ``./dev run`` stack;
- ``mapping``: maps over 1,000, 10,000 and 100,000 no-op items, from the parent's success to the
  last instance's end, beside the plain-job rate of the same processes, with worker memory.
"""

from orchestrator.bench.core import BENCH_DB, Output, child_env, prepare_database
from orchestrator.bench.sections import SECTIONS, run

__all__ = ["BENCH_DB", "SECTIONS", "Output", "child_env", "prepare_database", "run"]
