"""The worker role on the shared loop (``orchestrator.loop``): each tick takes named steps that
the other modules of this package carry out.

One loop, one thread. Each turn of the loop is at most one transaction (``batch``) that records
the outcomes that came back from the children (and resolves their runs) and claims as many due
task runs as there are idle children that are ready (forked and waiting); it commits before any
child starts user code. Children (``pool``) are forked ahead and reused; a child whose task
outlives its timeout, or whose task run was cancelled or reaped (``heartbeat``: ownership), is
killed (SIGKILL on its process group) and replaced. Jobs declared for the in-process executor
run in its host instead, hundreds at once, when the worker has places for them (``inprocess``;
``capacity`` and ``place`` say how a claim is sized and split). After a database outage the worker
reconciles what it runs with what the database says (``reconnect``); SIGTERM drains (``drain``).

Jobs run at least once: a worker can finish a task and die before recording it, and the reaper
then gives the task run another attempt. Task code must be idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from orchestrator import clock, logs, registry, reload, tracing
from orchestrator.channels import CANCEL_CHANNEL, CODE_CHANNEL, DUE_CHANNEL, FLEET_CHANNEL, queue_channel
from orchestrator.conf import app_settings
from orchestrator.loop import DATABASE_ERRORS, Loop, Role, first_line
from orchestrator.resolver import Ending, settles_later
from orchestrator.states import AttemptOutcome, WorkerState
from orchestrator.worker import heartbeat, reconnect, sensor_checks
from orchestrator.worker.batch import Batch
from orchestrator.worker.drain import Drain, hand_back
from orchestrator.worker.inprocess import InProcess, runs_in_process, runs_on_loop
from orchestrator.worker.local_queue import HELD_SECONDS, LocalQueue
from orchestrator.worker.pool import Pool, Slot
from orchestrator.worker.sensor_checks import SensorChecks
from orchestrator.worker.wakeup import Wakeup

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# A claim that came back short while due work remained (rows another worker held, beyond the
# candidates it looked at): look again after this.
RECHECK_SECONDS = 0.005


class Worker(Role):
    """The worker role. Each tick takes named steps: end the tasks past their timeout, start or
    finish a drain, recycle children, record outcomes and claim work in one transaction, resize
    the pool, and send the heartbeat when it is due."""

    role = "worker"

    def __init__(self, queues: list[str], concurrency: int = 4, grace: float = 30.0, poll: float | None = None,
                 name: str | None = None, max_tasks_per_child: int | None = None, min_children: int | None = None,
                 inprocess: int = 0):
        if not queues:
            raise ValueError("a worker needs at least one queue (--queues default,batch)")
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if max_tasks_per_child is None:
            max_tasks_per_child = app_settings.WORKER_MAX_TASKS_PER_CHILD
        if max_tasks_per_child < 0:
            raise ValueError(f"--max-tasks-per-child must be 0 (never) or more, got {max_tasks_per_child}")
        if min_children is None:
            min_children = app_settings.WORKER_MIN_CHILDREN
        if min_children < 0:
            raise ValueError(f"--min-children must be 0 (all: a fixed pool) or more, got {min_children}")
        if inprocess < 0:
            raise ValueError(f"--inprocess must be 0 (none: every job in a forked child) or more, got {inprocess}")
        self.queues = queues
        # Queue channels: work of these queues became due (claimed here when no limit applies to it)
        # or was admitted under a limit; the due channel: work became due in queues not looked up;
        # the fleet channel: a worker came or went (whose turn a notification is changed).
        self.queue_channels = {queue_channel(q) for q in queues}
        self.channels = [*sorted(self.queue_channels), DUE_CHANNEL, CANCEL_CHANNEL, CODE_CHANNEL, FLEET_CHANNEL]
        self.concurrency = concurrency
        self.poll = poll if poll is not None else app_settings.POLL_SECONDS
        self.heartbeat_every = app_settings.HEARTBEAT_SECONDS
        self.host = socket.gethostname()
        # Unique per process even with --name: a restarted worker must not collide with its
        # previous row (kept as history).
        self.name = f"{name or self.host}:{os.getpid()}:{os.urandom(3).hex()}"
        self.id: int | None = None
        self.loop: Loop | None = None
        self.pool = Pool(concurrency=concurrency, min_children=min_children,
                         idle_seconds=app_settings.WORKER_CHILD_IDLE_SECONDS, max_tasks_per_child=max_tasks_per_child,
                         on_reply=self.child_replied, on_died=self.child_died, on_returned=self.returned)
        # Places for the jobs declared @job(executor="async"/"thread"), in one host process
        # (worker.inprocess); with none, such jobs run in forked children like any other.
        self.inprocess = InProcess(places=inprocess, on_reply=self.child_replied, on_died=self.child_died)
        # Claimed jobs that wait for a child or a place of the host (worker.local_queue): claimed
        # ahead, or claimed for one kind of place while they run in the other (a claim cannot tell
        # a default job from an in-process one).
        self.held = LocalQueue()
        # Whether the latest claim found more due than it took (see Pool.ahead).
        self.backlog = False
        # The share of in-process jobs among the latest claims (a moving average): how many of the
        # free in-process places a claim offers (see capacity).
        self.inprocess_share = 0.0
        self.batch = Batch(queues, self.poll)
        self.drain = Drain(grace, self.pool, self.batch, self.inprocess)
        self.want_claim = True
        self.last_claim = 0.0
        # Which notifications this worker answers, its back-off, its poll turns (worker.wakeup).
        self.wakeup = Wakeup(concurrency, self.poll)
        self.next_poll = 0.0  # time.monotonic() of the next look unasked
        # When due work this worker may claim itself is next due (time.monotonic(); inf: none known):
        # a delayed job, a retry, or work held by another worker's claim a moment ago.
        self.next_due = float("inf")
        # Waiting sensors' checks: claimed in the batches, given to children many at a time.
        self.checks = SensorChecks(self.pool, concurrency)
        self.next_heartbeat = 0.0

    # --- lifecycle -----------------------------------------------------------------------------

    def serve(self, max_seconds: float | None = None) -> None:
        Loop(self, poll=self.poll, max_seconds=max_seconds).run()

    def start(self, loop: Loop) -> None:
        self.loop = loop
        if self.id is None:
            self.register()
        forking = not self.pool.slots  # a start again after an outage keeps its children
        if forking:
            reload.snapshot()  # what the children inherit, to tell later what changed on disk
        self.pool.start(loop)
        self.inprocess.start(loop, self.pool.generation)
        if forking:
            log.info("worker %s started: queues %s, concurrency %d (%d child process(es) forked ahead)%s", self.name,
                     ",".join(self.queues), self.concurrency, self.pool.min_children,
                     (f", max {self.pool.max_tasks_per_child} tasks per child" if self.pool.max_tasks_per_child else "")
                     + (f", {self.inprocess.places} in-process places" if self.inprocess.places else ""),
                     extra={"action": "worker_start"})
            declared = registry.in_process_refs()
            if declared and not self.inprocess.places:
                log.info("%d job(s) declared for the async or thread executor (%s) run in forked children here: "
                         "start the worker with --inprocess N to run them in-process", len(declared),
                         ", ".join(declared[:5]) + (", ..." if len(declared) > 5 else ""),
                         extra={"action": "worker_no_inprocess"})
        self.next_heartbeat = time.monotonic() + self.heartbeat_every

    def register(self) -> None:
        self.id, self.pool.generation = heartbeat.register(self.name, self.host, self.queues, self.concurrency)
        self.batch.worker_id = self.id
        self.wakeup.stale = True

    def stop(self) -> None:
        """On the way out: idle children exit, busy ones (only after a failed hand-back) are
        killed, and the worker's row says it stopped."""
        if self.loop is None:
            return
        self.pool.close()
        self.inprocess.close()
        tracing.flush()
        if self.id is not None:
            try:
                self.batch.settle()  # else the reaper settles those maps (reaper.SETTLE_MAPS)
                heartbeat.set_state(self.id, WorkerState.STOPPED, stopped=True)
            except DATABASE_ERRORS as exc:
                # The row keeps its old heartbeat: the reaper marks it lost and rescues its attempts.
                log.warning("could not mark worker %s stopped (%s)", self.name, first_line(exc),
                            extra={"action": "worker_db_error"})
        log.info("worker %s stopped after %d task runs (%d waiting sensors' checks in %d batches)", self.name,
                 self.batch.completed, self.checks.run, self.checks.batches,
                 extra={"action": "worker_stop", "checks": self.checks.run, "check_batches": self.checks.batches})

    def finished(self, stop_requests: int) -> bool:
        return self.drain.done

    # --- the tick: named steps -----------------------------------------------------------------

    def tick(self) -> bool:
        now = time.monotonic()
        self.end_overdue_tasks(now)
        if self.loop.stop_requests and not self.drain.active:
            self.drain.begin(now)
            self.drain.interrupted += self.held.clear() + self.pool.take_back_all()  # never started: handed back
            self.batch.release_checks(self.checks.release())  # claimed, not started: due again for any worker
        if self.drain.active:
            if self.pool.retiring:
                self.pool.reap_retired(now)
            return self.drain.step(now, self.loop.stop_requests)
        self.pool.recycle(now)
        self.inprocess.recycle(self.pool.generation)
        self.pool.take_back_stuck(now)
        self.start_held()
        self.hand_back_held(now)
        if self.wakeup.stale:
            self.wakeup.refresh(self.id, self.queues)
            self.plan_poll(now, keep_sooner=True)
        did = self.record_and_claim(now)
        self.resize_pool(now)
        self.heartbeat_if_due(now)
        return did

    def next_wait(self) -> float:
        """Until the heartbeat, the poll, a task's deadline, the end of the grace period, a run
        start to write, or the end of the short hold that batches outcomes, whichever is first."""
        now = time.monotonic()
        timeout = self.next_heartbeat - now
        if self.drain.active:
            timeout = min(timeout, self.drain.deadline - now)
        else:
            timeout = min(timeout, self.next_poll - now, self.next_due - now)
            if self.wakeup.owed or self.wakeup.everyone:
                timeout = min(timeout, self.wakeup.quiet_until - now)  # the end of the back-off
        deadlines = self.pool.deadlines(shrinking=not self.drain.active) + self.inprocess.deadlines()
        if self.held.since and not self.drain.active:
            deadlines.append(self.held_since() + HELD_SECONDS)
        if self.batch.starts and (self.drain.active or not self.batch.starts_due(now)):
            deadlines.append(self.batch.starts_due_at())  # a run start to write (worker.batch.RUN_STARTS)
        if deadlines:
            timeout = min(timeout, min(deadlines) - now)
        checks = None if self.drain.active else self.checks.wait(now)
        if checks is not None:
            timeout = min(timeout, checks)
        asked = self.want_claim or self.wakeup.asked(now)
        due = self.batch.endings or self.batch.starts_due(now) or (asked and self.capacity())
        if due and not self.drain.active:
            timeout = min(timeout, self.batch.hold_until(self.queue_full(now)) - now) if self.holding(now) else 0.0
        return max(0.0, timeout)

    def end_overdue_tasks(self, now: float) -> None:
        for message in self.pool.overdue(now):
            if "checks" in message:
                for ending in sensor_checks.ended(message, AttemptOutcome.TIMED_OUT, f"timed out after "
                                                  f"{message['timeout']:g}s: the batch of checks it was in outlived "
                                                  "its time and its process was killed"):
                    self.batch.add(ending)
                continue
            self.batch.add(Ending(
                message["id"], message["number"], AttemptOutcome.TIMED_OUT,
                error=f"timed out after {message['timeout']:g}s: the task's process was killed",
                log_path=logs.written_name(message["run_id"], message["id"], message["number"]), run_id=message["run_id"],
            ))
        for message in self.inprocess.overdue(now):
            how = "the job was cancelled" if runs_on_loop(message) else \
                "a thread cannot be stopped: the in-process executor is replaced once its other jobs end"
            self.batch.add(Ending(
                message["id"], message["number"], AttemptOutcome.TIMED_OUT,
                error=f"timed out after {message['timeout']:g}s: {how}",
                log_path=logs.written_name(message["run_id"], message["id"], message["number"]),
                run_id=message["run_id"],
            ))

    def capacity(self) -> int:
        """How many task runs a claim may take now: one per ready idle child (and per job it may
        claim ahead) not promised to a job held or sent ahead to a child, and, while no job waits for a child beyond those,
        as many of the places one claim may fill (``InProcess.offer``, less those promised to held
        jobs) as the share of in-process jobs among the latest claims says (at least one, to find
        them). A claim cannot choose the executor of what it takes, and a job claimed for the other
        kind of place waits for its own (worker.local_queue): a worker of default jobs only offers
        one place per claim and holds at most one job beyond its children; one of in-process jobs
        only soon offers all it may (half its places) and claims nothing for its children while
        one of them waits for a place."""
        ahead = self.prefetch()
        free_children = max(0, len(self.pool.idle_slots()) + ahead - len(self.held) - self.pool.queued_count())
        waiting = len(self.held.for_host)
        free = 0 if self.held.for_children() > ahead else max(0, self.inprocess.offer() - waiting)
        return free_children + (max(1, round(free * self.inprocess_share)) if free else 0)

    def prefetch(self) -> int:
        """How many task runs a claim may take beyond the idle children (``Pool.ahead``): none
        unless the backlog is deep and tasks are short."""
        return self.pool.ahead() * self.concurrency if self.backlog else 0

    def queue_full(self, now: float) -> bool:
        """Whether every child has a job waiting for it and no notification asks for new work (it
        may outrank them): the batches may then wait longer."""
        return self.held.for_children() >= self.concurrency and not self.wakeup.asked(now)

    def start_held(self) -> None:
        """Give the held jobs the children and the host's places that became free."""
        if not self.held:
            return
        idle = self.pool.idle_slots()
        sizes = self.pool.batch_sizes(idle, self.held.for_children())  # one each, or several while tasks are short
        children, host = self.held.take(sum(sizes), self.inprocess.free())
        self.pool.start_batches(idle, sizes, children)
        if host:
            self.inprocess.run(host)

    def hand_back_held(self, now: float) -> None:
        """Hand back the jobs claimed ahead that waited HELD_SECONDS while nothing of this worker
        ended (not those claimed for a place that wait for the other kind: no bet on short tasks
        there)."""
        stale = self.held.stale(now, max(self.pool.last_reply, self.inprocess.last_reply))
        if not stale:
            return
        self.pool.task_seconds = None  # nothing claimed ahead until tasks are seen to be short again
        self.batch.handed_back(stale)
        log.info("handing back %d job(s) claimed ahead: this worker's children stayed busy for %gs", len(stale),
                 HELD_SECONDS, extra={"action": "worker_hand_back_held"})
        hand_back(stale, f"handed back: claimed ahead for a child of this worker, it waited {HELD_SECONDS:g}s "
                         "without one; it never started and runs again without counting this attempt",
                  worker_id=self.id, queues=self.queues)

    def held_since(self) -> float:
        """Since when the local queue has not moved (LocalQueue.waited_since)."""
        return self.held.waited_since(max(self.pool.last_reply, self.inprocess.last_reply))

    def place(self, claimed: list[dict]) -> None:
        """Start each claimed task run where it runs: a job declared for the in-process executor
        in the host when the worker has places for it (held until one is free), everything else in
        an idle child, or held until one is free; held in rank order with those held already."""
        if claimed and self.inprocess.places:
            share = sum(1 for message in claimed if runs_in_process(message)) / len(claimed)
            self.inprocess_share = (self.inprocess_share + share) / 2
        now = time.monotonic()
        ahead = self.prefetch() > 0 and all(slot.ready for slot in self.pool.slots)  # not a child starting
        for message in claimed:
            host = bool(self.inprocess.places) and runs_in_process(message)
            self.held.add(message, host=host, began=now if ahead else None)
        if claimed:
            self.pool.take_back_outranked(min(message.get("rank", (0, 0)) for message in claimed))
        self.start_held()

    def holding(self, now: float) -> bool:
        """Whether the next batch waits: the latest one began less than its hold ago (Batch) and
        other children still run (their outcomes will join it; with none running, none would).
        Work a notification announced for a free place never waits: that is its start delay."""
        if self.drain.active or not self.batch.coalescing(now, self.queue_full(now)):
            return False
        if not self.pool.busy_count() and not self.inprocess.busy_count():
            return False
        return self.want_claim or not self.wakeup.asked(now) or not self.capacity()

    def record_and_claim(self, now: float) -> bool:
        """Record the outcomes gathered so far and refill the idle children, in one transaction.
        Outcomes wait a few milliseconds for their neighbours while other tasks still run, so one
        transaction records many of them (and refills all the freed children).

        A claim fills every idle child when the worker looks unasked (its poll turn, a known due
        time, after an outage, while more is due after a full batch); to answer a notification it
        fills only the places the notification named (``worker.wakeup``), or every idle child when
        it named all."""
        if now >= self.next_poll or now >= self.next_due:
            self.want_claim = True
            self.next_due = float("inf")
        # Checks claimed before go to the children that may take them first (no transaction needed);
        # the claim then counts the children still idle.
        started = bool(self.checks.claimed) and self.checks.start()
        claim, answering, checks = self.claim_sizes(now)
        if not (self.batch.endings or claim or checks or self.batch.starts_due(now)) or self.holding(now):
            return started
        began = time.monotonic()
        claimed = self.batch.flush(claim, checks)
        if self.inprocess.places:
            self.inprocess.batch_took(time.monotonic() - began)
        if claim and self.batch.claimed_generation not in (None, self.pool.generation):
            # A sync committed before this claim, its NOTIFY not here yet: fresh children run it.
            self.pool.saw_generation(self.batch.claimed_generation, read=True)
            self.pool.recycle(now)
            self.inprocess.recycle(self.pool.generation)
        ordinary = [m for m in claimed if "check" not in m]
        self.checks.claimed += [m for m in claimed if "check" in m]
        if checks:
            self.checks.after_claim(now, len(claimed) - len(ordinary), checks, self.batch.checks_next_due)
        if claim:
            self.last_claim = now
            self.after_claim(now, claim, len(ordinary), answering)
            self.place(ordinary)
        self.checks.start()
        self.batch.settle()  # maps another transaction held at the batch: now the work has started
        return True

    def claim_sizes(self, now: float) -> tuple[int, bool, int]:
        """How many task runs to claim (and whether that answers a notification), and how many
        sensor checks."""
        capacity = self.capacity()
        answering = not self.want_claim and self.wakeup.asked(now)
        claim = capacity if self.want_claim else self.wakeup.claim_size(capacity) if answering else 0
        return claim, answering, self.checks.to_claim(now, self.want_claim)

    def after_claim(self, now: float, asked: int, claimed: int, answering: bool) -> None:
        """What the claim's answer says about what comes next. The claim also read when the rest
        of the due work of these queues is due (``batch.claimed_next_due``): none, later, or now."""
        next_due = self.batch.claimed_next_due
        wait = None if next_due is None else (next_due - clock.now()).total_seconds()
        due_now = wait is not None and wait <= 0
        # Full, and more is due: claim again at once, unless the notification answered named only
        # this worker's places (the rest is other workers' turn).
        self.want_claim = claimed == asked and due_now and (not answering or self.wakeup.more)
        self.backlog = claimed == asked and due_now
        self.wakeup.after_claim(asked, claimed, now, answering=answering, due_now=due_now,
                                later=wait is not None and wait > 0)
        if wait is not None and wait > 0:
            self.next_due = now + wait  # the next due work (a delayed job, a retry)
        elif due_now and claimed < asked and (claimed or not answering):
            # Due rows past the candidates this claim read, or held by other workers' claims in
            # flight: a backlog; look again soon. A look of its own that found none (the rows it
            # read were held) looks again after the back-off (``worker.wakeup``), since the rows
            # past them are nobody's: it would otherwise sit idle beside a backlog until its poll.
            # An answer to a notification that found none leaves them to their holders (and what
            # it owes to the back-off): a fleet that claimed again at once would claim as often as
            # it has workers.
            self.next_due = now + (RECHECK_SECONDS if claimed else self.wakeup.backoff.next())
        # An answer to a notification looked at what it named, not at the queue: the next poll
        # stays where it was (answers every 50 ms would otherwise push it on forever).
        self.plan_poll(now, keep_sooner=answering)

    def plan_poll(self, now: float, keep_sooner: bool = False) -> None:
        """When to look for work unasked: a poll interval after the latest claim, or, while
        listening, at this worker's next turn (``worker.wakeup``).

        ``keep_sooner``: the rings were read again (a heartbeat, a worker came or went), not a
        claim made; a poll already planned (or due) before the new turn stays. Without it, a
        heartbeat at least as frequent as the poll interval would push the poll one turn further
        at every beat, and a row whose notification was missed would never be looked for."""
        listening = self.loop is not None and self.loop.listener is not None
        planned = self.wakeup.next_poll(now, self.last_claim, listening)
        self.next_poll = min(self.next_poll, planned) if keep_sooner else planned

    def resize_pool(self, now: float) -> None:
        """Grow when work waits and no child is free; shrink to the minimum after idling."""
        if self.held.for_children() > self.prefetch():
            self.pool.grow(self.held.for_children() + len(self.pool.idle_slots()))
            return
        room = self.pool.room_to_grow() if self.want_claim or self.wakeup.asked(now) else 0
        if room:
            waiting = self.batch.waiting(room)
            self.pool.grow(waiting)
            if not waiting:
                self.want_claim = False  # nothing to claim until a NOTIFY or the next poll
            return
        self.pool.shrink(now)

    def heartbeat_if_due(self, now: float) -> None:
        if now >= self.next_heartbeat:
            self.heartbeat()
            self.next_heartbeat = now + self.heartbeat_every

    def claim(self, n: int, now) -> list[dict]:
        """Claim up to ``n`` task runs (in the caller's transaction): their messages."""
        return self.batch.claim(n, now)

    def reconnected(self) -> None:
        """After a database outage: reconcile what this worker runs with what the database says
        (``worker.reconnect``), then look for work at once (NOTIFYs sent during the outage were
        lost)."""
        reconnect.reconcile(self.pool, self.batch, self.drain, also={message["id"] for message in self.elsewhere()})
        self.want_claim = True
        self.wakeup.stale = True  # workers may have come and gone meanwhile

    # --- what the children and the notifications tell ------------------------------------------

    def child_replied(self, message: dict, reply: tuple) -> None:
        # (task_run_id, number, outcome, result, error, traceback, log, metadata, exception class)
        spec = message.get("spec", {})
        job = spec.get("call") == "job"
        answers = sensor_checks.replies(message, reply) if "checks" in message else \
            [(message, Ending(*reply, job=job, run_id=message["run_id"], unlocked=settles_later(message),
                              plain=job and "callbacks" not in spec and "produces" not in spec))]
        for answered, ending in answers:
            self.batch.add(ending)
            self.checks.answered(answered, ending)

    def returned(self, messages: list[dict]) -> None:
        """Jobs sent ahead to a child and taken back before they began: they wait again for a
        child (a drain hands them back)."""
        if self.drain.active:
            self.drain.interrupted += messages
            return
        now = time.monotonic()
        for message in messages:
            self.held.add(message, began=now)

    def child_died(self, message: dict, how: str) -> None:
        if "checks" in message:
            for ending in sensor_checks.ended(message, AttemptOutcome.FAILED, f"the checks' process ended unexpectedly ({how})"):
                self.batch.add(ending)
            return
        self.batch.add(Ending(message["id"], message["number"], AttemptOutcome.FAILED, run_id=message["run_id"],
                              error=f"the task's process ended unexpectedly ({how})", unlocked=settles_later(message)))

    def notified(self, notifies: list) -> bool:
        """Take in the notifications; False when none of them calls for a tick (work that other
        workers' turn it is to claim: this worker stays asleep)."""
        tick = False
        for note in notifies:
            if note.channel in self.queue_channels or note.channel == DUE_CHANNEL:
                self.wakeup.notified(note.channel, note.payload)
                tick = tick or self.wakeup.owed > 0 or self.wakeup.everyone
                continue
            tick = True
            if note.channel == CODE_CHANNEL:
                if note.payload.isdigit():
                    self.pool.saw_generation(int(note.payload))
            elif note.channel == FLEET_CHANNEL:
                self.wakeup.stale = True
            elif note.channel != CANCEL_CHANNEL:
                self.want_claim = True
            elif not note.payload:
                self.check_ownership()
            else:
                self.on_cancelled(note.payload)
        return tick

    def on_cancelled(self, payload: str) -> None:
        try:
            ids = set(json.loads(payload))
        except ValueError:
            return
        self.pool.take_back_ids(ids)  # those a child has not begun wait here again, to be dropped
        for slot in self.pool.busy():
            if slot.message["id"] in ids:
                self.abandon(slot, "cancelled")
        for message in self.inprocess.messages() + self.held.jobs:
            if message["id"] in ids:
                self.give_up(message, "cancelled")

    def give_up(self, message: dict, why: str) -> None:
        """Stop a job of the in-process executor, or drop a held one, whose attempt is no longer
        this worker's (cancelled or reaped)."""
        log.info("stopping task run %s attempt %s: %s", message["id"], message["number"], why,
                 extra={"action": "task_killed"})
        if self.held.remove(message["id"]) is None:
            self.inprocess.give_up(message["id"])
        self.batch.forget(message["id"])

    def abandon(self, slot: Slot, why: str) -> None:
        """Kill a task whose attempt is no longer this worker's (cancelled or reaped)."""
        message = slot.message
        log.info("killing task run %s attempt %s: %s", message["id"], message["number"], why,
                 extra={"action": "task_killed"})
        self.pool.abandon(slot)
        self.batch.forget(message["id"])

    def heartbeat(self) -> None:
        generation, rings = heartbeat.beat(self.id, self.queues)
        self.pool.saw_generation(generation, read=True)
        self.wakeup.rings = rings
        self.plan_poll(time.monotonic(), keep_sooner=True)
        self.check_ownership()

    def check_ownership(self) -> None:
        """Kill the tasks whose attempts are no longer this worker's (cancelled or reaped)."""
        # A batch of checks is no attempt: a check claimed again meanwhile is recorded once anyway.
        busy = [slot for slot in self.pool.busy() if "checks" not in slot.message]
        elsewhere = self.elsewhere()
        if not busy and not elsewhere:
            return
        mine = heartbeat.still_mine(self.id, [slot.message for slot in busy] + elsewhere)
        self.pool.take_back_ids({message["id"] for message in elsewhere if message["id"] not in mine})
        busy = [slot for slot in self.pool.busy() if "checks" not in slot.message]
        elsewhere = self.inprocess.messages() + self.held.jobs
        for slot in busy:
            if slot.message["id"] not in mine:
                self.abandon(slot, "its attempt was cancelled or reaped")
        for message in elsewhere:
            if message["id"] not in mine:
                self.give_up(message, "its attempt was cancelled or reaped")

    def elsewhere(self) -> list[dict]:
        """The jobs of this worker not run by a child now: in the host, held, or sent to a child
        behind its task."""
        return self.inprocess.messages() + self.held.jobs + self.pool.queued()
