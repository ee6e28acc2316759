"""Several short jobs sent to a child at once (``Pool.start_tasks``), and what the worker takes
back from a child that has not begun them (``worker.gate``): fake children that begin each job
through the real gate, no process and no database. With real processes:
tests/processes/test_execution_processes.py."""

from __future__ import annotations

import json

import pytest

from orchestrator.worker.gate import Gate
from orchestrator.worker.pool import PREFETCH_PER_CHILD, TAKE_BACK_SECONDS
from tests.test_executors import message, ready_worker


def ranked(task_run_id, priority=0):
    return {**message(task_run_id, "plain_job"), "rank": (0, -priority)}


def short_tasks_worker(children=2):
    """A worker whose tasks are seen to be short and whose claims found a backlog: it claims
    ahead, and its children are gated."""
    worker = ready_worker(children=children, places=0, gated=True)
    worker.backlog, worker.pool.task_seconds = True, 0.0001
    return worker


def sent_batch(slot):
    """The ids of the jobs of the batch last sent to this child."""
    return [job["id"] for job in slot.conn.sent[-1]["jobs"]]


def child_begins(worker, slot) -> bool:
    """The child begins the next job of its batch (as executor.child_main does)."""
    return worker.pool.children.gates[slot.pid].begin(slot.batch)


def child_replies(worker, slot, task_run_id):
    worker.pool.children.conns[slot.pid].inbox.append((task_run_id, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(slot.conn)


def test_short_jobs_go_to_idle_children_several_at_once_dealt_in_rank_order():
    worker = short_tasks_worker(children=2)
    first, second = worker.pool.slots
    worker.place([ranked(n) for n in range(1, 8)])
    # The highest ranked each begin in their own child now; the rest follow them, in turn.
    assert sent_batch(first) == [1, 3, 5, 7] and sent_batch(second) == [2, 4, 6]
    assert first.message["id"] == 1 and [m["id"] for m in first.queued] == [3, 5, 7]
    assert worker.held.jobs == [] and worker.pool.queued_count() == 5
    # The child goes from one job to the next without the worker: each outcome moves the
    # worker's view on to the next one, whose timeout counts from then.
    for task_run_id in (1, 3, 5, 7):
        assert child_begins(worker, first)
        child_replies(worker, first, task_run_id)
    assert not child_begins(worker, first)  # the batch is over
    assert first.message is None and first.queued == [] and first.tasks == 4


def test_a_child_is_sent_no_more_than_its_share_of_what_waits_nor_more_than_the_cap():
    worker = short_tasks_worker(children=2)
    worker.place([ranked(n) for n in range(1, 4)])
    assert [len(slot.conn.sent[-1]["jobs"]) if isinstance(slot.conn.sent[-1], dict) and "jobs" in slot.conn.sent[-1]
            else 1 for slot in worker.pool.slots] == [2, 1]
    many = short_tasks_worker(children=1)
    many.place([ranked(n) for n in range(1, 40)])
    [slot] = many.pool.slots
    assert len(sent_batch(slot)) == PREFETCH_PER_CHILD and len(many.held.jobs) == 39 - PREFETCH_PER_CHILD
    # Tasks that take longer are sent fewer at once (about SENT_AHEAD_SECONDS of work each).
    slow = short_tasks_worker(children=1)
    slow.pool.task_seconds = 0.01
    slow.place([ranked(n) for n in range(1, 10)])
    assert len(sent_batch(slow.pool.slots[0])) == 2


def test_what_a_child_was_sent_ahead_counts_against_what_the_worker_claims_ahead():
    worker = short_tasks_worker(children=1)
    assert worker.capacity() == 1 + PREFETCH_PER_CHILD
    worker.place([ranked(n) for n in range(1, PREFETCH_PER_CHILD + 2)])
    [slot] = worker.pool.slots
    assert len(slot.queued) == PREFETCH_PER_CHILD - 1 and len(worker.held) == 1
    # Claimed ahead: one held, seven sent to the child behind its task; room for none more.
    assert worker.capacity() == 0


def test_what_waits_behind_a_slow_job_is_taken_back_and_runs_in_another_child():
    worker = short_tasks_worker(children=2)
    slow_child, other = worker.pool.slots
    worker.place([ranked(n) for n in range(1, 7)])
    assert sent_batch(slow_child) == [1, 3, 5] and sent_batch(other) == [2, 4, 6]
    assert child_begins(worker, slow_child)  # job 1 runs on and on
    for task_run_id in (2, 4, 6):
        assert child_begins(worker, other)
        child_replies(worker, other, task_run_id)
    assert worker.next_wait() <= TAKE_BACK_SECONDS
    worker.pool.take_back_stuck(slow_child.started + TAKE_BACK_SECONDS)
    # 3 and 5 are the worker's again: the slow child can no longer begin them.
    assert slow_child.message["id"] == 1 and slow_child.queued == []
    assert not child_begins(worker, slow_child)
    worker.start_held()
    assert other.message["id"] == 3 and sent_batch(other) == [3, 5]


def test_a_job_a_later_claim_took_goes_ahead_of_what_waits_in_the_children_it_outranks():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    worker.place([ranked(4, priority=10)])
    # 2 and 3 came back: 4 starts first when the child is free, then they follow in order.
    assert [m["id"] for m in worker.held.jobs] == [4, 2, 3] and slot.queued == []
    child_replies(worker, slot, 1)
    worker.start_held()
    assert sent_batch(slot) == [4, 2, 3]
    # A job that outranks none of them takes nothing back: it waits its turn here.
    worker.place([ranked(5)])
    assert [m["id"] for m in slot.queued] == [2, 3] and [m["id"] for m in worker.held.jobs] == [5]


def test_a_job_that_waits_in_a_child_and_is_cancelled_is_dropped_and_never_begins():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    worker.on_cancelled(json.dumps([2]))
    # The child runs on (1 is not cancelled); 3 waits for it here, 2 is gone.
    assert slot.message["id"] == 1 and [m["id"] for m in worker.held.jobs] == [3]
    assert not child_begins(worker, slot)
    assert worker.pool.children.killed == []


def test_a_job_the_child_began_before_the_worker_took_it_back_stays_the_childs():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    # The child ended 1 and began 2; the worker has not read 1's outcome yet.
    assert child_begins(worker, slot) and child_begins(worker, slot)
    back = worker.pool.take_back(slot)
    assert [m["id"] for m in back] == [3]
    assert slot.message["id"] == 1 and [m["id"] for m in slot.queued] == [2]
    child_replies(worker, slot, 1)
    assert slot.message["id"] == 2
    child_replies(worker, slot, 2)
    assert slot.message is None and worker.batch.endings and [e.task_run_id for e in worker.batch.endings] == [1, 2]


def test_a_child_between_two_jobs_is_idle_once_the_worker_took_back_the_rest():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    child_replies(worker, slot, 1)  # the worker now counts 2 as running; the child has not begun it
    back = worker.pool.take_back(slot)
    assert [m["id"] for m in back] == [2, 3] and slot.message is None and worker.pool.idle_slots() == [slot]
    assert not child_begins(worker, slot)


def test_a_dead_child_fails_the_job_it_ran_and_gives_back_those_it_had_not_begun():
    worker = short_tasks_worker(children=2)
    first, _ = worker.pool.slots
    worker.place([ranked(n) for n in range(1, 7)])
    assert child_begins(worker, first)
    worker.pool.children.conns[first.pid].inbox.clear()
    worker.loop.wake(first.conn)  # EOF: it died running 1
    assert [(e.task_run_id, e.outcome) for e in worker.batch.endings] == [(1, "failed")]
    # 3 and 5 wait for a child again (its replacement is still starting).
    assert [m["id"] for m in worker.held.jobs] == [3, 5] and first not in worker.pool.slots


def test_a_child_that_dies_between_two_jobs_fails_none_of_them():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    child_replies(worker, slot, 1)
    worker.pool.children.conns[slot.pid].inbox.clear()
    worker.loop.wake(slot.conn)  # EOF before it began 2
    assert [e.task_run_id for e in worker.batch.endings] == [1]  # 1's success, and no failure
    assert [m["id"] for m in worker.held.jobs] == [2, 3]


def test_a_job_past_its_timeout_is_killed_and_what_waited_behind_it_goes_back():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([{**ranked(1), "timeout": 5.0}, ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    worker.end_overdue_tasks(slot.started + 5.0)
    assert [(e.task_run_id, e.outcome) for e in worker.batch.endings] == [(1, "timed_out")]
    assert slot.pid in worker.pool.children.killed
    assert [m["id"] for m in worker.held.jobs] == [2, 3]


@pytest.mark.django_db
def test_a_drain_hands_back_at_once_what_the_children_have_not_begun(monkeypatch):
    handed = []
    monkeypatch.setattr("orchestrator.worker.drain.hand_back",
                        lambda messages, *args, **kwargs: handed.extend(m["id"] for m in messages))
    worker = short_tasks_worker(children=1)
    worker.register()
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3), ranked(4)])
    assert child_begins(worker, slot) and [m["id"] for m in slot.queued] == [2, 3, 4]
    worker.loop.stop_requests = 1  # SIGTERM
    worker.tick()
    # 1 runs on within the grace period; 2, 3 and 4 never began: handed back, the child cannot begin them.
    assert sorted(handed) == [2, 3, 4] and slot.message["id"] == 1 and worker.drain.active
    assert not child_begins(worker, slot)


def test_after_a_sync_what_an_old_child_has_not_begun_runs_in_a_fresh_one():
    worker = short_tasks_worker(children=1)
    [slot] = worker.pool.slots
    worker.place([ranked(1), ranked(2), ranked(3)])
    assert child_begins(worker, slot)
    worker.pool.saw_generation(worker.pool.generation + 1)
    assert [m["id"] for m in worker.held.jobs] == [2, 3] and not child_begins(worker, slot)


def test_the_gate_lets_a_child_begin_only_the_batch_it_was_sent_and_only_as_many_as_allowed():
    gate = Gate()
    gate.open(7, 2)
    assert not gate.begin(6)  # an older batch's rest
    assert gate.begin(7) and gate.take_back(7) == 1 and not gate.begin(7)
    assert gate.take_back(8) is None and gate.begun(7) == 1
    gate.open(8, 1)
    assert gate.begin(8) and not gate.begin(8) and gate.begun(7) is None


@pytest.mark.django_db
def test_after_an_outage_the_jobs_a_child_was_sent_are_the_workers_still_and_none_is_handed_back(clock):
    from orchestrator.clock import pinned
    from orchestrator.jobs import enqueue_many
    from orchestrator.models import TaskRun

    enqueue_many([{"ref": "workflows.jobs:noop"} for _ in range(4)], now=clock.now())
    worker = short_tasks_worker(children=1)
    worker.register()
    claimed = worker.claim(4, clock.now())
    worker.place(claimed)
    [slot] = worker.pool.slots
    assert len(slot.queued) == 3 and child_begins(worker, slot)
    with pinned(clock):
        worker.reconnected()  # what the database says this worker runs, against what it runs
    # The three sent behind the first are accounted for: still running, this worker's, not handed back.
    states = TaskRun.objects.filter(pk__in=[m["id"] for m in claimed]).values_list("state", "worker_id")
    assert sorted(states) == [("running", worker.id)] * 4 and len(slot.queued) == 3
