"""The worker: claims due task runs of its queues and runs them in a pool of child processes.

    role.py       the role on the shared loop: the tick's named steps, notifications
    batch.py      one transaction per batch: record the outcomes, claim work (CLAIM)
    pool.py       the child processes: fork, kill, replace, retire, resize, recycle (no database)
    inprocess.py  the in-process executor: async jobs on an event loop, thread jobs in a pool, in one host
    heartbeat.py  the worker's row: register, heartbeat, state, which attempts are still its own
    drain.py      SIGTERM: finish within the grace period, then hand back what still runs
    reconnect.py  after a database outage: outcomes to record again, claims to hand back
"""

from orchestrator.worker.pool import Slot
from orchestrator.worker.role import Worker

__all__ = ["Slot", "Worker"]
