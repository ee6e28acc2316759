"""Fresh planner statistics for the tables that every job writes, once they have doubled.

A worker's and a dispatcher's prepared statements keep one plan while their connection lives
(``loop.SHORT_TRANSACTION``), until the next ANALYZE of the tables it reads. A plan made while
those tables were small (a new install, after a TRUNCATE, a restore or a large purge) reads
whole tables: joined by hash, or as the outer side of a loop, which costs nothing then and grows
with every row added. Autovacuum analyzes a table after a tenth of it changed, but it looks once a
minute: a burst of jobs into small tables ran for that long on such plans (a claim's context
statement took 11 s once its tables held 3,000 rows; a batch of 20 endings read every task run,
attempt and run).

So each role looks, at most once a second, whether one of these tables has doubled since its
latest statistics (its size on disk against the pages its statistics counted), and analyzes the
ones that have. The ANALYZE makes every session's plans of them anew, for their size then. One
role does it at a time (an advisory lock, tried); the others find the statistics fresh at their
next look. Doubling bounds the work: from 16 pages to a million rows a table is analyzed about a
dozen times, and every analyze by autovacuum on the way (after each tenth changed) moves the next
doubling further off."""

from __future__ import annotations

import logging

from django.db import transaction

from orchestrator import db

log = logging.getLogger(__name__)

# The tables of a job (its run, its task run, its attempts), which grow with every job.
TABLES = ("orchestrator_run", "orchestrator_taskrun", "orchestrator_attempt")

# How often a role looks, and from how many pages on a table counts (below that, whole-table
# reads cost less than an index lookup would save).
CHECK_SECONDS = 1.0
MIN_PAGES = 16

# The tables twice the size their statistics counted (never analyzed: counted as empty). Prepared,
# as every statement of a worker's batch and a dispatcher's tick is (orchestrator.db).
GROWN = db.prepared(f"""
SELECT c.relname, pg_relation_size(c.oid) / current_setting('block_size')::int FROM pg_class c
WHERE c.oid = ANY (ARRAY[{", ".join(f"'{table}'::regclass" for table in TABLES)}])
  AND pg_relation_size(c.oid) / current_setting('block_size')::int >= GREATEST(2 * c.relpages, {MIN_PAGES})
ORDER BY c.relname
""")
# The advisory lock that lets one role analyze at a time (named as the project's other ones).
TRY_LOCK = db.prepared("SELECT pg_try_advisory_xact_lock(hashtextextended('orchestrator.analyze', 0))")
ANALYZE = {table: db.prepared(f"ANALYZE {table}") for table in TABLES}


class Freshness:
    """One role's look at the tables' growth (``check``), at most every CHECK_SECONDS."""

    def __init__(self):
        self.checked = float("-inf")
        # Each table's size (pages) when this role last analyzed it: tried again only once doubled
        # from there, should its statistics not have moved (a role that does not own the tables
        # gets a warning from ANALYZE, and nothing analyzed).
        self.tried: dict[str, int] = {}

    def check(self, now: float) -> list[str]:
        """Analyze the tables that doubled since their statistics (``now``: time.monotonic());
        returns the names of those whose statistics it renewed (empty when it was not time to
        look, none had doubled, another role was at it, or PostgreSQL refused)."""
        if now - self.checked < CHECK_SECONDS:
            return []
        self.checked = now
        with transaction.atomic(), db.cursor() as cursor:
            db.execute(cursor, GROWN)
            grown = [name for name, pages in cursor.fetchall() if pages >= 2 * self.tried.get(name, 0)]
            if not grown:
                return []
            db.execute(cursor, TRY_LOCK)
            if not cursor.fetchone()[0]:
                return []  # another role analyzes them now
            for table in grown:
                db.execute(cursor, ANALYZE[table])
            db.execute(cursor, GROWN)
            still = {name: pages for name, pages in cursor.fetchall() if name in grown}
        self.tried.update(still)
        analyzed = [name for name in grown if name not in still]
        if analyzed:
            log.info("analyzed %s: doubled since their statistics", ", ".join(analyzed),
                     extra={"action": "tables_analyzed"})
        return analyzed
