"""Tasks and jobs that read secrets and try to leak them every way a task can: printed, logged
(with a traceback), URL-quoted, in base64, returned, raised. The secrets tests run them in this
process (``wf.test()``) and on real workers (forked children, the thread and async executors)."""

import base64
import logging
import sys
from urllib.parse import quote

from orchestrator.dsl import Workflow
from orchestrator.jobs import job
from orchestrator.secrets import secret

log = logging.getLogger("tests.secret_tasks")

probe = Workflow("secret-probe", secrets=["stripe"], params={"fail": False})


def _leak(value: str) -> None:
    print(f"the key is {value}")
    sys.stderr.write("in pieces: " + value[:3])
    sys.stderr.write(value[3:] + "\n")
    log.warning("logged: %s", value)
    log.warning("quoted: %s, base64: %s", quote(value, safe=""), base64.b64encode(value.encode()).decode())
    try:
        raise RuntimeError(f"inner {value}")
    except RuntimeError:
        log.exception("with a traceback")


@probe.task(connections=["warehouse"])
def leak(ctx):
    value = ctx.secret("stripe")
    warehouse = ctx.connection("warehouse")
    _leak(value)
    print(f"connecting to {warehouse.url} as {warehouse.login} with {warehouse.password}")
    if ctx.params.get("fail"):
        raise ValueError(f"the API refused key {value} at {warehouse.url}")
    return {"key": value, "nested": [f"Bearer {value}"], "password": warehouse.password}


@probe.task
def sneak(ctx):
    return ctx.secret("payroll")  # declared nowhere


probe.shell("shell_leak", 'echo "shell sees $SECRET_STRIPE"; echo "and $DB"', connections={"DB": "warehouse"})


@job(secrets=["stripe"])
def process_leak():
    value = secret("stripe")
    _leak(value)
    raise ValueError(f"process job refused {value}")


@job(secrets=["stripe"], executor="thread")
def thread_leak():
    value = secret("stripe")
    _leak(value)
    raise ValueError(f"thread job refused {value}")


@job(secrets=["stripe"], executor="async")
async def async_leak():
    value = secret("stripe")
    _leak(value)
    raise ValueError(f"async job refused {value}")


@job(executor="async")
async def async_sneak():
    return secret("stripe")  # this job declares nothing
