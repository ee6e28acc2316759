"""A worker's waiting sensors' checks (``worker.batch.CLAIM_CHECKS``): claimed in the worker's
batches when one is due, given to its children CHECKS_PER_CHILD at a time (one message and one
reply for them all), never to every child, so that a job due beside thousands of waiting sensors
finds a free one; and what their answers and their children's ends record."""

from __future__ import annotations

import time
from datetime import datetime

from orchestrator import clock
from orchestrator.resolver import Ending
from orchestrator.states import AttemptOutcome
from orchestrator.worker.batch import (
    CHECK_GATHER_SECONDS,
    CHECK_LEASE_SECONDS,
    CHECK_TIMEOUT_SECONDS,
    CHECKS_PER_CHILD,
)
from orchestrator.worker.pool import Pool


class SensorChecks:
    def __init__(self, pool: Pool, concurrency: int):
        self.pool = pool
        self.concurrency = concurrency
        self.claimed: list[dict] = []  # claimed, not given to a child yet
        self.next_due = 0.0  # time.monotonic() when to claim checks next
        self.batches = 0  # batches given to children, and the checks in them
        self.run = 0

    def room(self) -> int:
        """How many of the idle children may take a batch of checks: every child but one is left
        to ordinary work (all of them with a concurrency of one)."""
        checking = sum(1 for slot in self.pool.busy() if "checks" in slot.message)
        return max(0, min(len(self.pool.idle_slots()), max(1, self.concurrency - 1) - checking))

    def to_claim(self, now: float, looking: bool) -> int:
        """How many checks the next batch claims: when one is due (or the worker looks unasked,
        ``looking``), none claimed is left, and a child may take them; never just because a
        notification brought a job, whose start would then wait for the checks' claim too."""
        room = self.room()
        return room * CHECKS_PER_CHILD if room and not self.claimed and (now >= self.next_due or looking) else 0

    def wait(self, now: float) -> float | None:
        """Until the worker should give or claim checks (None: no child may take them now; a
        freed child's reply wakes the loop)."""
        if not self.room():
            return None
        return 0.0 if self.claimed else self.next_due - now

    def start(self) -> bool:
        """Give the claimed checks to the children that may take them, CHECKS_PER_CHILD each;
        whether any started."""
        started = False
        for slot in self.pool.idle_slots()[:self.room()]:
            if not self.claimed:
                break
            started = True
            batch, self.claimed = self.claimed[:CHECKS_PER_CHILD], self.claimed[CHECKS_PER_CHILD:]
            self.batches += 1
            self.run += len(batch)
            # The child's time for the batch: each check's own (a timer in the child ends one that
            # hangs), within the lease, after which another worker may take them.
            timeout = min(sum(float(check["timeout"] or CHECK_TIMEOUT_SECONDS) for check in batch),
                          CHECK_LEASE_SECONDS / 2)
            self.pool.start_task(slot, {"id": batch[0]["id"], "number": batch[0]["number"], "run_id": batch[0]["run_id"],
                                        "task": batch[0]["task"], "spec": {}, "timeout": timeout, "checks": batch})
        return started

    def release(self) -> list[dict]:
        """The claimed checks no child took (a drain gives them back)."""
        claimed, self.claimed = self.claimed, []
        return claimed

    def after_claim(self, now: float, claimed: int, asked: int, next_due: datetime | None) -> None:
        """When to claim checks next: at once while more are due, else when the next one is due
        (``next_due``, as the claim read it; None: none known, at the next look or when this
        worker records a "not yet")."""
        wait = None if next_due is None else (next_due - clock.now()).total_seconds()
        if claimed == asked:
            self.next_due = now  # a backlog: claim again as soon as a child may take them
        else:
            # Not before CHECK_GATHER_SECONDS: checks that come due meanwhile go in one claim.
            self.next_due = float("inf") if wait is None else now + max(wait, CHECK_GATHER_SECONDS)

    def answered(self, message: dict, ending: Ending) -> None:
        if ending.outcome == AttemptOutcome.RESCHEDULED:
            # A "not yet" wakes nobody: this worker, which records it, checks again when it is due.
            self.next_due = min(self.next_due, time.monotonic() + float(message["spec"]["sensor"]["every"]))


def replies(message: dict, reply: list) -> list[tuple[dict, Ending]]:
    """A batch of checks' answers, each with its check."""
    return [(check, Ending(*answer, run_id=check["run_id"], check=check["check"]))
            for check, answer in zip(message["checks"], reply, strict=False)]


def ended(message: dict, outcome: str, error: str) -> list[Ending]:
    """The endings of a batch of checks whose child ended (timed out, died)."""
    return [Ending(check["id"], check["number"], outcome, run_id=check["run_id"], check=check["check"], error=error)
            for check in message["checks"]]
