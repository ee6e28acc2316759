"""Functions registered as jobs (``@job``), to be enqueued as one-off or delayed jobs, e.g.

    from orchestrator.jobs import enqueue
    enqueue("workflows.jobs:send_welcome_email", kwargs={"user_id": 42}, run_after=in_ten_minutes,
            idempotency_key="welcome-42")

A job runs at least once: it can run again if a worker dies after doing the work but before
recording it, so it must be idempotent (here: the idempotency key of the mail provider).
"""

import logging

from orchestrator.jobs import job

log = logging.getLogger(__name__)


@job
def send_welcome_email(user_id: int, template: str = "welcome") -> dict:
    message_id = f"welcome-{user_id}"
    log.info("sending %s email to user %s (message id %s)", template, user_id, message_id)
    return {"user_id": user_id, "template": template, "message_id": message_id}


@job
def noop() -> None:
    """Does nothing; used to measure the scheduler's own overhead."""
