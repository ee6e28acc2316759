"""Task functions of the workflow-feature tests that run in real worker processes (registered
with @job; the tests name this module in ORCHESTRATOR_JOB_MODULES). Each records what it did in
the file its params name, so a test can count executions outside the orchestrator's tables."""

import json
import os
import time

from orchestrator.registry import job


def _record(path, **fields):
    if path:
        with open(path, "a") as handle:  # O_APPEND: concurrent short writes do not interleave
            handle.write(json.dumps({"pid": os.getpid(), "at": time.time(), **fields}) + "\n")


@job
def listing(ctx):
    return list(range(int(ctx.params.get("items", 10))))


@job
def work(ctx):
    """One mapped instance: sleeps a little, so a worker can be killed while many are running."""
    _record(ctx.params.get("record"), event="start", index=ctx.map_index, attempt=ctx.attempt)
    time.sleep(float(ctx.params.get("sleep", 0)))
    _record(ctx.params.get("record"), event="end", index=ctx.map_index, attempt=ctx.attempt)
    return ctx.item * 10


@job
def collect(ctx):
    return sum(ctx.upstream["work"])


@job
def noop(ctx=None):
    return None


@job
def wait_for_flag(ctx):
    """A sensor: true once the flag file exists."""
    _record(ctx.params.get("record"), event="check", task_run=ctx.task_run_id)
    return os.path.exists(ctx.params["flag"]) and "seen"


@job
def publish_once(ctx):
    """A producer whose first attempt does the work and then hangs (its worker is killed before
    the success is recorded): the retry does it again, as at-least-once allows."""
    _record(ctx.params.get("record"), event="publish", attempt=ctx.attempt)
    ctx.metadata["sales"] = {"attempt": ctx.attempt}
    if ctx.attempt == 1:
        time.sleep(60)
    return "published"


@job
def consume(ctx):
    _record(ctx.params.get("record"), event="consume", run=ctx.run_id)
    return [event["dataset"] for event in ctx.events]
