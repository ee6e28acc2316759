"""The worker's child processes: a slot per child, forked ahead, given one task at a time, and
replaced, retired or killed. No database: how much work waits is the caller's to tell
(``grow``), and how children are made and ended is a ``Children`` (forked processes for real,
fakes in tests).

The pool is elastic: it starts with ``min_children`` children, forks more (up to
``concurrency``) when work waits and no child is free, and lets a child above the minimum that
idled ``idle_seconds`` exit, so an idle worker holds little memory.

While tasks are short and work waits, a child is sent several at once (``start_tasks``, see
SENT_AHEAD_SECONDS): it runs them one after the other and wakes once for them all. What it has
not begun yet is taken back (``worker.gate``) when its running task turns out slow, a job claimed
later outranks it, it is cancelled, or a drain or a sync calls for it.

Children are recycled, never while they run a task: after a sync (a new code generation, see
``orchestrator.reload``) every idle child is replaced at once and every busy one when its task
ends, and a child that ran ``max_tasks_per_child`` tasks is replaced once its outcome is in. A
recycled child is told to exit (and killed if it has not within ``RETIRE_SECONDS``); a fresh
fork runs the code now on disk.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Pipe

from django.db import connections

from orchestrator import executor, reload
from orchestrator.worker.gate import Gate

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# How long a recycled (or, at shutdown, an idle) child has to exit once told to, before it is
# killed: an idle child exits at once, unless it is still importing the job modules again.
RETIRE_SECONDS = 5.0

# A local queue (graphile-worker's localQueue): while the backlog is deep (the latest claim got
# all it asked for and more was due at once) and tasks are short (PREFETCH_TASK_SECONDS or less
# on average), a claim also takes task runs beyond the idle children: about PREFETCH_SECONDS of
# work per child, at most PREFETCH_PER_CHILD (``Pool.ahead``). They wait in the worker
# (worker.local_queue: claimed, their attempt begun) and start the moment a child replies, without
# waiting for a transaction; the batches meanwhile wait longer for their outcomes (batch.
# QUEUED_COALESCE_SECONDS), so each records and claims many. Order holds: a claim takes work in
# dispatch order (priority, tenants in turn, live lane first), a job a later claim took goes ahead
# of the held ones it outranks (``LocalQueue.add``), and what waits here is a few tens of
# milliseconds of work. The cap keeps each claim short (one of 512 took 23 ms on two cores), since
# a job that outranks the rest waits for the worker's batch in flight: at most 8, a priority job's
# start delay behind a deep backlog was 35-50 ms at p99; at most 32, 94-156 ms (bench --only
# backlog). A drain hands the held jobs back at once, and so does a wait of HELD_SECONDS
# (worker.local_queue); the reaper's margin (HEARTBEAT_TIMEOUT_SECONDS or more) is far beyond both.
PREFETCH_PER_CHILD = 8
PREFETCH_TASK_SECONDS = 0.05
PREFETCH_SECONDS = 0.06

# The weight of the latest task in ``Pool.task_seconds``, a moving average of how long tasks take.
TASK_SECONDS_WEIGHT = 0.1

# While jobs are claimed ahead (PREFETCH_PER_CHILD), an idle child is sent about this much work at
# once (at most PREFETCH_PER_CHILD jobs, at the moving average of task times), and a share of what
# waits: it runs them one after the other without a round trip to the worker between them. A
# child woken per job cost 0.14-0.23 s of CPU per 1,000 no-op jobs, one sent them in batches
# 0.07-0.09 (bench --only statements, forked default: 4,482-5,205 jobs/s against 3,035-4,336).
# What a child has not begun is taken back when its running task has run TAKE_BACK_SECONDS (it
# is not short after all: the rest goes to other children), and when a job claimed later
# outranks it. What children were sent ahead counts as claimed ahead (worker.role.capacity).
SENT_AHEAD_SECONDS = 0.02
TAKE_BACK_SECONDS = 0.1


@dataclass
class Slot:
    pid: int
    conn: object
    message: dict | None = None
    deadline: float | None = None
    started: float = 0.0
    extra: dict = field(default_factory=dict)
    generation: int = 0  # the code generation the child was forked in
    tasks: int = 0  # tasks it completed
    ready: bool = False  # it said it is ready (set up, code read): only then is it given a task
    idle_since: float = 0.0
    gate: Gate | None = None  # what it has begun of a batch (None: it is given one task at a time)
    batch: int = 0  # the number of the batch it runs (0: a single task)
    replied: int = 0  # outcomes of that batch received
    queued: list = field(default_factory=list)  # sent with its task, not known to have begun, in order


class ForkedChildren:
    """Children as forked processes, each running ``main(conn, parent_pid)`` (``executor.child_main``
    by default) in its own process group."""

    def __init__(self, main: Callable[[object, int], None] | None = None):
        self.main = main or executor.child_main

    def fork(self, gate: Gate | None = None) -> tuple[int, object]:
        # Django's connection is closed before forking: a child must not share its socket (its
        # exit would otherwise end the parent's session). The LISTEN connection stays referenced
        # by the loop in the child, which never closes it and leaves with os._exit().
        connections.close_all()
        parent_conn, child_conn = Pipe(duplex=True)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent_conn.close()
            if gate is None:
                self.main(child_conn, parent)
            else:
                self.main(child_conn, parent, gate=gate)
        child_conn.close()
        return pid, parent_conn

    def kill(self, pid: int) -> None:
        """SIGKILL the child's process group and reap it."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def exited(self, pid: int) -> bool:
        """Whether the child has exited (and is reaped now: no zombie)."""
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return True

    def how_it_ended(self, pid: int) -> str:
        """How a child that broke its pipe ended (reaped now, if it has)."""
        status = None
        try:
            _, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if status and os.WIFSIGNALED(status):
            return f"signal {os.WTERMSIG(status)}"
        return f"exit code {os.WEXITSTATUS(status)}" if status else "an unknown cause"


class Pool:
    """The slots of one worker's children. ``on_reply(message, reply)`` hears a task's outcome
    from its child, ``on_died(message, how)`` that a child died while running one."""

    def __init__(self, *, concurrency: int, min_children: int, idle_seconds: float, max_tasks_per_child: int,
                 on_reply: Callable[[dict, tuple], None], on_died: Callable[[dict, str], None],
                 on_returned: Callable[[list[dict]], None] = lambda messages: None,
                 children: ForkedChildren | None = None, gated: bool = True):
        self.concurrency = concurrency
        # How long the latest tasks took in their children, a moving average (seconds); None until
        # a task ended (no evidence yet that tasks are short, see PREFETCH_PER_CHILD).
        self.task_seconds: float | None = None
        self.last_reply = 0.0  # time.monotonic() of the latest task outcome from a child
        self.min_children = min(min_children or concurrency, concurrency)
        self.idle_seconds = idle_seconds
        self.max_tasks_per_child = max_tasks_per_child
        self.on_reply, self.on_died = on_reply, on_died
        self.on_returned = on_returned  # hears of the tasks sent ahead to a child and taken back
        self.children = children or ForkedChildren()
        self.gated = gated  # children may be sent several tasks at once (a Gate each)
        self.batches = 0  # batches sent: their numbers
        self.generation = 0  # the code generation new children are forked in
        self.slots: list[Slot] = []
        self.retiring: list[tuple[int, float]] = []  # (pid, kill after): recycled children told to exit
        self.loop = None  # what watches the children's pipes (orchestrator.loop.Loop)

    # --- what the pool holds -------------------------------------------------------------------

    def idle_slots(self) -> list[Slot]:
        """The children ready for a task (a child still starting gets none: the claim would wait)."""
        return [slot for slot in self.slots if slot.ready and slot.message is None]

    def busy(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.message is not None]

    def busy_count(self) -> int:
        return sum(1 for slot in self.slots if slot.message is not None)

    def ahead(self) -> int:
        """How many task runs claimed ahead keep a child busy for PREFETCH_SECONDS at the moving
        average of task times: at least one, at most PREFETCH_PER_CHILD; none before a task
        ended or while tasks take longer than PREFETCH_TASK_SECONDS."""
        if self.task_seconds is None or self.task_seconds > PREFETCH_TASK_SECONDS:
            return 0
        return max(1, min(PREFETCH_PER_CHILD, round(PREFETCH_SECONDS / max(self.task_seconds, 1e-6))))

    def deadlines(self, shrinking: bool = True) -> list[float]:
        """When the pool has something to do by itself (time.monotonic()): a task's timeout, a
        retired child's kill time and, when ``shrinking``, the next shrink."""
        deadlines = [slot.deadline for slot in self.slots if slot.deadline is not None]
        deadlines += [slot.started + TAKE_BACK_SECONDS for slot in self.slots if slot.queued]
        deadlines += [kill_after for _, kill_after in self.retiring]
        shrink = self.next_shrink() if shrinking else None
        if shrink is not None:
            deadlines.append(shrink)
        return deadlines

    # --- children ------------------------------------------------------------------------------

    def start(self, loop) -> None:
        """Fork the minimum, unless children are there already (a start again after an outage)."""
        self.loop = loop
        if not self.slots:
            self.slots = [self.fork() for _ in range(self.min_children)]

    def fork(self) -> Slot:
        gate = Gate() if self.gated else None
        pid, conn = self.children.fork(gate)
        slot = Slot(pid=pid, conn=conn, generation=self.generation, gate=gate)
        self.loop.watch(conn, lambda _conn, slot=slot: self.readable(slot))
        return slot

    def kill(self, slot: Slot) -> None:
        self.loop.unwatch(slot.conn)
        self.children.kill(slot.pid)
        slot.conn.close()
        left, slot.queued = slot.queued, []
        if left:
            # Sent behind its task and not taken back (the gate's lock could not be had, or their
            # outcomes were not read yet): those it had begun died with it, the rest never began.
            begun = max(0, (slot.gate.begun(slot.batch) or 0) - slot.replied - 1)
            for message in left[:begun]:
                self.on_died(message, "signal 9 (its process was killed while it ran another task)")
            if left[begun:]:
                self.on_returned(left[begun:])
        if slot.gate is not None:
            slot.gate.close()

    def replace(self, slot: Slot) -> None:
        self.kill(slot)
        self.slots[self.slots.index(slot)] = self.fork()

    def start_task(self, slot: Slot, message: dict) -> None:
        self.begin(slot, message)
        slot.batch, slot.queued = 0, []
        self.send(slot, message)

    def start_tasks(self, slot: Slot, messages: list[dict]) -> None:
        """Send an idle child these tasks at once (one message, one wake-up): it runs them in this
        order, each once the gate lets it begin (a single one goes as ``start_task`` sends it)."""
        if len(messages) == 1 or slot.gate is None:
            self.start_task(slot, messages[0])
            return
        self.batches += 1
        slot.batch, slot.replied, slot.queued = self.batches, 0, list(messages[1:])
        slot.gate.open(slot.batch, len(messages))
        self.begin(slot, messages[0])
        self.send(slot, {"batch": slot.batch, "jobs": messages})

    def begin(self, slot: Slot, message: dict) -> None:
        """The task the child runs now (as far as the worker knows): its timeout counts from here."""
        slot.message = message
        slot.started = time.monotonic()
        timeout = message.get("timeout")
        slot.deadline = slot.started + timeout if timeout else None

    def send(self, slot: Slot, message) -> None:
        try:
            slot.conn.send(message)
        except OSError:
            self.child_died(slot)

    def batch_sizes(self, idle: list[Slot], waiting: int) -> list[int]:
        """How many tasks each of these idle children is sent, out of ``waiting``: one each, or,
        while tasks are claimed ahead (``ahead``) and the children have gates, about
        SENT_AHEAD_SECONDS of work each, an even share of what waits at most (and no more than a
        child may still run before it is recycled)."""
        if not idle or not waiting:
            return [0] * len(idle)
        ahead = self.ahead()
        if not ahead or idle[0].gate is None:
            return [1 if at < waiting else 0 for at in range(len(idle))]
        per = min(ahead, max(1, round(SENT_AHEAD_SECONDS / max(self.task_seconds, 1e-6))),
                  -(-waiting // len(idle)))
        if self.max_tasks_per_child:
            return [max(1, min(per, self.max_tasks_per_child - slot.tasks)) for slot in idle]
        return [per] * len(idle)

    def start_batches(self, idle: list[Slot], sizes: list[int], messages: list[dict]) -> None:
        """Give these idle children the tasks, up to its size each, dealt in turn (the first ones,
        which rank highest, each to a different child, so they all begin now)."""
        parts: list[list[dict]] = [[] for _ in idle]
        at = 0
        for message in messages:
            while len(parts[at]) >= sizes[at]:
                at = (at + 1) % len(idle)
            parts[at].append(message)
            at = (at + 1) % len(idle)
        for slot, part in zip(idle, parts, strict=True):
            if part:
                self.start_tasks(slot, part)

    # --- taking back what a child has not begun ---------------------------------------------------

    def take_back(self, slot: Slot) -> list[dict]:
        """The tasks sent to this child that it has not begun, taken back (its gate lets it begin
        no more of them): theirs to run elsewhere. The child is idle afterwards if it had not
        begun the one the worker took for running (it was between two)."""
        if slot.gate is None or not slot.batch or slot.message is None:
            return []
        begun = slot.gate.take_back(slot.batch)
        if begun is None:
            return []
        pending = [slot.message, *slot.queued]
        first = max(0, begun - slot.replied)  # of pending, the first not begun
        back = pending[first:]
        slot.queued = pending[1:first]
        if first == 0:
            slot.message = slot.deadline = None
            slot.idle_since = time.monotonic()
        return back

    def take_back_where(self, wanted: Callable[[Slot], bool]) -> None:
        """Take back what the children for which ``wanted`` holds have not begun (on_returned)."""
        for slot in self.slots:
            if slot.queued and wanted(slot):
                back = self.take_back(slot)
                if back:
                    self.on_returned(back)

    def take_back_stuck(self, now: float) -> None:
        """What waits behind a task that has run TAKE_BACK_SECONDS goes back to the worker."""
        self.take_back_where(lambda slot: now >= slot.started + TAKE_BACK_SECONDS)

    def take_back_outranked(self, rank: tuple) -> None:
        """What waits in a child behind a job of this rank (a later claim's, in the local queue)
        goes back, so that job goes first."""
        self.take_back_where(lambda slot: any(message.get("rank", (0, 0)) > rank for message in slot.queued))

    def take_back_ids(self, ids: set[int]) -> None:
        """Take back from the children what they have not begun, where one of these tasks is."""
        self.take_back_where(lambda slot: any(message["id"] in ids for message in slot.queued))

    def take_back_all(self) -> list[dict]:
        """Everything the children have not begun (a drain hands it back)."""
        back = []
        for slot in self.slots:
            back += self.take_back(slot)
        return back

    def queued(self) -> list[dict]:
        """The tasks sent to children and not known to have begun."""
        return [message for slot in self.slots for message in slot.queued]

    def queued_count(self) -> int:
        return sum(len(slot.queued) for slot in self.slots)

    def readable(self, slot: Slot) -> None:
        """The child wrote: that it is ready (its first message), or the outcome of its task."""
        try:
            reply = slot.conn.recv()
        except (EOFError, OSError):
            self.child_died(slot)
            return
        if not slot.ready:  # its first message: set up and ready for a task
            slot.ready = True
            slot.idle_since = time.monotonic()
            return
        message = slot.message
        slot.message = None
        slot.deadline = None
        slot.tasks += 1
        slot.idle_since = self.last_reply = time.monotonic()
        took = slot.idle_since - slot.started
        self.task_seconds = took if self.task_seconds is None else \
            self.task_seconds + TASK_SECONDS_WEIGHT * (took - self.task_seconds)
        if slot.queued:  # the child goes on with the next task of its batch
            slot.replied += 1
            self.begin(slot, slot.queued.pop(0))
        self.on_reply(message, reply)

    def child_died(self, slot: Slot) -> None:
        message, back = slot.message, slot.queued
        if message is not None and slot.batch and slot.gate.begun(slot.batch) == slot.replied:
            message, back = None, [message, *back]  # it died between two tasks: the next one never began
        how = self.children.how_it_ended(slot.pid)
        if message is not None:
            self.on_died(message, how)
        slot.message, slot.queued = None, []
        self.replace(slot)
        if back:
            self.on_returned(back)

    def overdue(self, now: float) -> list[dict]:
        """Kill and replace the children whose task outlived its timeout: those tasks' messages
        (what such a child had not begun goes back, on_returned)."""
        messages = []
        for slot in list(self.slots):
            if slot.deadline is not None and now >= slot.deadline:
                back = self.take_back(slot)
                if slot.message is not None:
                    messages.append(slot.message)
                    slot.message = None
                    self.replace(slot)
                if back:
                    self.on_returned(back)
        return messages

    def abandon(self, slot: Slot) -> None:
        """Kill the child's task (no longer this worker's) and replace the child; what it had not
        begun goes back (on_returned). A task it had not begun is only dropped."""
        back = self.take_back(slot)
        if slot.message is None:
            back = back[1:]  # the abandoned task had not begun: the child lives on
        else:
            slot.message = None
            slot.deadline = None
            self.replace(slot)
        if back:
            self.on_returned(back)

    def interrupt(self) -> list[dict]:
        """Kill every child that runs a task, without replacing it: those tasks' messages, and
        those of the tasks they had not begun."""
        messages = []
        for slot in self.busy():
            messages += self.take_back(slot)
            if slot.message is None:
                continue
            messages += [slot.message, *slot.queued]  # begun, their outcomes not read: handed back too
            slot.message, slot.queued = None, []
            slot.deadline = None
            self.kill(slot)
            self.slots.remove(slot)
        return messages

    def close(self) -> None:
        """On the way out: idle children exit (or are killed after RETIRE_SECONDS), busy ones are
        killed."""
        for slot in self.slots:
            if slot.message is None:
                try:
                    slot.conn.send(None)
                except OSError:
                    pass
        deadline = time.monotonic() + RETIRE_SECONDS
        for slot in self.slots:
            if slot.message is not None:
                self.kill(slot)
            else:
                self.wait_exit(slot.pid, deadline)
                slot.conn.close()
        for pid, _ in self.retiring:
            self.wait_exit(pid, deadline)
        self.retiring = []

    def wait_exit(self, pid: int, deadline: float) -> None:
        """Wait for a child told to exit, until ``deadline``; then kill it."""
        while not self.children.exited(pid):
            if time.monotonic() >= deadline:
                self.children.kill(pid)
                return
            time.sleep(0.01)

    # --- recycling -----------------------------------------------------------------------------

    def saw_generation(self, generation: int, *, read: bool = False) -> None:
        """A code generation from a NOTIFY (only a newer one counts: they may arrive late) or read
        from the database (``read``: whatever differs counts)."""
        if generation == self.generation or (not read and generation < self.generation):
            return
        self.generation = generation
        # What children of the older code have not begun runs in fresh ones.
        self.take_back_where(lambda slot: slot.generation != generation)
        log.info("code generation %d: replacing %d idle child process(es) now and %d busy one(s) when their "
                 "task ends", generation, len(self.slots) - self.busy_count(), self.busy_count(),
                 extra={"action": "worker_code_generation", "generation": generation})
        pinned = reload.needing_restart()
        if pinned:
            log.warning("changed on disk since this worker started, not picked up until it restarts: %s",
                        ", ".join(pinned[:20]) + (", ..." if len(pinned) > 20 else ""),
                        extra={"action": "worker_restart_needed"})

    def due_for_replacement(self, slot: Slot) -> bool:
        return slot.generation != self.generation or \
            bool(self.max_tasks_per_child and slot.tasks >= self.max_tasks_per_child)

    def recycle(self, now: float) -> None:
        """Replace the idle children forked in an older code generation or that ran their share of
        tasks; a busy child is left alone until its outcome is in. At most one fork per child."""
        for slot in list(self.slots):
            if slot.message is None and self.due_for_replacement(slot):
                self.retire(slot, now)
        if self.retiring:
            self.reap_retired(now)

    def retire(self, slot: Slot, now: float, replace: bool = True) -> None:
        self.loop.unwatch(slot.conn)
        try:
            slot.conn.send(None)  # "exit": the child leaves its loop (and closes its connections)
        except OSError:
            pass
        slot.conn.close()
        self.retiring.append((slot.pid, now + RETIRE_SECONDS))
        if replace:
            self.slots[self.slots.index(slot)] = self.fork()
        else:
            self.slots.remove(slot)

    def reap_retired(self, now: float) -> None:
        """Forget the retired children that exited; kill those past their time."""
        still = []
        for pid, kill_after in self.retiring:
            if self.children.exited(pid):
                continue
            if now >= kill_after:
                self.children.kill(pid)
                continue
            still.append((pid, kill_after))
        self.retiring = still

    # --- the elastic pool ----------------------------------------------------------------------

    def room_to_grow(self) -> int:
        """How many task runs waiting would make the pool fork more children: none (0) when it is
        full or a ready child is free, else the room left plus the children still starting."""
        free = [slot for slot in self.slots if slot.message is None]
        room = self.concurrency - len(self.slots)
        if room <= 0 or any(slot.ready for slot in free):
            return 0
        return room + len(free)

    def grow(self, waiting: int) -> None:
        """Fork a child for each waiting task run that no child still starting will take, up to the
        concurrency."""
        starting = sum(1 for slot in self.slots if slot.message is None)
        for _ in range(min(waiting - starting, self.concurrency - len(self.slots))):
            self.slots.append(self.fork())

    def shrink(self, now: float) -> None:
        """Let the children above the minimum that idled long enough exit, the longest idle first."""
        surplus = len(self.slots) - self.min_children
        if surplus > 0:
            free = [slot for slot in self.slots if slot.message is None]
            expired = [slot for slot in free if slot.ready and now - slot.idle_since >= self.idle_seconds]
            for slot in sorted(expired, key=lambda slot: slot.idle_since)[:surplus]:
                self.retire(slot, now, replace=False)

    def next_shrink(self) -> float | None:
        """When the longest-idle child above the minimum may exit."""
        if len(self.slots) <= self.min_children:
            return None
        idle = [slot.idle_since for slot in self.slots if slot.ready and slot.message is None]
        return min(idle) + self.idle_seconds if idle else None
