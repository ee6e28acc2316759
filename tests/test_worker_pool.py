"""The worker's pool of children on its own: fake children (no process is forked) and no database,
so each decision (fork, reply, death, timeout, growth, shrinking, recycling, reaping) is a
scenario of a few lines."""

from __future__ import annotations

import pytest

from orchestrator.executor import READY
from orchestrator.worker.pool import RETIRE_SECONDS, Pool


class FakeConn:
    """One end of a child's pipe: what the pool sent, and what the child will answer."""

    def __init__(self):
        self.sent, self.inbox = [], []
        self.broken = self.closed = False

    def send(self, message):
        if self.broken:
            raise OSError("broken pipe")
        self.sent.append(message)

    def recv(self):
        if self.broken or not self.inbox:
            raise EOFError
        return self.inbox.pop(0)

    def close(self):
        self.closed = True


class FakeChildren:
    """Children that are only pids and pipes: which were forked, killed, and have exited."""

    def __init__(self):
        self.next_pid = 100
        self.conns, self.killed, self.gone = {}, [], set()

    def fork(self, gate=None):
        self.next_pid += 1
        self.conns[self.next_pid] = FakeConn()
        return self.next_pid, self.conns[self.next_pid]

    def kill(self, pid):
        self.killed.append(pid)
        self.gone.add(pid)

    def exited(self, pid):
        return pid in self.gone

    def how_it_ended(self, pid):
        return "signal 9"


class FakeLoop:
    def __init__(self):
        self.watched = {}

    def watch(self, conn, callback):
        self.watched[id(conn)] = callback

    def unwatch(self, conn):
        del self.watched[id(conn)]

    def wake(self, slot):
        """The child wrote: the loop calls back the pool."""
        self.watched[id(slot.conn)](slot.conn)


class Scene:
    def __init__(self, concurrency=3, min_children=1, idle_seconds=10.0, max_tasks_per_child=0):
        self.children, self.loop = FakeChildren(), FakeLoop()
        self.replies, self.deaths = [], []
        self.pool = Pool(concurrency=concurrency, min_children=min_children, idle_seconds=idle_seconds,
                         max_tasks_per_child=max_tasks_per_child, children=self.children,
                         on_reply=lambda message, reply: self.replies.append((message["id"], reply)),
                         on_died=lambda message, how: self.deaths.append((message["id"], how)))
        self.pool.start(self.loop)

    def ready(self, *slots):
        for slot in slots or self.pool.slots:
            slot.conn.inbox.append(READY)
            self.loop.wake(slot)

    def reply(self, slot, outcome="succeeded"):
        slot.conn.inbox.append((slot.message["id"], 1, outcome))
        self.loop.wake(slot)

    def pids(self):
        return [slot.pid for slot in self.pool.slots]


def task(task_run_id, timeout=None):
    return {"id": task_run_id, "run_id": 1, "number": 1, "spec": {}, "timeout": timeout}


def test_it_forks_the_minimum_and_gives_a_child_a_task_only_once_it_said_it_is_ready():
    scene = Scene(concurrency=3, min_children=2)
    assert scene.pids() == [101, 102] and len(scene.loop.watched) == 2
    assert scene.pool.idle_slots() == []  # still starting: the claim would wait for them
    scene.ready(scene.pool.slots[0])
    assert scene.pool.idle_slots() == [scene.pool.slots[0]]


def test_a_fixed_pool_forks_every_child_ahead():
    scene = Scene(concurrency=3, min_children=0)
    assert scene.pids() == [101, 102, 103]
    scene.ready()
    assert scene.pool.next_shrink() is None  # never below the minimum: nothing to shrink


def test_a_reply_is_the_outcome_of_the_childs_task_and_frees_it():
    scene = Scene()
    scene.ready()
    slot = scene.pool.slots[0]
    scene.pool.start_task(slot, task(7))
    assert slot.conn.sent == [task(7)] and scene.pool.busy() == [slot] and scene.pool.idle_slots() == []
    scene.reply(slot)
    assert scene.replies == [(7, (7, 1, "succeeded"))]
    assert slot.message is None and slot.tasks == 1 and scene.pool.idle_slots() == [slot]


def test_a_child_that_dies_while_running_a_task_is_reported_and_replaced():
    scene = Scene()
    scene.ready()
    slot = scene.pool.slots[0]
    scene.pool.start_task(slot, task(7))
    slot.conn.broken = True
    scene.loop.wake(slot)
    assert scene.deaths == [(7, "signal 9")] and scene.replies == []
    assert scene.children.killed == [101] and scene.pids() == [102]
    assert slot.conn.closed and id(slot.conn) not in scene.loop.watched


def test_a_child_whose_pipe_is_broken_when_given_a_task_is_replaced_and_the_task_reported():
    scene = Scene()
    scene.ready()
    slot = scene.pool.slots[0]
    slot.conn.broken = True
    scene.pool.start_task(slot, task(7))
    assert scene.deaths == [(7, "signal 9")] and scene.pids() == [102]


def test_a_task_past_its_timeout_is_killed_with_its_child_which_is_replaced():
    scene = Scene(concurrency=2, min_children=2)
    scene.ready()
    late, on_time = scene.pool.slots
    scene.pool.start_task(late, task(7, timeout=5))
    scene.pool.start_task(on_time, task(8, timeout=60))
    assert scene.pool.overdue(late.started + 4.9) == []
    assert scene.pool.overdue(late.started + 5) == [task(7, timeout=5)]
    assert scene.children.killed == [101] and scene.pids() == [103, 102]
    assert scene.pool.busy() == [on_time]


def test_an_abandoned_task_is_killed_and_its_child_replaced():
    scene = Scene()
    scene.ready()
    slot = scene.pool.slots[0]
    scene.pool.start_task(slot, task(7))
    scene.pool.abandon(slot)
    assert scene.children.killed == [101] and scene.pids() == [102] and scene.pool.busy() == []


def test_at_the_end_of_a_drain_running_tasks_are_killed_and_not_replaced():
    scene = Scene(concurrency=2, min_children=2)
    scene.ready()
    busy, idle = scene.pool.slots
    scene.pool.start_task(busy, task(7))
    assert scene.pool.interrupt() == [task(7)]
    assert scene.children.killed == [101] and scene.pool.slots == [idle]


# --- the elastic pool ----------------------------------------------------------------------------

def test_it_grows_only_when_no_ready_child_is_free_and_asks_for_room_plus_the_children_starting():
    scene = Scene(concurrency=4, min_children=1)
    # The one child is still starting: up to 3 more could be forked, and the starting one takes one.
    assert scene.pool.room_to_grow() == 4
    scene.pool.grow(2)  # two task runs wait: the starting child takes one, one more is forked
    assert scene.pids() == [101, 102]
    scene.ready()
    assert scene.pool.room_to_grow() == 0  # a ready child is free: it takes the next task
    for number, slot in enumerate(scene.pool.slots):
        scene.pool.start_task(slot, task(number))
    assert scene.pool.room_to_grow() == 2
    scene.pool.grow(5)  # more wait than there is room for: up to the concurrency
    assert scene.pids() == [101, 102, 103, 104]
    assert scene.pool.room_to_grow() == 0  # full


def test_nothing_waiting_forks_nothing():
    scene = Scene(concurrency=4, min_children=1)
    scene.pool.grow(0)
    scene.pool.grow(1)  # the child still starting takes it
    assert scene.pids() == [101]


def test_it_shrinks_to_the_minimum_the_longest_idle_first_after_idling():
    scene = Scene(concurrency=3, min_children=1, idle_seconds=10)
    scene.pool.grow(3)
    scene.ready()
    first, second, third = scene.pool.slots
    first.idle_since, second.idle_since, third.idle_since = 100.0, 50.0, 80.0
    assert scene.pool.next_shrink() == 60.0
    scene.pool.shrink(59.0)
    assert len(scene.pool.slots) == 3
    scene.pool.shrink(95.0)  # the second and the third idled 10 s; two are above the minimum
    assert scene.pool.slots == [first]
    assert [pid for pid, _ in scene.pool.retiring] == [second.pid, third.pid]
    assert second.conn.sent == [None] and third.conn.sent == [None]  # told to exit, not killed
    scene.pool.shrink(1000.0)
    assert scene.pool.slots == [first] and scene.pool.next_shrink() is None


def test_a_busy_child_is_never_shrunk_away():
    scene = Scene(concurrency=2, min_children=1, idle_seconds=10)
    scene.pool.grow(2)
    scene.ready()
    busy, idle = scene.pool.slots
    busy.idle_since = idle.idle_since = 0.0
    scene.pool.start_task(busy, task(7))
    scene.pool.shrink(1000.0)
    assert scene.pool.slots == [busy]


# --- recycling -----------------------------------------------------------------------------------

def test_a_new_code_generation_replaces_idle_children_now_and_busy_ones_after_their_task():
    scene = Scene(concurrency=2, min_children=2)
    scene.ready()
    busy, idle = scene.pool.slots
    scene.pool.start_task(busy, task(7))
    scene.pool.saw_generation(1)
    scene.pool.recycle(0.0)
    assert scene.pool.slots[0] is busy and scene.pool.slots[1].pid == 103
    assert scene.pool.slots[1].generation == 1 and scene.pool.retiring == [(idle.pid, RETIRE_SECONDS)]
    scene.reply(busy)
    scene.pool.recycle(1.0)
    assert scene.pids() == [104, 103] and not scene.children.killed


def test_a_late_notify_of_an_older_generation_is_ignored_and_one_read_from_the_database_counts():
    scene = Scene()
    scene.pool.saw_generation(5, read=True)
    scene.pool.saw_generation(4)  # a NOTIFY of an older sync, delivered after the heartbeat read 5
    assert scene.pool.generation == 5
    scene.pool.saw_generation(3, read=True)  # the row itself says otherwise (recreated): it counts
    assert scene.pool.generation == 3


@pytest.mark.parametrize(("tasks", "replaced"), [(2, False), (3, True)])
def test_a_child_is_replaced_once_it_ran_max_tasks_per_child(tasks, replaced):
    scene = Scene(concurrency=1, min_children=1, max_tasks_per_child=3)
    scene.ready()
    slot = scene.pool.slots[0]
    for number in range(tasks):
        scene.pool.start_task(slot, task(number))
        scene.reply(slot)
    scene.pool.recycle(0.0)
    assert (scene.pids() != [slot.pid]) is replaced


def test_retired_children_are_forgotten_once_they_exited_and_killed_when_they_outstay():
    scene = Scene(concurrency=2, min_children=2)
    scene.ready()
    quick, slow = scene.pool.slots
    scene.pool.retire(quick, now=0.0)
    scene.pool.retire(slow, now=1.0)
    scene.children.gone.add(quick.pid)
    scene.pool.reap_retired(RETIRE_SECONDS + 0.5)
    assert scene.pool.retiring == [(slow.pid, 1.0 + RETIRE_SECONDS)] and scene.children.killed == []
    scene.pool.reap_retired(1.0 + RETIRE_SECONDS)
    assert scene.pool.retiring == [] and scene.children.killed == [slow.pid]


def test_the_pools_deadlines_are_its_timeouts_kill_times_and_next_shrink():
    scene = Scene(concurrency=3, min_children=1, idle_seconds=10)
    scene.pool.grow(3)
    scene.ready()
    timed, retired, idle = scene.pool.slots
    idle.idle_since = 40.0
    scene.pool.start_task(timed, task(7, timeout=30))
    scene.pool.retire(retired, now=0.0, replace=False)
    assert sorted(scene.pool.deadlines()) == sorted([timed.started + 30, RETIRE_SECONDS, 50.0])
    assert sorted(scene.pool.deadlines(shrinking=False)) == sorted([timed.started + 30, RETIRE_SECONDS])


def test_closing_lets_idle_children_exit_and_kills_busy_ones():
    scene = Scene(concurrency=2, min_children=2)
    scene.ready()
    busy, idle = scene.pool.slots
    scene.pool.start_task(busy, task(7))
    scene.children.gone.add(idle.pid)  # it exits when told to
    scene.pool.close()
    assert idle.conn.sent == [None] and idle.conn.closed
    assert scene.children.killed == [busy.pid]
