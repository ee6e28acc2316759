"""Dynamic task mapping and branches, as steps of the resolver (called inside its transaction,
with the run rows locked, only for runs whose graph maps or branches: ``Run.dynamic``; a map's
instances are recorded without the lock, which is taken to settle the map: see below).

A mapped task (``transform.map(over=extract)``) is one row with map_index -1, plus one instance
per item of ``extract``'s list result (map_index 0, 1, ...). Its own row is what the rest of the
graph sees: ``waiting`` until its trigger rule settles, then ``mapped`` while the instances run,
then ``succeeded`` (every instance succeeded or was skipped; its result is the list of their
results, in order) or ``failed``. Children wait for that row like for any parent. Each instance
is an ordinary task run: it is queued, claimed, retried, reaped, sent to the dead-letter queue
and retried from it on its own. Each instance holds its own item (``TaskRun.item``), copied when it
is created, so a claimed instance reads its own row (``taskcontext.UPSTREAM``) and never the
mapped-over list, whose size would otherwise be paid once per instance.

The instances are created in the transaction that settles the mapped task (the one recording
its parent's success): with ``max_parallel`` the first ones are due now and the rest wait, and
each instance that ends releases the next (``RELEASE_INSTANCES``), under the run lock, so the cap
holds exactly whatever the number of workers. A list longer than ``ORCHESTRATOR_MAX_MAP_ITEMS``
never gets here: the worker fails the parent that returned it (``executor.check_result``).

A branch task returns the name(s) of the children to follow; the other direct children become
``skipped`` (``SKIP_UNCHOSEN``) and their descendants follow their trigger rules.

What a map costs. ``EXPAND`` reads the list once and writes one row per item: linear (recording
a 3,000-item list's success reads about 9 times the rows of a 300-item one, where the length
computed per instance row read about 29 times). A batch of instances in the middle of a map runs
one statement of this module (``SETTLE``: one index probe, from the last instance down, asks
whether any instance is active) and nothing else of the resolver (``resolver.resolve_runs``'
``quiet`` runs); only the batch of the last instance aggregates the results.
``tests/test_mapping_scale.py`` counts it: a claim of ten instances and a batch recording ten
and claiming ten read the same rows and send the same statements in maps of 1,000 and 10,000
items; ``tests/test_map_settling.py``: the probe reads as much after 2,000 instances ended as
before the first (it read 2,001 task runs instead of 2 when it walked from the first instance).

The instances of a map without ``max_parallel`` are recorded without their run's lock
(``resolver.Ending.unlocked``): the lock is taken, without waiting, only for ``SETTLE``, in a
statement of its own, so two workers' batches of one map do not take turns. A run another
transaction holds at that moment is settled once the batch committed, by the worker
(``worker.batch.Batch.settle``) or, if it died first, by the reaper (``reaper.SETTLE_MAPS``).
"""

from __future__ import annotations

from datetime import datetime

from orchestrator import counts, db, retries
from orchestrator.states import (
    ACTIVE_TASK_STATES,
    BUSY_TASK_STATES,
    FINISHED_TASK_STATES,
    SUCCESSFUL_TASK_STATES,
    TaskState,
    sql_list,
)

# --- SQL ---------------------------------------------------------------------------------------

# Direct children of succeeded branch tasks that the branch did not choose are skipped. Only
# waiting children: a child already decided keeps its state. Idempotent, so it runs on every
# pass of the resolver for the runs that branch. Found from the waiting children (few, on the
# index taskrun_unfinished), not from the succeeded task runs, which include every instance.
SKIP_UNCHOSEN = f"""
WITH unchosen AS (
    SELECT c.id, b.task AS branch
    FROM orchestrator_taskrun c
    JOIN orchestrator_taskrun b ON b.run_id = c.run_id AND b.task = ANY (c.upstream) AND b.map_index = -1
    WHERE c.run_id = ANY (%(runs)s) AND c.map_index = -1 AND c.state = '{TaskState.WAITING}'
      AND b.state = '{TaskState.SUCCEEDED}' AND b.spec ? 'branch'
      AND NOT c.task = ANY (ARRAY(SELECT jsonb_array_elements_text(CASE jsonb_typeof(b.result)
            WHEN 'array' THEN b.result WHEN 'string' THEN jsonb_build_array(b.result) ELSE '[]'::jsonb END)))
)
UPDATE orchestrator_taskrun t SET state = '{TaskState.SKIPPED}', finished_at = %(now)s,
    error = 'not chosen by the branch ' || u.branch
FROM unchosen u
WHERE t.id = u.id AND t.state = '{TaskState.WAITING}'
RETURNING t.id
"""

# The instances of mapped tasks that were just settled (state mapped), one per item of the
# mapped-over parent's list, each holding its own item: the first max_parallel due now, the others
# waiting. The list is read once per mapped task (``m``, materialized: its length is computed
# once, not once per instance row) and walked once (jsonb_array_elements), so the statement is
# linear in the item count. A task mapped again (its parent ran again after a clear) resets the
# instances it had, keeping their attempt history (attempt numbers go on; each gets a fresh
# allowance of attempts), and drops those beyond the new list's length (``extra``: disjoint from
# the rows inserted, so both happen in this one statement).
EXPAND = f"""
WITH m AS MATERIALIZED (
    SELECT t.id, t.run_id, t.task, t.spec, t.upstream, t.queue, t.priority, t.tenant, t.lane, t.timeout,
           {retries.allowance_sql("t")} AS allowance, p.result AS items,
           jsonb_array_length(p.result) AS n,
           COALESCE((t.spec->>'max_parallel')::int, 2147483647) AS cap
    FROM orchestrator_taskrun t
    JOIN orchestrator_taskrun p ON p.run_id = t.run_id AND p.task = t.spec->>'map_over' AND p.map_index = -1
    WHERE t.id = ANY (%(ids)s) AND t.state = '{TaskState.MAPPED}' AND jsonb_typeof(p.result) = 'array'
), extra AS (
    DELETE FROM orchestrator_taskrun i USING m
    WHERE i.run_id = m.run_id AND i.task = m.task AND i.map_index >= m.n
)
INSERT INTO orchestrator_taskrun AS t (run_id, task, map_index, state, spec, upstream, downstream, queue, priority,
    tenant, lane, attempts, max_attempts, due_at, timeout, result, item, error, created_at)
SELECT m.run_id, m.task, e.i::int - 1,
       CASE WHEN e.i <= m.cap THEN '{TaskState.SCHEDULED}' ELSE '{TaskState.WAITING}' END,
       m.spec, m.upstream, '{{}}', m.queue, m.priority, m.tenant, m.lane, 0, m.allowance,
       CASE WHEN e.i <= m.cap THEN %(now)s::timestamptz END, m.timeout, NULL, e.item, '', %(now)s
FROM m CROSS JOIN LATERAL jsonb_array_elements(m.items) WITH ORDINALITY AS e(item, i)
ON CONFLICT (run_id, task, map_index) DO UPDATE SET
    state = EXCLUDED.state, due_at = EXCLUDED.due_at, max_attempts = t.attempts + EXCLUDED.max_attempts,
    item = EXCLUDED.item, result = NULL, error = '', worker_id = NULL, queued_at = NULL, started_at = NULL,
    finished_at = NULL
WHERE t.state IN ({sql_list(FINISHED_TASK_STATES)})
"""

# With max_parallel: release waiting instances, lowest index first, as far as the cap allows.
RELEASE_INSTANCES = f"""
WITH m AS (
    SELECT m.run_id, m.task, (m.spec->>'max_parallel')::int - (
        SELECT count(*) FROM orchestrator_taskrun i
        WHERE i.run_id = m.run_id AND i.task = m.task AND i.map_index >= 0
          AND i.state IN ('{TaskState.SCHEDULED}', {sql_list(BUSY_TASK_STATES)})) AS room
    FROM orchestrator_taskrun m
    WHERE m.run_id = ANY (%(runs)s) AND m.map_index = -1 AND m.state = '{TaskState.MAPPED}'
      AND m.spec ? 'max_parallel'
), r AS (
    SELECT x.id FROM m CROSS JOIN LATERAL (
        SELECT i.id FROM orchestrator_taskrun i
        WHERE i.run_id = m.run_id AND i.task = m.task AND i.map_index >= 0 AND i.state = '{TaskState.WAITING}'
        ORDER BY i.map_index LIMIT GREATEST(m.room, 0)
    ) x
)
UPDATE orchestrator_taskrun t SET state = '{TaskState.SCHEDULED}', due_at = %(now)s
WHERE t.id = ANY (ARRAY(SELECT id FROM r)) AND (t.state = '{TaskState.WAITING}') IS TRUE
RETURNING t.id
"""

# A mapped task whose instances have all ended: succeeded when each ended well, with the list of
# their results in order; failed otherwise, saying how many did not. This runs in every
# completion batch of the run, under its lock, so it first asks whether any instance is still
# active (the partial index taskrun_active_instances): one index probe while the map runs,
# instead of aggregating every instance's result each time one ends. The probe reads from the
# highest map index down (ACTIVE_INSTANCE): instances are claimed from the lowest, and the index
# entries of ended ones stay until a vacuum, which a probe from the lowest would walk at every
# batch (2,000 entries when 2,000 instances had ended). Materialized, so no plan can join the
# instances (to aggregate them) before that probe has said the map is over. The mapped task's
# row is updated by id (its state only a guard, IS TRUE: no index), so no plan finds it by its
# state among every task run (a scan of a whole index whose first column is the run).
ACTIVE_INSTANCE = f"""(SELECT i.map_index FROM orchestrator_taskrun i
        WHERE i.run_id = m.run_id AND i.task = m.task AND i.map_index >= 0
          AND i.state IN ({sql_list(ACTIVE_TASK_STATES)})
        ORDER BY i.map_index DESC LIMIT 1)"""
FINISH_MAPPED = f"""
WITH m AS MATERIALIZED (
    SELECT m.id, m.run_id, m.task FROM orchestrator_taskrun m
    WHERE m.run_id = ANY (%(runs)s) AND m.map_index = -1 AND m.state = '{TaskState.MAPPED}'
      AND {ACTIVE_INSTANCE} IS NULL
), s AS (
    SELECT m.id, count(i.id) AS n,
           count(i.id) FILTER (WHERE i.state IN ({sql_list(SUCCESSFUL_TASK_STATES)})) AS ok,
           COALESCE(jsonb_agg(i.result ORDER BY i.map_index) FILTER (WHERE i.id IS NOT NULL), '[]'::jsonb) AS results
    FROM m
    LEFT JOIN orchestrator_taskrun i ON i.run_id = m.run_id AND i.task = m.task AND i.map_index >= 0
    GROUP BY m.id
)
UPDATE orchestrator_taskrun t SET
    state = CASE WHEN s.ok = s.n THEN '{TaskState.SUCCEEDED}' ELSE '{TaskState.FAILED}' END,
    result = s.results, finished_at = %(now)s,
    error = CASE WHEN s.ok = s.n THEN '' ELSE (s.n - s.ok) || ' of ' || s.n || ' mapped instances did not succeed' END
FROM s WHERE t.id = ANY (ARRAY(SELECT id FROM m)) AND t.id = s.id AND (t.state = '{TaskState.MAPPED}') IS TRUE
RETURNING t.run_id
"""

# Both steps in one statement (one round trip per batch of instances). They write different rows
# (waiting instances; the mapped task's own row) and agree on one snapshot: a waiting instance
# released here is active before and after, so the map cannot be seen as over. The runs' counts
# are folded here too (counts.fold_ctes): in the middle of a map, this is the batch's statement.
SETTLE = db.prepared(f"""
WITH {counts.fold_ctes("%(runs)s::bigint[]")}, released AS ({RELEASE_INSTANCES}), finished AS ({FINISH_MAPPED})
SELECT (SELECT count(*) FROM released), ARRAY(SELECT run_id FROM finished)
""")

# An instance retried or cleared: its mapped task waits for it again (and so do the children,
# which control re-waits like those of any retried task).
REOPEN = f"""
UPDATE orchestrator_taskrun m SET state = '{TaskState.MAPPED}', finished_at = NULL, result = NULL, error = ''
FROM (SELECT DISTINCT run_id, task FROM orchestrator_taskrun WHERE id = ANY (%(ids)s) AND map_index >= 0) i
WHERE m.run_id = i.run_id AND m.task = i.task AND m.map_index = -1
  AND m.state IN ('{TaskState.SUCCEEDED}', '{TaskState.FAILED}')
"""


def skip_unchosen(cursor, runs: list[int], now: datetime) -> int:
    cursor.execute(SKIP_UNCHOSEN, {"runs": runs, "now": now})
    return len(cursor.fetchall())


def expand(cursor, ids: list[int], now: datetime) -> int:
    """Create the instances of mapped tasks that were just settled (state mapped); returns how
    many instances were written."""
    if not ids:
        return 0
    cursor.execute(EXPAND, {"ids": ids, "now": now})
    return cursor.rowcount


def settle(runs: list[int], now: datetime) -> tuple[int, list[int]]:
    """Release waiting instances up to max_parallel and end the mapped tasks whose instances have
    all ended; returns (instances released, the run of each mapped task ended). A prepared
    statement: every batch of a map's instances sends it, and its plan took longer to make (about
    1 ms) than to run."""
    with db.cursor() as cursor:
        db.execute(cursor, SETTLE, {"runs": runs, "now": now})
        released, ended = cursor.fetchone()
    return released, list(ended)


def reopen(cursor, instance_ids: list[int]) -> None:
    """Mapped tasks whose instances (among these task runs) run again wait for them again."""
    if instance_ids:
        cursor.execute(REOPEN, {"ids": instance_ids})
