"""Tiny task functions the execution tests run in real worker processes. Times are recorded in
files named by the run's params, so a test can compare when tasks started and ended."""

import json
import logging
import os
import sys
import time
from pathlib import Path

import requests

from orchestrator.registry import job

log = logging.getLogger("tests.tasks")


def _record(path, **fields):
    if path:
        with open(path, "a") as handle:  # O_APPEND: concurrent short writes do not interleave
            handle.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), **fields}) + "\n")


@job
def record(ctx):
    """Writes its start and end time; sleeps params["sleep"] seconds in between. The tasks named
    in params["together"] also wait (at most 30 s) until all of them have started, and record
    whether they met: proof that they ran at the same time, whatever the machine's load."""
    path = ctx.params.get("record")
    _record(path, task=ctx.task, attempt=ctx.attempt, event="start", at=time.time())
    together = ctx.params.get("together") or []
    if ctx.task in together:
        _record(path, task=ctx.task, event="met", met=_wait_for_starts(path, set(together), 30.0))
    time.sleep(float(ctx.params.get("sleep", 0)))
    _record(path, task=ctx.task, attempt=ctx.attempt, event="end", at=time.time())
    return {"task": ctx.task, "upstream": sorted(ctx.upstream)}


def _wait_for_starts(path, tasks: set, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path) as f:
            started = {json.loads(line)["task"] for line in f if '"start"' in line}
        if tasks <= started:
            return True
        time.sleep(0.02)
    return False


@job
def record_job(path, sleep=0.0, tag=""):
    _record(path, task=tag, event="start", at=time.time())
    time.sleep(sleep)
    _record(path, task=tag, event="end", at=time.time())
    return tag


@job
def crash_first_attempt(ctx):
    """Attempt 1 sleeps long (the test kills its worker); later attempts succeed."""
    path = ctx.params["record"]
    _record(path, task=ctx.task, attempt=ctx.attempt, event="start", at=time.time())
    if ctx.attempt == 1:
        time.sleep(60)
    _record(path, task=ctx.task, attempt=ctx.attempt, event="end", at=time.time())
    return "done"


@job
def slow_then_fast(ctx):
    """Attempt 1 outlives any small timeout; later attempts return at once."""
    if ctx.attempt == 1:
        time.sleep(60)
    return ctx.attempt


@job
def always_fails(ctx):
    if ctx.params.get("heal_file") and os.path.exists(ctx.params["heal_file"]):
        return "healed"
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


@job
def too_big():
    return "x" * (1024 * 1024)


@job
def not_json():
    return {1, 2, 3}


@job
def noisy(ctx):
    print("to stdout")
    print("to stderr", file=sys.stderr)
    log.warning("through logging")
    gate = ctx.params.get("gate")
    deadline = time.monotonic() + 30
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("after the gate")
    return "noisy"


@job
def sleeper(seconds=30.0, marker=""):
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"


@job
def add(a, b=0):
    return a + b


@job
def context_echo(ctx):
    return {"run_id": ctx.run_id, "task": ctx.task, "params": ctx.params, "attempt": ctx.attempt,
            "upstream": ctx.upstream, "logical_date": ctx.logical_date.isoformat()}


@job
def no_argument():
    return "no argument"


@job
async def coroutine_job(x):
    return x * 2


@job
def traced_work(ctx):
    """A task whose own calls a trace shows: a query through the ORM, an HTTP call with requests
    (to params["ping"]), and a log line."""
    # Here, not at the top: conftest imports this module before Django's app registry is ready.
    from orchestrator.models import Workflow

    count = Workflow.objects.count()
    status = requests.get(ctx.params["ping"], timeout=10).status_code
    log.info("work of %s done", ctx.task)
    return {"workflows": count, "status": status}


@job
def loaded_modules(prefix):
    """The modules of this child process whose names start with ``prefix``."""
    return sorted(name for name in sys.modules if name.startswith(prefix))


@job
def record_until(path, tag, release):
    """record_job's records around a wait (at most 30 s) for the file ``release`` to exist."""
    _record(path, task=tag, event="start", at=time.time())
    deadline = time.monotonic() + 30
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    _record(path, task=tag, event="end", at=time.time())
    return tag
