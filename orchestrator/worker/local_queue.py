"""The worker's local queue: task runs it claimed (their attempts begun) that wait for a place of
its own, a forked child or, for a job declared for the in-process executor, a place of its host.

They wait in rank order (``add``): a job a later claim took goes ahead of the waiting ones it
outranks. What was claimed ahead of the children (``pool.ahead``: a bet that tasks stay short) is
timed from when it began to wait (``since``, in claim order), and handed back (``stale``) when
the oldest waited HELD_SECONDS while nothing of the worker ended: its children or its host are
stuck, e.g. on a sibling task the worker holds. A job declared for the in-process executor waits
for its host's places and never goes to a forked child of a worker that has such places: it runs
where it declared, as its author and the README expect.
"""

from __future__ import annotations

# A job claimed ahead that waited this long while nothing of the worker ended (its tasks are
# stuck) is handed back: due again at once for any worker; its attempt never started and does not
# count. The average of task times is then forgotten (worker.role).
HELD_SECONDS = 1.0


class LocalQueue:
    def __init__(self):
        self.jobs: list[dict] = []
        self.since: dict[int, float] = {}  # claimed ahead: task run id -> time.monotonic() it began to wait
        self.for_host: set[int] = set()  # the waiting jobs that run in the host: their task run ids

    def __len__(self) -> int:
        return len(self.jobs)

    def for_children(self) -> int:
        """How many wait for a forked child."""
        return len(self.jobs) - len(self.for_host)

    def add(self, message: dict, *, host: bool = False, began: float | None = None) -> None:
        """Queue a claimed job behind every waiting job that ranks as high (its "rank": lane, then
        priority, as the claim's dispatch order), ahead of the ones it outranks. ``host``: it runs
        in the host; ``began``: it was claimed ahead, at this time (only those are handed back)."""
        rank = message.get("rank", (0, 0))
        at = len(self.jobs)
        while at and self.jobs[at - 1].get("rank", (0, 0)) > rank:
            at -= 1
        self.jobs.insert(at, message)
        if host:
            self.for_host.add(message["id"])
        if began is not None:
            self.since[message["id"]] = began

    def take(self, idle: int, free: int) -> tuple[list[dict], list[dict]]:
        """Take out, in queue order, the jobs that start now: up to ``idle`` for forked children
        and up to ``free`` for the host; the others keep their place."""
        if not (idle and self.for_children()) and not (free and self.for_host):
            return [], []
        children, host, kept = [], [], []
        for message in self.jobs:
            if message["id"] in self.for_host:
                (host if len(host) < free else kept).append(message)
            else:
                (children if len(children) < idle else kept).append(message)
        self.jobs = kept
        for message in children + host:
            self.since.pop(message["id"], None)
            self.for_host.discard(message["id"])
        return children, host

    def remove(self, task_run_id: int) -> dict | None:
        """Drop a waiting job (cancelled or reaped): its message, or None."""
        for at, message in enumerate(self.jobs):
            if message["id"] == task_run_id:
                self.since.pop(task_run_id, None)
                self.for_host.discard(task_run_id)
                return self.jobs.pop(at)
        return None

    def clear(self) -> list[dict]:
        jobs, self.jobs, self.since, self.for_host = self.jobs, [], {}, set()
        return jobs

    def waited_since(self, last_end: float) -> float | None:
        """Since when the queue has not moved: the oldest claimed ahead waits and nothing ended
        after ``last_end`` (None: nothing claimed ahead waits)."""
        oldest = next(iter(self.since.values()), None)
        return None if oldest is None else max(oldest, last_end)

    def stale(self, now: float, last_end: float) -> list[dict]:
        """Take out the jobs claimed ahead that waited HELD_SECONDS while nothing ended since
        ``last_end``; the others keep their place and their claim order."""
        since = self.waited_since(last_end)
        if since is None or now - since < HELD_SECONDS:
            return []
        late = {task_run_id for task_run_id, began in self.since.items() if now - began >= HELD_SECONDS}
        stale = [message for message in self.jobs if message["id"] in late]
        self.jobs = [message for message in self.jobs if message["id"] not in late]
        for task_run_id in late:
            del self.since[task_run_id]
            self.for_host.discard(task_run_id)
        return stale
