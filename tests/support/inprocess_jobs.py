"""Jobs the executor tests run on the in-process executor of real workers (async and thread)."""

import asyncio
import json
import logging
import os
import time
from pathlib import Path

from orchestrator.registry import job

log = logging.getLogger("tests.inprocess")


def _record(path, **fields):
    with open(path, "a") as handle:  # O_APPEND: concurrent short writes do not interleave
        handle.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")


@job(executor="async")
async def hang_async(path):
    """Says it started, then waits an hour (its timeout cancels it)."""
    _record(path, event="start", at=time.time())
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _record(path, event="cancelled", at=time.time())
        raise


@job(executor="thread")
def hang_thread(path):
    """Says it started, then blocks an hour in a thread (nothing can stop it but its process's end)."""
    _record(path, event="start", at=time.time())
    time.sleep(3600)


@job(executor="async")
async def pid_async():
    await asyncio.sleep(0)
    return os.getpid()


@job(executor="thread")
def pid_thread():
    return os.getpid()


@job(executor="async")
async def wait_unless_healed(path, heal):
    """Records its start; waits (at most 10 minutes) while the file ``heal`` does not exist."""
    _record(path, event="start", at=time.time())
    for _ in range(6000):
        if Path(heal).exists():
            return "healed"
        await asyncio.sleep(0.1)
    return "waited"


@job(executor="async")
async def chatty_async(tag, lines, path):
    """Logs and prints ``lines`` lines naming itself, yielding to the loop between them; returns
    the number of task runs Django's async ORM counts, and records when it started and ended."""
    from orchestrator.models import TaskRun

    _record(path, tag=tag, event="start", at=time.time())
    for i in range(lines):
        log.info("%s record %d", tag, i)
        print(f"{tag} print {i}")
        await asyncio.sleep(0.01)
    count = await TaskRun.objects.acount()
    _record(path, tag=tag, event="end", at=time.time())
    return count


@job(executor="thread")
def chatty_thread(tag, lines, path):
    """The same in a thread: logs and prints ``lines`` lines, sleeping between them."""
    from orchestrator.models import TaskRun

    _record(path, tag=tag, event="start", at=time.time())
    for i in range(lines):
        log.info("%s record %d", tag, i)
        print(f"{tag} print {i}")
        time.sleep(0.01)
    count = TaskRun.objects.count()
    _record(path, tag=tag, event="end", at=time.time())
    return count


@job(executor="async")
async def fails_async():
    await asyncio.sleep(0)
    raise ValueError("async boom")


@job
def plain_job():
    return os.getpid()


@job(executor="async")
async def exit_host():
    """Ends the interpreter it runs in, as a crashing C extension would."""
    await asyncio.sleep(0.1)
    os._exit(3)
