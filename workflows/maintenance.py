"""Hourly housekeeping with shell-command tasks. A shell task sees the run's params as
environment variables (``PARAM_<NAME>``) next to ``RUN_ID`` and ``LOGICAL_DATE``; a non-zero
exit fails the attempt. The two shell steps are a task group: folded, the grid and the graph
show them as one row and one node.
"""

from orchestrator.dsl import Param, Schedule, Workflow

maintenance = Workflow(
    "maintenance",
    description=__doc__,
    schedules=[Schedule("0 * * * *", timezone="UTC", catchup="none", overlap="forbid", jitter=30)],
    params={"keep_days": Param(int, default=7, description="Delete scratch files older than this.")},
    tags=["ops"],
    owner="platform@example.com",
)

with maintenance.group("housekeeping", tooltip="the shell steps; summarize runs whatever they end in") as housekeeping:
    disk_report = maintenance.shell(
        "disk_report", "echo \"run $RUN_ID at $LOGICAL_DATE\" && df -h . | tail -n 1", timeout=60
    )
    clean_scratch = maintenance.shell(
        "clean_scratch",
        "mkdir -p \"${TMPDIR:-/tmp}/orchestrator-scratch\" && "
        "find \"${TMPDIR:-/tmp}/orchestrator-scratch\" -type f -mtime +\"$PARAM_KEEP_DAYS\" -print -delete",
        retries=1,
        timeout=120,
    )


@maintenance.task(trigger_rule="all_done")
def summarize(ctx):
    """Runs whether or not the shell steps succeeded (trigger rule all_done)."""
    return {"checked_at": ctx.logical_date.isoformat(), "keep_days": ctx.params["keep_days"]}


housekeeping >> summarize  # both steps before summarize: a group stands for its tasks
