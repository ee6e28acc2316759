"""The in-process executors (``@job(executor="async"/"thread")``) without processes: the
decorator's checks, and where a worker places what it claimed (fake children and host, no
database). Their scenarios with real workers: tests/processes/test_executors_processes.py."""

from __future__ import annotations

import time

import pytest

from orchestrator.executor import READY
from orchestrator.registry import executor_of, job
from orchestrator.worker import Worker as WorkerRole
from orchestrator.worker.batch import COALESCE_SECONDS, QUEUED_COALESCE_SECONDS
from orchestrator.worker.inprocess import BATCH_SECONDS, CLAIM_LEAST
from orchestrator.worker.pool import PREFETCH_PER_CHILD, PREFETCH_SECONDS, PREFETCH_TASK_SECONDS
from tests.support import inprocess_jobs

REF = "tests.support.inprocess_jobs"


# --- the decorator ----------------------------------------------------------------------------


def test_the_async_executor_refuses_a_plain_function_at_definition():
    with pytest.raises(TypeError, match=r"executor='async'.*needs an 'async def' function.*plain_sync"):
        @job(executor="async")
        def plain_sync():
            pass


def test_the_thread_executor_refuses_an_async_function_at_definition():
    with pytest.raises(TypeError, match=r"executor='thread'.*coroutine_thread.*is 'async def'"):
        @job(executor="thread")
        async def coroutine_thread():
            pass


def test_an_unknown_executor_is_refused_naming_the_choices():
    with pytest.raises(TypeError, match=r"one of 'process', 'async', 'thread', got 'celery'"):
        job(executor="celery")


def test_each_job_keeps_the_executor_it_declared():
    assert executor_of(f"{REF}:hang_async") == "async"
    assert executor_of(f"{REF}:hang_thread") == "thread"
    assert executor_of(f"{REF}:plain_job") == "process"
    assert inprocess_jobs.plain_job.__name__ == "plain_job"  # the decorator returns the function itself


# --- where a worker places what it claimed (fake children, no process, no database) -------------


class FakeConn:
    def __init__(self):
        self.sent, self.inbox = [], []

    def send(self, message):
        self.sent.append(message)

    def poll(self):
        return bool(self.inbox)

    def recv(self):
        if not self.inbox:
            raise EOFError
        return self.inbox.pop(0)

    def close(self):
        pass


class FakeChildren:
    def __init__(self, first_pid):
        self.next_pid, self.conns, self.killed, self.gates = first_pid, {}, [], {}

    def fork(self, gate=None):
        self.next_pid += 1
        self.conns[self.next_pid] = FakeConn()
        self.gates[self.next_pid] = gate  # what the child would begin through (worker.gate)
        return self.next_pid, self.conns[self.next_pid]

    def kill(self, pid):
        self.killed.append(pid)

    def exited(self, pid):
        return pid in self.killed

    def how_it_ended(self, pid):
        return "signal 9"


class FakeLoop:
    def __init__(self):
        self.watched = {}

    def watch(self, conn, callback):
        self.watched[id(conn)] = callback

    def unwatch(self, conn):
        self.watched.pop(id(conn), None)

    def wake(self, conn):
        self.watched[id(conn)](conn)


def ready_worker(children=1, places=10, gated=False):
    """A worker whose children and in-process host are forked (fakes) and said they are ready;
    ``gated``: its children may be sent several tasks at once (see tests/test_child_batches.py),
    else one at a time."""
    worker = WorkerRole(["default"], concurrency=children, inprocess=places)
    worker.pool.children, worker.inprocess.children = FakeChildren(100), FakeChildren(900)
    worker.pool.gated = gated
    worker.loop = loop = FakeLoop()
    worker.pool.start(loop)
    worker.inprocess.start(loop)
    for conn in [*worker.pool.children.conns.values(), *worker.inprocess.children.conns.values()]:
        conn.inbox.append(READY)
        loop.wake(conn)
    return worker


def message(task_run_id, fn, timeout=None):
    return {"id": task_run_id, "run_id": task_run_id, "task": fn, "number": 1, "timeout": timeout,
            "spec": {"kind": "python", "call": "job", "ref": f"{REF}:{fn}", "args": [], "kwargs": {}}}


def test_a_worker_offers_in_process_places_as_far_as_its_claims_found_in_process_jobs():
    worker = ready_worker(children=1, places=10)
    # Nothing known yet: the idle child and one place, to find out.
    assert worker.capacity() == 2
    worker.place([message(1, "pid_async"), message(2, "pid_async")])
    host = worker.inprocess.host
    assert [[m["id"] for m in sent] for sent in host.conn.sent] == [[1, 2]]  # on the host in one message
    assert worker.pool.idle_slots()  # the child still idle
    # Half the latest claims were in-process jobs: half the places one claim may fill (half of
    # the 10, so that the host runs one half while the batch of the other goes; 8 are free), and
    # the idle child.
    assert worker.inprocess.free() == 8 and worker.inprocess.offer() == 5
    assert worker.inprocess_share == 0.5 and worker.capacity() == 1 + round(5 * 0.5)
    worker.place([message(3, "pid_thread")] * 1)
    assert worker.inprocess_share == 0.75 and worker.capacity() == 1 + round(5 * 0.75)
    # Only in-process jobs of late: still half the places per claim, the rest for the next one.
    worker.inprocess_share = 1.0
    assert worker.capacity() == 1 + 5
    worker.place([message(n, "pid_async") for n in range(4, 9)])
    assert worker.inprocess.free() == 2 and worker.capacity() == 1 + 2


def test_what_one_claim_may_take_follows_how_long_the_batches_take():
    inprocess = ready_worker(children=1, places=500).inprocess
    assert inprocess.claim_most == 250 and inprocess.offer() == 250  # half the places
    inprocess.batch_took(BATCH_SECONDS * 2)  # twice as long as the batches should take: half
    assert inprocess.claim_most == 125 and inprocess.offer() == 125
    inprocess.batch_took(1.0)  # a stall: at most half at once
    assert inprocess.claim_most == 62
    for _ in range(20):
        inprocess.batch_took(5.0)
    assert inprocess.claim_most == CLAIM_LEAST
    inprocess.batch_took(BATCH_SECONDS / 4)  # short ones: at most 1.5 times as many at once
    assert inprocess.claim_most == 24
    for _ in range(20):
        inprocess.batch_took(0.001)
    assert inprocess.claim_most == 250  # never beyond half the places
    inprocess.batch_took(BATCH_SECONDS)
    assert inprocess.claim_most == 250 and inprocess.offer() == 250


def test_without_places_a_worker_claims_for_its_idle_children_and_runs_every_job_there():
    worker = ready_worker(children=2, places=0)
    assert worker.inprocess.host is None and worker.capacity() == 2
    worker.place([message(1, "pid_async"), message(2, "pid_thread")])
    assert sorted(slot.message["id"] for slot in worker.pool.slots) == [1, 2] and worker.held.jobs == []
    assert worker.capacity() == 0


def test_an_in_process_job_beyond_the_free_places_waits_for_one_not_for_a_child(monkeypatch):
    worker = ready_worker(children=1, places=1)
    handed = []
    monkeypatch.setattr("orchestrator.worker.role.hand_back",
                        lambda messages, *args, **kwargs: handed.extend(m["id"] for m in messages))
    worker.place([message(1, "pid_async"), message(2, "pid_thread")])
    host = worker.inprocess.host
    assert [[m["id"] for m in sent] for sent in host.conn.sent] == [[1]]
    # 2 runs where it declared, in the host: it waits for the place, and the child stays idle.
    # While it waits, a claim takes nothing: the child is promised to it, and no place is free.
    [slot] = worker.pool.slots
    assert slot.message is None and [m["id"] for m in worker.held.jobs] == [2]
    assert worker.capacity() == 0
    # Not claimed ahead (no bet on short tasks): it waits for the place however long that takes.
    worker.hand_back_held(1e12)
    assert handed == [] and [m["id"] for m in worker.held.jobs] == [2]
    # The host's outcome frees the place: 2 goes there, and the child is offered again.
    worker.inprocess.children.conns[host.pid].inbox.append([(1, 1, "succeeded", None, "", "", "", None, "")])
    worker.loop.wake(host.conn)
    worker.start_held()
    assert [[m["id"] for m in sent] for sent in host.conn.sent] == [[1], [2]] and worker.held.jobs == []
    assert slot.message is None and worker.capacity() == 1
    # Claimed ahead of a deep backlog of short tasks, one that waited a second while nothing of
    # the worker ended is handed back (the host is stuck).
    worker.backlog, worker.pool.task_seconds = True, 0.001
    worker.place([message(3, "plain_job"), message(4, "pid_async")])
    assert slot.message["id"] == 3 and [m["id"] for m in worker.held.jobs] == [4]
    began = worker.held.since[4]
    worker.hand_back_held(began + 0.5)
    assert handed == [] and [m["id"] for m in worker.held.jobs] == [4]
    worker.hand_back_held(began + 1.0)
    assert handed == [4] and worker.held.jobs == []


def test_default_jobs_claimed_for_in_process_places_wait_for_a_child_and_stop_further_offers():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "plain_job"), message(2, "plain_job")])
    [slot] = worker.pool.slots
    assert slot.message["id"] == 1 and [m["id"] for m in worker.held.jobs] == [2]
    assert worker.inprocess_share == 0.0
    # While a job waits for a child, a claim takes nothing: no idle child, no place offered.
    assert worker.capacity() == 0
    # Not claimed ahead (no bet on short tasks): it waits for the child however long that takes.
    assert worker.held.since == {}
    worker.hand_back_held(1e12)
    assert [m["id"] for m in worker.held.jobs] == [2]
    # The child's outcome frees it: the held job starts there, and places are offered again.
    worker.pool.children.conns[slot.pid].inbox.append((1, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(slot.conn)
    worker.start_held()
    assert slot.message["id"] == 2 and worker.held.jobs == []
    assert worker.capacity() == 1  # one place, to find in-process jobs; the child is busy


def test_with_a_deep_backlog_of_short_tasks_a_claim_takes_a_few_tens_of_milliseconds_of_work_per_child():
    worker = ready_worker(children=2, places=0)
    # No backlog known: the idle children only.
    assert worker.capacity() == 2
    # The latest claim got all it asked for and more was due; tasks take 50 ms: one each ahead.
    worker.backlog, worker.pool.task_seconds = True, PREFETCH_TASK_SECONDS
    assert PREFETCH_SECONDS == 0.06 and worker.capacity() == 2 + 2 * 1
    # Tasks of 20 ms: three each; of a millisecond: as many as a child may have ahead, not sixty.
    worker.pool.task_seconds = 0.02
    assert worker.capacity() == 2 + 2 * 3
    worker.pool.task_seconds = 0.001
    assert PREFETCH_PER_CHILD == 8 and worker.capacity() == 2 + 2 * 8
    worker.pool.task_seconds = 0.02
    worker.place([message(n, "plain_job") for n in range(1, 9)])
    assert sorted(slot.message["id"] for slot in worker.pool.slots) == [1, 2]
    assert [m["id"] for m in worker.held.jobs] == [3, 4, 5, 6, 7, 8] and list(worker.held.since) == [3, 4, 5, 6, 7, 8]
    assert worker.capacity() == 0  # three wait per child already
    # A child's reply starts the next one there at once, before any transaction; it waits no more.
    [first, _] = worker.pool.slots
    worker.pool.children.conns[first.pid].inbox.append((1, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(first.conn)
    worker.start_held()
    assert first.message["id"] == 3 and [m["id"] for m in worker.held.jobs] == [4, 5, 6, 7, 8]
    assert list(worker.held.since) == [4, 5, 6, 7, 8]
    assert worker.capacity() == 1
    # Long tasks: nothing is claimed ahead (a task would wait long for a child), whatever the backlog.
    worker.pool.task_seconds = 1.0
    assert worker.capacity() == 0
    worker.held.clear()
    assert worker.capacity() == 0  # both children busy


def test_a_job_a_later_claim_took_goes_ahead_of_the_held_jobs_it_outranks_and_behind_its_equals():
    worker = ready_worker(children=1, places=0)
    worker.backlog, worker.pool.task_seconds = True, 0.001

    def ranked(task_run_id, priority, lane=0):
        return {**message(task_run_id, "plain_job"), "rank": (lane, -priority)}

    # The first claim: the child takes one, three wait (a backfill's among them, last).
    worker.place([ranked(1, 0), ranked(2, 0), ranked(3, 0), ranked(4, 50, lane=1)])
    # A later claim took what was enqueued meanwhile: a priority job goes ahead of the
    # lower-ranked ones, behind none of them; one of their priority goes behind them; a live job
    # of the lowest priority still goes ahead of the backfill's.
    worker.place([ranked(5, 10), ranked(6, 0), ranked(7, -5), ranked(8, 10)])
    assert [m["id"] for m in worker.held.jobs] == [5, 8, 2, 3, 6, 7, 4]


def test_while_every_child_has_work_waiting_batches_are_further_apart():
    worker = ready_worker(children=2, places=0)
    worker.backlog, worker.pool.task_seconds = True, 0.001
    worker.place([message(n, "plain_job") for n in range(1, 5)])  # both children busy, two held
    worker.next_poll = worker.next_heartbeat = float("inf")  # nothing else to wake up for
    now = time.monotonic()
    worker.batch.last_flush = now - 2 * COALESCE_SECONDS  # past the short hold
    # Each child has a job waiting: no child idles for the next batch, which waits longer.
    assert len(worker.held) == worker.concurrency and worker.holding(now)
    flushed = worker.batch.last_flush
    assert worker.holding(flushed + QUEUED_COALESCE_SECONDS - 0.001)
    assert not worker.holding(flushed + QUEUED_COALESCE_SECONDS + 0.000001)
    assert 0 < worker.next_wait() <= QUEUED_COALESCE_SECONDS - 2 * COALESCE_SECONDS
    # A notification asks for new work (it may outrank what waits): the short hold applies.
    worker.wakeup.owed = 1
    assert not worker.holding(now)
    worker.wakeup.owed = 0
    # One child's reply takes a held job: a child may soon idle, so the short hold applies again.
    [first, _] = worker.pool.slots
    worker.pool.children.conns[first.pid].inbox.append((1, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(first.conn)
    worker.start_held()
    assert len(worker.held) < worker.concurrency and not worker.holding(now)


def test_nothing_is_claimed_ahead_before_a_task_ended_and_the_first_one_sets_the_average():
    worker = ready_worker(children=1, places=0)
    worker.backlog = True
    # No task has ended in this worker: no evidence that tasks are short, no claim ahead.
    assert worker.pool.task_seconds is None and worker.capacity() == 1
    worker.place([message(1, "plain_job")])
    [slot] = worker.pool.slots
    slot.started -= 0.2  # the task ran for 0.2 s
    worker.pool.children.conns[slot.pid].inbox.append((1, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(slot.conn)
    # The average starts at that task's time (not a tenth of it, as from zero): still none ahead.
    assert 0.2 <= worker.pool.task_seconds < 0.3
    assert worker.prefetch() == 0 and worker.capacity() == 1


def test_outcomes_wait_a_moment_for_their_neighbours_but_work_a_notification_announced_does_not():
    worker = ready_worker(children=2, places=0)
    worker.place([message(1, "plain_job")])  # a child busy: its outcome would join the next batch
    worker.want_claim = False
    now = 1000.0
    worker.batch.last_flush = now - COALESCE_SECONDS / 2  # the latest batch began a moment ago
    # Outcomes alone wait for the busy child's.
    assert worker.holding(now)
    # A notification named this worker's place, and a child is free: the claim goes at once, as
    # the wait would be the new job's start delay.
    worker.wakeup.owed = 1
    assert worker.wakeup.asked(now) and worker.capacity() == 1
    assert not worker.holding(now)
    # Claiming again while a backlog lasts still waits, so those batches stay large.
    worker.want_claim = True
    assert worker.holding(now)
    # Announced work with no free child to take it waits with the outcomes.
    worker.want_claim = False
    worker.place([message(2, "plain_job")])
    assert worker.capacity() == 0 and worker.holding(now)
    # Past the window nothing waits, and with no child busy no outcome would join.
    assert not worker.holding(now + COALESCE_SECONDS)
    for slot in worker.pool.slots:
        worker.pool.children.conns[slot.pid].inbox.append((slot.message["id"], 1, "succeeded", None, "", "", "", None, ""))
        worker.loop.wake(slot.conn)
    assert worker.pool.busy_count() == 0 and not worker.holding(now)


def test_an_overdue_thread_job_retires_its_host_and_an_overdue_async_job_is_cancelled():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "hang_async", timeout=1.0), message(2, "hang_thread", timeout=5.0)])
    first = worker.inprocess.host
    ended = worker.inprocess.overdue(float("inf"))
    assert sorted(m["id"] for m in ended) == [1, 2]
    assert {"cancel": 1} in first.conn.sent  # the async job is cancelled where it runs
    # The stuck thread's host ran nothing else: killed, and a fresh one takes the next jobs.
    assert first.pid in worker.inprocess.children.killed
    assert worker.inprocess.host is not first and worker.inprocess.hosts == [worker.inprocess.host]


def test_a_host_with_a_stuck_thread_finishes_its_other_jobs_before_it_is_killed():
    worker = ready_worker(children=1, places=10)
    replies = []
    worker.inprocess.on_reply = lambda message, reply: replies.append(message["id"])
    worker.place([message(1, "hang_thread", timeout=1.0), message(2, "pid_async")])
    first = worker.inprocess.host
    worker.inprocess.overdue(10**9)
    assert first.retiring and first.pid not in worker.inprocess.children.killed  # job 2 still runs there
    first.conn.inbox.append([(2, 1, "succeeded", "7", "", "", "", None, "")])
    worker.loop.wake(first.conn)
    assert replies == [2] and first.pid in worker.inprocess.children.killed


def test_after_a_sync_the_host_is_replaced_once_its_jobs_ended():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "pid_async")])
    first = worker.inprocess.host
    worker.inprocess.recycle(first.generation + 1)
    assert first.retiring and worker.inprocess.host is not first
    assert first.pid not in worker.inprocess.children.killed  # its job still runs
    first.conn.inbox.append([(1, 1, "succeeded", "7", "", "", "", None, "")])
    worker.loop.wake(first.conn)
    assert first.pid in worker.inprocess.children.killed and worker.inprocess.hosts == [worker.inprocess.host]


def test_the_jobs_a_hand_back_leaves_are_timed_from_the_oldest_of_them(monkeypatch):
    worker = ready_worker(children=1, places=0)
    worker.backlog, worker.pool.task_seconds = True, 0.001
    handed = []
    monkeypatch.setattr("orchestrator.worker.role.hand_back",
                        lambda messages, *args, **kwargs: handed.extend(m["id"] for m in messages))

    def ranked(task_run_id, priority):
        return {**message(task_run_id, "plain_job"), "rank": (0, -priority)}

    worker.place([ranked(1, 0), ranked(2, 0)])  # the child runs 1; 2 waits
    worker.place([ranked(3, 0), ranked(4, 10)])  # a later claim: 4 outranks 2 and goes first
    assert [m["id"] for m in worker.held.jobs] == [4, 2, 3]
    worker.held.since.update({2: 100.0, 3: 100.5, 4: 100.7})  # when each began to wait
    worker.pool.last_reply = 0.0  # no child replied since
    worker.hand_back_held(101.0)
    # 2 waited a second: handed back. The others wait on, timed from the older of them (3), not
    # from the first in the queue (4).
    assert handed == [2] and [m["id"] for m in worker.held.jobs] == [4, 3]
    assert worker.held_since() == 100.5
    worker.hand_back_held(101.4)
    assert handed == [2]
    worker.hand_back_held(101.5)
    assert handed == [2, 3] and [m["id"] for m in worker.held.jobs] == [4] and worker.held_since() == 100.7
    worker.hand_back_held(101.7)
    assert handed == [2, 3, 4] and worker.held.jobs == [] and worker.held.since == {}
