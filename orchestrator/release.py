"""The trigger rules, as set-based SQL: which waiting children the parents that ended release (or
give up on), for ``resolver.resolve_runs`` inside its transaction. The rules are the table
``states.TRIGGER_RULE_DECISIONS``, one CASE branch per rule; runs that map or branch take the
steps of ``mapping.py`` as well.

Trigger rules follow Airflow's: a child is decided as soon as its rule is settled, not only when
every parent is done (one failed parent settles ``all_success`` as ``upstream_failed``).
"""

from __future__ import annotations

from datetime import datetime

from orchestrator import db, mapping
from orchestrator.states import (
    DEFAULT_TRIGGER_RULE,
    PARENT_BAD,
    PARENT_OK,
    PARENT_SKIPPED,
    TRIGGER_RULE_DECISIONS,
    TaskState,
    sql_list,
)

# --- SQL ---------------------------------------------------------------------------------------

# Decide waiting children of the given runs whose trigger rule is settled by their parents'
# states (the rules are the table states.TRIGGER_RULE_DECISIONS, one CASE branch per rule):
# 'scheduled' releases them now, 'upstream_failed'/'skipped' ends them. NULL: not yet.
def _rule_case(decisions) -> str:
    return "CASE " + " ".join(f"WHEN {condition} THEN '{state}'" for condition, state in decisions) + " END"


# The default rule is the ELSE branch: a spec without a (known) rule gets it.
RULE_CASE = "\n        ".join(
    [f"WHEN '{rule}' THEN {_rule_case(decisions)}" for rule, decisions in TRIGGER_RULE_DECISIONS.items()
     if rule != DEFAULT_TRIGGER_RULE]
    + [f"ELSE {_rule_case(TRIGGER_RULE_DECISIONS[DEFAULT_TRIGGER_RULE])}  -- {DEFAULT_TRIGGER_RULE}"]
)

# The children of the task runs that just ended, by the names each lists (``downstream``), on the
# unique index. One that does not know them (NULL: made before) has every waiting task run of its
# run looked at (gated by EXISTS, checked once before any scan). ARRAY(), not a join: reckoning
# that branch a whole run, the planner would hash every task run of the table.
CHILDREN_OF_ENDED = f"""c.id = ANY (ARRAY(
        SELECT k.id FROM orchestrator_taskrun p
        CROSS JOIN LATERAL unnest(p.downstream) AS d(task)
        JOIN orchestrator_taskrun k ON k.run_id = p.run_id AND k.task = d.task AND k.map_index = -1
        WHERE p.id = ANY (%(ended)s)
        UNION
        SELECT k.id FROM orchestrator_taskrun k
        WHERE EXISTS (SELECT FROM orchestrator_taskrun p WHERE p.id = ANY (%(ended)s) AND p.downstream IS NULL)
          AND k.run_id = ANY (ARRAY(SELECT p.run_id FROM orchestrator_taskrun p
                                    WHERE p.id = ANY (%(ended)s) AND p.downstream IS NULL))
          AND k.state = '{TaskState.WAITING}' AND k.map_index = -1))"""


def _waiting_counts(which: str, among: str | None = None) -> str:
    """Waiting task runs (of the given runs, or ``among``: CHILDREN_OF_ENDED; ``which``: the
    mapped ones or the others) with the counts their rules read: parents in all (n), succeeded
    (ok), failed (bad), skipped (skip). A mapped parent counts once, by its own row (map_index -1);
    instances never wait for parents."""
    return f"""
    SELECT c.id, COALESCE(c.spec->>'trigger_rule', '{DEFAULT_TRIGGER_RULE}') AS rule,
           cardinality(c.upstream) AS n,
           count(*) FILTER (WHERE p.state IN ({sql_list(PARENT_OK)})) AS ok,
           count(*) FILTER (WHERE p.state IN ({sql_list(PARENT_BAD)})) AS bad,
           count(*) FILTER (WHERE p.state IN ({sql_list(PARENT_SKIPPED)})) AS skip
    FROM orchestrator_taskrun c
    JOIN orchestrator_taskrun p ON p.run_id = c.run_id AND p.task = ANY (c.upstream) AND p.map_index = -1
    WHERE {among or "c.run_id = ANY (%(runs)s)"} AND c.state = '{TaskState.WAITING}'
      AND c.map_index = -1 AND {which}
    GROUP BY c.id"""


# Decide every waiting child of the given runs whose rule its parents now settle, in one
# statement (RULE_CASE): scheduled and due now, upstream_failed or skipped. Those decided as not
# running settle their own children in turn, so the caller repeats it until nothing changes.
# RELEASE_CHILDREN_OF does the same for the children of the task runs that ended (CHILDREN_OF_ENDED).
_RELEASE = f"""
WITH c AS (__WAITING__
), d AS (
    SELECT id, CASE rule
        {RULE_CASE}
    END AS next
    FROM c
)
UPDATE orchestrator_taskrun t SET state = d.next,
    due_at = CASE WHEN d.next = '{TaskState.SCHEDULED}' THEN %(now)s END,
    finished_at = CASE WHEN d.next <> '{TaskState.SCHEDULED}' THEN %(now)s END
FROM d
WHERE t.id = d.id AND d.next IS NOT NULL AND t.state = '{TaskState.WAITING}'
RETURNING t.id, t.state
"""
# Prepared, as every statement of a completion batch is: planning each took longer than running it.
RELEASE_CHILDREN = db.prepared(_RELEASE.replace("__WAITING__", _waiting_counts("NOT c.spec ? 'map_over'")))
RELEASE_CHILDREN_OF = db.prepared(_RELEASE.replace("__WAITING__", _waiting_counts("NOT c.spec ? 'map_over'",
                                                                                  CHILDREN_OF_ENDED)))

# The same rules for mapped tasks (see mapping.py). Released, such a task is "mapped" (its
# instances are then created) when the parent it maps over succeeded with a list; skipped when
# that parent was skipped; upstream_failed otherwise, saying why.
RELEASE_MAPPED = db.prepared(f"""
WITH c AS ({_waiting_counts("c.spec ? 'map_over'")}
), d AS (
    SELECT id, CASE rule
        {RULE_CASE}
    END AS next
    FROM c
), e AS (
    SELECT d.id,
           CASE WHEN d.next <> '{TaskState.SCHEDULED}' THEN d.next
                WHEN p.state = '{TaskState.SUCCEEDED}' AND jsonb_typeof(p.result) = 'array' THEN '{TaskState.MAPPED}'
                WHEN p.state = '{TaskState.SKIPPED}' THEN '{TaskState.SKIPPED}'
                ELSE '{TaskState.UPSTREAM_FAILED}' END AS next,
           CASE WHEN d.next <> '{TaskState.SCHEDULED}' OR p.state = '{TaskState.SKIPPED}'
                  OR (p.state = '{TaskState.SUCCEEDED}' AND jsonb_typeof(p.result) = 'array') THEN ''
                WHEN p.state = '{TaskState.SUCCEEDED}' THEN 'cannot map over ' || p.task || ': its result is not a list'
                ELSE 'cannot map over ' || p.task || ': it did not succeed' END AS error
    FROM d
    JOIN orchestrator_taskrun t ON t.id = d.id
    JOIN orchestrator_taskrun p ON p.run_id = t.run_id AND p.task = t.spec->>'map_over' AND p.map_index = -1
    WHERE d.next IS NOT NULL
)
UPDATE orchestrator_taskrun t SET state = e.next, error = e.error,
    started_at = CASE WHEN e.next = '{TaskState.MAPPED}' THEN %(now)s END,
    finished_at = CASE WHEN e.next <> '{TaskState.MAPPED}' THEN %(now)s END
FROM e
WHERE t.id = e.id AND t.state = '{TaskState.WAITING}'
RETURNING t.id, t.state
""")


# --- functions ---------------------------------------------------------------------------------

def decide_children(cursor, release: list[int], dynamic: list[int], now: datetime, ended: list[int] | None = None) -> int:
    """Decide the waiting children of the runs ``release`` (``dynamic``: those of them that map
    or branch); returns how many became due. ``ended``: the task runs that ended, when known.

    A child that ends (upstream_failed/skipped) can settle its own children, and so can a
    branch's choice or a mapped task's end: repeat until nothing more is decided. Each pass goes
    one level deeper, so the loop is bounded by the depth of the graph."""
    if ended is not None and release and not dynamic:
        return release_children_of(cursor, ended, now)
    released = 0
    while release:
        settled = 0
        if dynamic:
            settled += mapping.skip_unchosen(cursor, dynamic, now)
            freed, ended = mapping.settle(dynamic, now)
            released += freed
            settled += len(ended)
        states = [state for _, state in _run(RELEASE_CHILDREN, {"runs": release, "now": now})]
        released += states.count(TaskState.SCHEDULED)
        settled += sum(1 for state in states if state != TaskState.SCHEDULED)
        if dynamic:
            decided = _run(RELEASE_MAPPED, {"runs": dynamic, "now": now})
            released += mapping.expand(cursor, [i for i, state in decided if state == TaskState.MAPPED], now)
            settled += len(decided)
        if not settled:
            break
    return released


def release_children_of(cursor, ended: list[int], now: datetime) -> int:
    """Decide the waiting children of the task runs ``ended`` (of runs that neither map nor branch),
    then those of the children decided as not running, a level per pass; returns how many are due."""
    released = 0
    while ended:
        rows = _run(RELEASE_CHILDREN_OF, {"ended": ended, "now": now})
        released += sum(1 for _, state in rows if state == TaskState.SCHEDULED)
        ended = [task_run_id for task_run_id, state in rows if state != TaskState.SCHEDULED]
    return released


def _run(statement: str, params: dict) -> list[tuple]:
    with db.cursor() as cursor:
        db.execute(cursor, statement, params)
        return cursor.fetchall()
