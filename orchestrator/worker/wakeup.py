"""Which notifications a worker answers with a claim, and when it looks for work unasked.

A fleet must cost the database per job, not per worker: if every idle worker answered every
notification with a claim, 32 idle workers would make 32 claims for each job enqueued, 31 of them
empty. So a notification of a queue says how many rows became due and carries a wake-up token
(``channels``), and each worker of the queue decides alone, without a query, whether it is one of
the slots that answer:

* **The ring.** Every live worker serving a queue (state running, a recent heartbeat), in id
  order, holds as many places on the queue's ring as its concurrency. A worker reads where its
  places are (and how big the ring is) with each heartbeat, and again when a worker registers,
  drains or stops (they say so on ``orchestrator_fleet``). Every worker reads the same rows, so
  they agree on the ring but for the moment after a change.
* **Turns.** A notification of N rows with token T names the places T-N+1 .. T (mod the ring);
  the owners of those places claim, as many rows as they own places (up to their free slots),
  and the others stay asleep. Tokens come from one sequence, so the turns go round the fleet and
  the worker that answered least recently is the next one asked. N at least the ring's size
  wakes everyone, as does a notification that counted nothing (the due channel, a sender that did
  not count) or a ring not read yet.
* **A place whose owner is busy** keeps the claim owed: the worker claims it as soon as a slot is
  free (the row waits for that slot, not for a poll).
* **Back-off.** A claim that answered a notification and found nothing (another worker took the
  rows, or views of the ring differed for a moment) makes the worker wait before it answers the
  next one, 5 ms doubling to 100 ms with equal jitter; what it was asked meanwhile it claims once,
  at the end of the wait. A claim that finds work ends the back-off.
* **Polls go round too.** A lost notification (a LISTEN connection that dropped, a ring out of
  date, a worker killed between being asked and claiming) must not strand a row, so someone looks
  every ``POLL_SECONDS``; but one poll per worker per interval would again cost per worker (64
  idle workers: 64 claims a second). While it listens, a worker polls only in the intervals that
  are its turn (interval k of the wall clock, k mod the number of workers = its rank), so the
  queue is looked at about once per interval by the whole fleet. Without LISTEN (polling mode)
  every worker polls every interval, as it must.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.db import connection

from orchestrator import clock
from orchestrator.channels import parse_wake, queue_channel
from orchestrator.conf import app_settings
from orchestrator.loop import Backoff
from orchestrator.states import WorkerState

# The first wait after an empty answer, and the longest.
BACKOFF_FIRST_SECONDS = 0.005
BACKOFF_MAX_SECONDS = 0.1

# A worker is on the ring while its heartbeat is younger than this many heartbeat intervals: long
# enough that a late heartbeat does not take it off (views then differ), short enough that a
# killed worker's places go to the others within a few intervals.
FRESH_BEATS = 3

# Where this worker's places are on the ring of each of its queues. Read on the partial index of
# live workers (worker_live), so stopped workers kept as history cost nothing.
RING = f"""
SELECT q.name,
       coalesce(sum(w.concurrency), 0),
       coalesce(sum(w.concurrency) FILTER (WHERE w.id < %(worker)s), 0),
       coalesce(sum(w.concurrency) FILTER (WHERE w.id = %(worker)s), 0),
       count(w.id),
       count(w.id) FILTER (WHERE w.id < %(worker)s)
FROM unnest(%(queues)s::text[]) AS q(name)
LEFT JOIN orchestrator_worker w ON q.name = ANY (w.queues) AND w.state = '{WorkerState.RUNNING}'
     AND w.heartbeat_at > now() - %(fresh)s * interval '1 second'
GROUP BY q.name
"""


@dataclass(frozen=True)
class Ring:
    """One queue's ring as this worker last read it."""

    size: int  # places: the concurrency of every live worker of the queue
    offset: int  # where this worker's places begin
    places: int  # how many are its own (its concurrency; 0 when it is not on the ring)
    workers: int  # live workers of the queue
    rank: int  # this worker's position among them

    def share(self, count: int, token: int) -> int | None:
        """How many of the places T-N+1 .. T are this worker's; None: the notification names the
        whole ring (everyone answers)."""
        if count >= self.size:
            return None
        if not self.places:
            return 0
        first = (token - count + 1) % self.size
        start = (self.offset - first) % self.size  # this worker's first place, counted from the first named
        # Named: 0 .. count-1 from the first. Its own: start .. start+places-1, which may wrap past
        # the end of the ring back to 0.
        mine = max(0, min(count, start + self.places) - start)
        wrapped = start + self.places - self.size
        if wrapped > 0:
            mine += min(wrapped, count)
        return mine

    def next_poll(self, now: float, poll: float) -> float:
        """The start of the next poll interval (seconds since the epoch) that is this worker's turn."""
        # The interval that began less than half an interval ago counts as the current one: a poll
        # woken a hair before its turn (the monotonic and the wall clock are read apart) must not
        # find that same turn still ahead and poll twice.
        interval = math.floor(now / poll + 0.5) + 1
        if self.workers > 1 and self.places:
            interval += (self.rank - interval) % self.workers
        return interval * poll


def read_rings(worker_id: int, queues: list[str]) -> dict[str, Ring]:
    """Each queue's ring, by the queue's channel."""
    with connection.cursor() as cursor:
        cursor.execute(RING, {"worker": worker_id, "queues": queues,
                              "fresh": FRESH_BEATS * app_settings.HEARTBEAT_SECONDS})
        return ring_by_channel(cursor.fetchall())


def ring_by_channel(rows) -> dict[str, Ring]:
    """RING's rows as each queue's ring, by the queue's channel."""
    return {queue_channel(queue): Ring(size=size, offset=offset, places=places, workers=workers, rank=rank)
            for queue, size, offset, places, workers, rank in rows}


class Wakeup:
    """What a worker was asked to claim by notifications, its back-off, and its poll turns."""

    def __init__(self, concurrency: int, poll: float, rng=None):
        self.concurrency = concurrency
        self.poll = poll
        self.rings: dict[str, Ring] = {}
        self.stale = True  # read the rings at the next chance
        self.owed = 0  # slots to fill for notifications that named this worker's places
        self.everyone = False  # a notification every worker answers
        self.more = False  # ... that counted more rows than the ring has places (or nothing)
        self.backoff = Backoff(BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS, **({"rng": rng} if rng else {}))
        self.quiet_until = 0.0  # time.monotonic(): no answer before (the back-off)

    def refresh(self, worker_id: int, queues: list[str]) -> None:
        self.rings = read_rings(worker_id, queues)
        self.stale = False

    def notified(self, channel: str, payload: str) -> None:
        """A queue's (or the due channel's) notification: owe the places it names, or answer with
        everyone."""
        wake = parse_wake(payload)
        ring = self.rings.get(channel)
        share = ring.share(*wake) if wake is not None and ring is not None and ring.size else None
        if share is None:
            self.everyone = True
            self.more = self.more or wake is None or ring is None or wake[0] > ring.size
        else:
            # Not capped at this worker's slots: many notifications of a row or two (one per
            # transaction that enqueued) can name its places more times than it has slots, and
            # what it owes beyond them it claims as slots free (a cap would leave those rows to
            # the next poll). A claim that comes back short forgets the debt (after_claim).
            self.owed += share

    def asked(self, now: float) -> bool:
        """Whether a notification asks for a claim now (not while backing off)."""
        return (self.everyone or self.owed > 0) and now >= self.quiet_until

    def claim_size(self, idle: int) -> int:
        """The slots to fill to answer what was asked: every free one for a notification to
        everyone, else the places owed."""
        return idle if self.everyone else min(idle, self.owed)

    def after_claim(self, asked: int, claimed: int, now: float, *, answering: bool, due_now: bool = False,
                    later: bool = False) -> None:
        """A claim of ``asked`` slots found ``claimed`` rows (``due_now``: due rows were left, held
        by other workers' claims in flight or past the candidates it read; ``later``: the next
        due row is due later). An answer that found nothing backs off; if rows were held, what it
        owes stays owed and it answers again after the back-off (their holders may roll back),
        else nothing more is owed (others took the rows)."""
        if claimed < asked and not (answering and not claimed and due_now):
            self.owed = 0
        else:
            self.owed = max(0, self.owed - claimed)
        self.everyone = self.more = False
        if claimed:
            self.backoff.reset()
        elif answering and not later:
            self.quiet_until = now + self.backoff.next()

    def next_poll(self, now: float, last_claim: float, listening: bool) -> float:
        """When to look for work unasked (time.monotonic()): every poll interval when not
        listening (or the rings are unknown), else at this worker's next turn among its queues'."""
        if not listening or not self.rings:
            return last_claim + self.poll
        wall = clock.now().timestamp()
        turn = min(ring.next_poll(wall, self.poll) for ring in self.rings.values())
        return now + (turn - wall)
