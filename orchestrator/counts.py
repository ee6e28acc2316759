"""A run's task runs counted by state as they change, so a run's counts (its page, its API answer,
a workflow's grid) are read in a handful of rows whatever the run's size.

**How.** Statement-level triggers on ``orchestrator_taskrun`` (migration ``0029_scale_run_counts``)
add one row per (run, counted group, state) that a statement changed to ``TaskRunCount``: +n for
the state the rows went into, -n for the state they left. A run's tasks are the group '' and
each mapped task's instances the group of its name. A run's count of a group in a state is the
sum of its rows (``RUN_COUNTS``). Every writer of task runs is counted, whichever module it is
in (worker claims, the resolver, the dispatcher, control, the reaper, tests' own inserts), and a
statement that changes no state (a heartbeat, a due time) adds nothing.

**Why rows added rather than counters updated.** A worker records its outcomes (its runs
locked) and claims work of other runs in one transaction. Counters updated in place would be
row locks taken across runs in any order: two workers each ending one run's tasks and claiming
the other's would deadlock. Added rows lock nothing; they are folded (``FOLD``: the run's rows
deleted and their sums written back, in one statement) by the resolver's statements that run
once per completion batch of a run (``resolver.FINISH_RUNS``, ``mapping.SETTLE``), when a run has
``FOLD_AT`` rows or more: a bounded probe of at most ``FOLD_AT`` index entries. Folding is safe
without a lock: a row deleted by a concurrent fold is skipped by the other one (its DELETE sees
it gone and does not return it), and rows of uncommitted transactions are not seen, so no row is
summed twice or lost.

**What it costs.** A statement that changes task runs' states adds at most two rows per (run,
group, state) it touched: a claim of ten instances of one map, two. A run's rows stay under
``FOLD_AT`` plus one batch's. Reading a run's counts reads that many index entries: 1 to 40, not
one per task run (``tests/test_run_counts.py`` counts them, 100,000 task runs against 1,000).
Measured on the job path (``manage.py bench map``), see the README's mapping section.

**One-task jobs are not counted.** The task run of a job (``spec.call`` "job": ``jobs.enqueue``,
``enqueue_many``, callbacks) is its run's only task, so its run's counts are that task run's state,
read from the task run itself (``JOB_RUN_COUNTS``, for runs of trigger "job" only: one index entry).
Counting it cost five rows per job (created, claimed, ended), which no fold ever visited (the
resolver ends a job's run in the statement that ends its task run), and at full speed those
inserts were a third of the database's time on the async executor's path (``manage.py bench
statements``).

Deleting a run (retention) deletes its rows (a trigger on ``orchestrator_run``); deleting task
runs of a run that is kept (a map's instances beyond a shorter list) subtracts them.
"""

from __future__ import annotations

from django.db import connection, models

from orchestrator.states import Trigger

# The table a run's counts are read from (see the module's docstring).
FOLD_AT = 32


class TaskRunCount(models.Model):
    """A change of a run's count of task runs of one group in one state; a run's count is the sum."""

    # No foreign key: its check would lock the run row (FOR KEY SHARE) at every claim; a run's
    # rows go with it (the trigger on orchestrator_run).
    run_id = models.BigIntegerField()
    # '': the run's tasks (map_index -1: ordinary tasks and mapped tasks' own rows); a mapped
    # task's name: its instances.
    instances_of = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=16)
    n = models.BigIntegerField()

    class Meta:
        app_label = "orchestrator"
        indexes = [models.Index(fields=["run_id"], name="taskruncount_run")]

    def __str__(self):
        group = f"instances of {self.instances_of}" if self.instances_of else "tasks"
        return f"run #{self.run_id}: {self.n:+d} {group} {self.state}"


# --- SQL ---------------------------------------------------------------------------------------

_GROUP = "CASE WHEN {t}.map_index >= 0 THEN {t}.task ELSE '' END"

# A task run the triggers count: any but a one-task job's (its run reads it directly).
_COUNTED = "({t}.spec->>'call') IS DISTINCT FROM 'job'"

# The trigger function: one INSERT per statement, grouped, whatever the number of rows. On
# update only rows whose state changed count (run, task and map index never change).
TRIGGER_FUNCTION = f"""
CREATE OR REPLACE FUNCTION orchestrator_count_task_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT n.run_id, {_GROUP.format(t="n")}, n.state, count(*) FROM new_rows n WHERE {_COUNTED.format(t="n")}
        GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT x.run_id, x.grp, v.state, sum(v.d) FROM (
            SELECT n.run_id, {_GROUP.format(t="n")} AS grp, n.state AS now_in, o.state AS was_in
            FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE o.state <> n.state AND {_COUNTED.format(t="n")}
        ) x CROSS JOIN LATERAL (VALUES (x.now_in, 1), (x.was_in, -1)) AS v(state, d)
        GROUP BY 1, 2, 3;
    ELSE
        -- Task runs deleted with their run (retention) are not counted back: the run's rows go.
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT o.run_id, {_GROUP.format(t="o")}, o.state, -count(*) FROM old_rows o
        WHERE o.run_id = ANY (ARRAY(SELECT r.id FROM orchestrator_run r
                                    WHERE r.id = ANY (ARRAY(SELECT DISTINCT run_id FROM old_rows))))
          AND {_COUNTED.format(t="o")}
        GROUP BY 1, 2, 3;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION orchestrator_forget_run_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM orchestrator_taskruncount c WHERE c.run_id = ANY (ARRAY(SELECT id FROM old_rows));
    RETURN NULL;
END $$;
"""

# One trigger per event: PostgreSQL gives transition tables only to single-event triggers.
TRIGGERS = """
CREATE TRIGGER taskrun_counted_insert AFTER INSERT ON orchestrator_taskrun
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER taskrun_counted_update AFTER UPDATE ON orchestrator_taskrun
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER taskrun_counted_delete AFTER DELETE ON orchestrator_taskrun
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER run_counts_forgotten AFTER DELETE ON orchestrator_run
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_forget_run_counts();
"""

# The counts of the task runs that exist when the triggers are made (in the same transaction,
# which the triggers' creation locks against writers).
BACKFILL = f"""
INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
SELECT t.run_id, {_GROUP.format(t="t")}, t.state, count(*) FROM orchestrator_taskrun t WHERE {_COUNTED.format(t="t")}
GROUP BY 1, 2, 3
"""

# The task runs of a run that the triggers leave out (a one-task job's), as count rows: read for
# a run of trigger "job" only, by the run's index entries (one, for a job).
JOB_TASK_RUNS = f"""
SELECT {_GROUP.format(t="t")} AS instances_of, t.state, 1 AS n FROM orchestrator_taskrun t
WHERE t.run_id = %(run)s AND NOT {_COUNTED.format(t="t")}
"""

DROP = """
DROP TRIGGER IF EXISTS run_counts_forgotten ON orchestrator_run;
DROP TRIGGER IF EXISTS taskrun_counted_delete ON orchestrator_taskrun;
DROP TRIGGER IF EXISTS taskrun_counted_update ON orchestrator_taskrun;
DROP TRIGGER IF EXISTS taskrun_counted_insert ON orchestrator_taskrun;
DROP FUNCTION IF EXISTS orchestrator_forget_run_counts();
DROP FUNCTION IF EXISTS orchestrator_count_task_runs();
"""

# A run's counts: (mapped task or NULL for the run's tasks, state, count). Reads the run's rows
# of TaskRunCount alone (a few dozen at most, see FOLD_AT).
RUN_COUNTS = """
SELECT NULLIF(instances_of, ''), state, sum(n)::bigint FROM orchestrator_taskruncount
WHERE run_id = %(run)s GROUP BY 1, 2 HAVING sum(n) <> 0
"""

# The same for a run of trigger "job": its rows (none, for a job made by enqueue) and its task runs
# that are not counted (JOB_TASK_RUNS).
JOB_RUN_COUNTS = f"""
SELECT NULLIF(instances_of, ''), state, sum(n)::bigint FROM (
    SELECT instances_of, state, n FROM orchestrator_taskruncount WHERE run_id = %(run)s
    UNION ALL
    {JOB_TASK_RUNS}
) c GROUP BY 1, 2 HAVING sum(n) <> 0
"""

# Many runs' counts of their mapped tasks' instances at once: (run, mapped task, state, count),
# for a workflow's grid.
RUNS_INSTANCE_COUNTS = """
SELECT run_id, instances_of, state, sum(n)::bigint FROM orchestrator_taskruncount
WHERE run_id = ANY (%(runs)s) AND instances_of <> '' GROUP BY 1, 2, 3 HAVING sum(n) <> 0
"""

# One mapped task's instances by state: (state, count).
TASK_INSTANCE_COUNTS = """
SELECT state, sum(n)::bigint FROM orchestrator_taskruncount
WHERE run_id = %(run)s AND instances_of = %(task)s GROUP BY 1 HAVING sum(n) <> 0
"""


def fold_ctes(runs: str) -> str:
    """Common table expressions (each a top-level ``name AS (...)``, to follow a WITH's others)
    that fold the rows of the runs ``runs`` (an SQL array expression) having FOLD_AT rows or more
    into one row per group and state. The probe stops at FOLD_AT index entries per run."""
    return f"""fold_runs AS MATERIALIZED (
    SELECT r FROM unnest({runs}) AS r
    WHERE (SELECT count(*) FROM (SELECT 1 FROM orchestrator_taskruncount c WHERE c.run_id = r LIMIT {FOLD_AT}) x)
          >= {FOLD_AT}
), fold_gone AS (
    DELETE FROM orchestrator_taskruncount c USING fold_runs f WHERE c.run_id = f.r
    RETURNING c.run_id, c.instances_of, c.state, c.n
), fold_sums AS (
    INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
    SELECT run_id, instances_of, state, sum(n) FROM fold_gone GROUP BY 1, 2, 3 HAVING sum(n) <> 0
)"""


def run_counts(run_id: int, job: bool | None = None) -> list[tuple[str | None, str, int]]:
    """``job``: whether the run's trigger is "job" (None: read it)."""
    with connection.cursor() as cursor:
        if job is None:
            cursor.execute("SELECT trigger = %s FROM orchestrator_run WHERE id = %s", [Trigger.JOB, run_id])
            found = cursor.fetchone()
            job = bool(found and found[0])
        cursor.execute(JOB_RUN_COUNTS if job else RUN_COUNTS, {"run": run_id})
        return cursor.fetchall()


def runs_instance_counts(run_ids: list[int]) -> dict[tuple[int, str], dict[str, int]]:
    """{(run, mapped task): {state: its instances in that state}} of these runs."""
    found: dict[tuple[int, str], dict[str, int]] = {}
    if run_ids:
        with connection.cursor() as cursor:
            cursor.execute(RUNS_INSTANCE_COUNTS, {"runs": list(run_ids)})
            for run_id, task, state, n in cursor.fetchall():
                found.setdefault((run_id, task), {})[state] = n
    return found


def task_instance_counts(run_id: int, task: str) -> dict[str, int]:
    """{state: instances of the mapped task ``task`` of the run in that state}."""
    with connection.cursor() as cursor:
        cursor.execute(TASK_INSTANCE_COUNTS, {"run": run_id, "task": task})
        return dict(cursor.fetchall())
