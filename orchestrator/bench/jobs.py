"""The jobs the benchmark runs (imported by its worker processes through ORCHESTRATOR_JOB_MODULES)."""

from __future__ import annotations

import time

from orchestrator.jobs import job


@job
def noop():
    """A job that does nothing."""


@job(executor="async")
async def noop_async():
    """A job that does nothing, on the async executor (an event loop in the worker's host)."""


@job
def stamp() -> float:
    """A job that returns when it started (the latency figure)."""
    return time.time()


@job(executor="async")
async def stamp_async() -> float:
    """``stamp`` on the async executor."""
    return time.time()


@job
def noop_task():
    """A workflow task that does nothing."""


@job
def listing(ctx):
    """The list a mapped task runs over (the map section): ``params["items"]`` numbers."""
    return list(range(int(ctx.params.get("items", 10))))


@job
def noop_item(ctx):
    """One instance of the map section: does nothing."""


@job
def not_yet(ctx):
    """A sensor whose check always answers "not yet" (the sensors section)."""
    return False
