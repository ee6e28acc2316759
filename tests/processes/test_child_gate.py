"""Several jobs sent to a real forked child at once (``Pool.start_tasks``): the child begins each
only through its gate (``worker.gate``), so what the worker takes back while the child runs
another job never runs there, and the child then takes new work. A real fork, a real pipe and
``executor.child_main``; no worker role and no database."""

from __future__ import annotations

import json
import selectors
import time

import pytest
from django.test.utils import override_settings

from orchestrator.worker.pool import Pool
from tests.conftest import wait_for
from tests.support import tasks_for_tests  # noqa: F401 - registers the jobs the child runs

REF = "tests.support.tasks_for_tests"


class SelectorLoop:
    """What a pool needs of the worker's loop: watch the children's pipes, call back on a reply."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()

    def watch(self, conn, callback):
        self.selector.register(conn, selectors.EVENT_READ, callback)

    def unwatch(self, conn):
        self.selector.unregister(conn)

    def pump(self, seconds: float) -> None:
        for key, _ in self.selector.select(seconds):
            key.data(key.fileobj)


def job(task_run_id, fn, **kwargs):
    return {"id": task_run_id, "run_id": task_run_id, "task": fn, "number": 1, "timeout": None,
            "spec": {"kind": "python", "call": "job", "ref": f"{REF}:{fn}", "args": [], "kwargs": kwargs}}


def started(path) -> list[str]:
    if not path.exists():
        return []
    return [record["task"] for line in path.read_text().splitlines() if (record := json.loads(line))["event"] == "start"]


@pytest.fixture
def pool(tmp_path):
    replies, died, back = [], [], []
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):
        loop = SelectorLoop()
        pool = Pool(concurrency=1, min_children=1, idle_seconds=60, max_tasks_per_child=0,
                    on_reply=lambda message, reply: replies.append((message["id"], reply[0], reply[2])),
                    on_died=lambda message, how: died.append(message["id"]),
                    on_returned=back.extend)
        pool.start(loop)
        pool.replies, pool.died, pool.back, pool.pump = replies, died, back, loop.pump
        try:
            wait_for(lambda: (loop.pump(0.05), pool.idle_slots())[1], 20, message="the child to be ready")
            yield pool
        finally:
            pool.close()


def test_what_the_worker_took_back_from_a_busy_child_never_runs_there_and_the_child_goes_on(pool, tmp_path):
    path, release = tmp_path / "jobs.jsonl", tmp_path / "release"
    [slot] = pool.slots
    pool.start_tasks(slot, [job(1, "record_until", path=str(path), tag="slow", release=str(release)),
                            job(2, "record_job", path=str(path), tag="second"),
                            job(3, "record_job", path=str(path), tag="third")])
    wait_for(lambda: started(path) == ["slow"], 20, message="the first job to begin")
    back = pool.take_back(slot)
    assert [m["id"] for m in back] == [2, 3] and slot.message["id"] == 1 and slot.queued == []
    release.touch()
    wait_for(lambda: (pool.pump(0.05), pool.replies)[1], 20, message="the first job's outcome")
    assert pool.replies == [(1, 1, "succeeded")] and pool.idle_slots() == [slot]
    # The child is back at its pipe: a new batch runs whole, in its order.
    pool.start_tasks(slot, [job(4, "record_job", path=str(path), tag="fourth"),
                            job(5, "record_job", path=str(path), tag="fifth")])
    wait_for(lambda: (pool.pump(0.05), len(pool.replies) == 3)[1], 20, message="the new batch's outcomes")
    assert [reply[:2] for reply in pool.replies] == [(1, 1), (4, 4), (5, 5)]
    assert started(path) == ["slow", "fourth", "fifth"] and pool.died == [] and pool.back == []


def test_a_child_killed_in_a_batch_fails_the_job_it_ran_and_gives_back_what_it_had_not_begun(pool, tmp_path):
    import os
    import signal

    path, release = tmp_path / "jobs.jsonl", tmp_path / "release"
    [slot] = pool.slots
    pool.start_tasks(slot, [job(1, "record_job", path=str(path), tag="first"),
                            job(2, "record_until", path=str(path), tag="slow", release=str(release)),
                            job(3, "record_job", path=str(path), tag="third")])
    wait_for(lambda: (pool.pump(0.05), started(path) == ["first", "slow"] and pool.replies)[1], 20,
             message="the second job to begin")
    os.kill(slot.pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not pool.died and time.monotonic() < deadline:
        pool.pump(0.05)
    assert pool.died == [2] and [m["id"] for m in pool.back] == [3] and started(path) == ["first", "slow"]
