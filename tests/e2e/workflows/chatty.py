"""A task that writes `logging` output at every level, printed lines and a logged traceback:
the log view searches it and filters it by level."""

import logging

from orchestrator.dsl import Workflow

chatty = Workflow("chatty_log", description="Logs at every level.")


@chatty.task
def talk(ctx):
    log = logging.getLogger("chatty")
    log.setLevel(logging.DEBUG)
    print("printed before any record")
    for n in range(1, 4):
        log.debug("debug line %d about Orders", n)
        log.info("info line %d about orders", n)
    log.warning("warning: ORDERS are late")
    try:
        raise ValueError("no orders today")
    except ValueError:
        log.exception("error while counting orders")
    log.critical("critical: giving up")
    print("printed at the end")
    return {"said": 9}
