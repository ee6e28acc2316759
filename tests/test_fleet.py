"""A fleet costs the database per job, not per worker (``orchestrator.worker.wakeup``).

The ring and the back-off are checked alone first; then real worker processes on a PostgreSQL
server of the test's own, which logs every statement of the test's database, so the claims are
counted from the server's own log: per job at a steady arrival rate with 1, 8 and 32 idle workers,
by workers of another queue, and a row that became due with no notification at all.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from orchestrator import clock
from orchestrator.channels import parse_wake, queue_channel
from orchestrator.clock import FakeClock
from orchestrator.worker import Worker as WorkerLoop
from orchestrator.worker.wakeup import BACKOFF_MAX_SECONDS, Ring, Wakeup
from tests.conftest import ROOT, process_env, wait_for
from tests.support.pgcluster import OwnCluster

# --- the ring, alone ------------------------------------------------------------------------------


def _fleet(concurrencies: list[int]) -> list[Ring]:
    """Every worker's view of one queue's ring, as RING reads it for each."""
    size = sum(concurrencies)
    return [Ring(size=size, offset=sum(concurrencies[:i]), places=c, workers=len(concurrencies), rank=i)
            for i, c in enumerate(concurrencies)]


@pytest.mark.parametrize("concurrencies", [[1] * 7, [4, 1, 2, 16, 1], [3]])
def test_each_named_place_has_one_owner_whatever_the_token(concurrencies):
    rings = _fleet(concurrencies)
    size = rings[0].size
    for count in range(1, size):
        for token in range(count - 1, count - 1 + 3 * size):
            shares = [ring.share(count, token) for ring in rings]
            # Exactly as many slots answer as rows became due, none twice.
            assert sum(shares) == count, (count, token, shares)
            assert all(0 <= share <= ring.places for share, ring in zip(shares, rings, strict=True))
    # A count that covers the ring names everyone.
    assert {ring.share(size, 12345) for ring in rings} == {None}


def test_the_turns_go_round_the_fleet():
    rings = _fleet([1] * 5)
    answered = [next(i for i, ring in enumerate(rings) if ring.share(1, token)) for token in range(100, 110)]
    # One row at a time: each worker in turn, the one asked least recently first.
    assert answered == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    # A worker of concurrency 3 among two of 1 gets three turns in five.
    rings = _fleet([1, 3, 1])
    owners = [next(i for i, ring in enumerate(rings) if ring.share(1, token)) for token in range(0, 5)]
    assert owners == [0, 1, 1, 1, 2]


def test_polls_take_turns_one_interval_each():
    rings = _fleet([1] * 4)
    # From the same instant, each worker's next turn is a different interval of the next four.
    turns = sorted(ring.next_poll(1000.3, 1.0) for ring in rings)
    assert turns == [1001.0, 1002.0, 1003.0, 1004.0]
    # And after its turn, the next one is a whole round later.
    assert rings[1].next_poll(rings[1].next_poll(1000.3, 1.0), 1.0) == rings[1].next_poll(1000.3, 1.0) + 4


def test_reading_the_rings_again_never_puts_off_a_planned_poll():
    # A worker that listens plans its poll for its next turn after each claim. Its heartbeat
    # reads the rings again as often as every poll interval (here: twice per interval); each
    # read may move the turn, but never past a poll already planned, or the poll would never come
    # and a row whose notification was missed (a retry due in 50 ms) would wait for ever.
    start = datetime.fromtimestamp(1000.3, UTC)
    with clock.pinned(FakeClock(start)) as fake:
        worker = WorkerLoop(["default"], poll=1.0)
        worker.loop = SimpleNamespace(listener=object())
        worker.wakeup.rings = {queue_channel("default"): _fleet([2])[0]}
        mono = 50.0
        worker.last_claim = mono
        worker.plan_poll(mono)  # after a claim: the next turn, the interval starting at 1001.0
        assert worker.next_poll == pytest.approx(50.7)
        for _ in range(4):
            mono += 0.5
            fake.advance(0.5)
            worker.plan_poll(mono, keep_sooner=True)  # a heartbeat read the rings
            assert worker.next_poll == pytest.approx(50.7)
        assert mono >= worker.next_poll  # due: the next tick looks for work
        worker.plan_poll(mono)  # that look was a claim: the turn after it
        assert worker.next_poll == pytest.approx(mono + 1.0 - 0.3)


def test_answers_never_put_off_the_poll_and_a_look_that_found_the_rows_held_looks_again_soon():
    start = datetime.fromtimestamp(1000.3, UTC)
    with clock.pinned(FakeClock(start)) as fake:
        worker = WorkerLoop(["default"], poll=1.0)
        worker.loop = SimpleNamespace(listener=object())
        worker.wakeup.rings = {queue_channel("default"): _fleet([1, 1])[0]}
        mono = 50.0
        worker.plan_poll(mono)
        planned = worker.next_poll
        worker.batch.claimed_next_due = fake.now()  # more is due: a backlog
        # It answers a notification of one job every 50 ms (the rest of the backlog is named by
        # none): each answer looked at what it named, not at the queue, so the poll, which will
        # find the backlog, stays planned rather than moving on at every answer.
        answers = 0
        while mono + 0.05 < planned:
            mono += 0.05
            fake.advance(0.05)
            worker.after_claim(mono, 1, 1, answering=True)
            answers += 1
            assert worker.next_poll == pytest.approx(planned)
        assert answers >= 10
        # A look of its own that found every row it read held by another worker's claim in
        # flight, while more is due: it looks again after the back-off, not at its next turn.
        worker.after_claim(mono, 90, 0, answering=False)
        assert not worker.want_claim and mono < worker.next_due <= mono + BACKOFF_MAX_SECONDS
        # An answer that found none leaves the rows to their holders (and backs off).
        worker.next_due = float("inf")
        worker.after_claim(mono, 1, 0, answering=True)
        assert worker.next_due == float("inf")


def test_a_notification_that_counted_nothing_or_a_ring_unknown_wakes_everyone():
    channel = queue_channel("default")
    wakeup = Wakeup(concurrency=2, poll=1.0)
    wakeup.notified(channel, "3 7")  # no ring read yet
    assert wakeup.everyone and wakeup.claim_size(2) == 2
    wakeup = Wakeup(concurrency=2, poll=1.0)
    wakeup.rings = {channel: _fleet([2, 2, 2])[1]}
    wakeup.notified(channel, "")
    assert wakeup.everyone
    assert parse_wake("") is None and parse_wake("x 1") is None and parse_wake("0 5") is None
    assert parse_wake("3 17") == (3, 17)


def test_a_notification_for_other_places_leaves_the_worker_asleep_and_its_own_are_claimed():
    channel = queue_channel("default")
    wakeup = Wakeup(concurrency=2, poll=1.0)
    wakeup.rings = {channel: _fleet([2, 2, 2])[1]}  # places 2 and 3 of 6
    wakeup.notified(channel, "1 0")  # names place 0
    assert not wakeup.asked(now=0.0)
    wakeup.notified(channel, "2 3")  # names places 2 and 3
    assert wakeup.asked(now=0.0) and wakeup.claim_size(idle=2) == 2 and wakeup.claim_size(idle=1) == 1


def test_places_named_more_often_than_the_worker_has_slots_stay_owed_until_claimed():
    # Twenty jobs enqueued in twenty transactions: twenty notifications of one row each, all
    # naming this worker's places. It claims two (its slots), and owes the other eighteen: it
    # claims them as its slots free, instead of leaving them to the next poll.
    channel = queue_channel("default")
    wakeup = Wakeup(concurrency=2, poll=1.0)
    wakeup.rings = {channel: _fleet([2])[0]}  # the only worker: both places
    for token in range(20):
        wakeup.notified(channel, f"1 {token}")
    assert wakeup.claim_size(idle=2) == 2
    wakeup.after_claim(2, 2, now=0.0, answering=True, due_now=True)
    assert wakeup.asked(now=0.0) and wakeup.claim_size(idle=1) == 1
    wakeup.after_claim(1, 1, now=0.0, answering=True, due_now=True)
    assert wakeup.owed == 17
    # A claim that comes back short (others took the rows) forgets the rest.
    wakeup.after_claim(1, 0, now=0.0, answering=True, due_now=False)
    assert not wakeup.asked(now=1.0)


def test_an_empty_answer_backs_off_with_jitter_and_claims_what_came_meanwhile_once():
    channel = queue_channel("default")
    waits = []
    for draw in (0.0, 1.0):
        wakeup = Wakeup(concurrency=1, poll=1.0, rng=lambda draw=draw: draw)
        wakeup.rings = {channel: _fleet([1, 1])[0]}
        wakeup.notified(channel, "1 0")
        wakeup.after_claim(1, 0, now=10.0, answering=True, later=False)  # found nothing
        waits.append(wakeup.quiet_until - 10.0)
        wakeup.notified(channel, "1 2")  # its turn again, during the back-off
        assert not wakeup.asked(now=10.0)
        assert wakeup.asked(now=wakeup.quiet_until) and wakeup.claim_size(1) == 1
    assert 0 < waits[0] < waits[1]  # jitter: half fixed, half drawn
    # Empty answers in a row wait longer, up to the cap; one that finds work starts again.
    wakeup = Wakeup(concurrency=1, poll=1.0, rng=lambda: 1.0)
    for _ in range(20):
        wakeup.after_claim(1, 0, now=0.0, answering=True, later=False)
    assert wakeup.quiet_until == pytest.approx(BACKOFF_MAX_SECONDS)
    wakeup.after_claim(1, 1, now=0.0, answering=True, later=False)
    wakeup.after_claim(1, 0, now=0.0, answering=True, later=False)
    assert wakeup.quiet_until < BACKOFF_MAX_SECONDS
    # A poll that finds nothing is no answer: no back-off.
    wakeup = Wakeup(concurrency=1, poll=1.0)
    wakeup.after_claim(1, 0, now=5.0, answering=False, later=False)
    assert wakeup.quiet_until == 0.0


# --- real workers, claims counted by the server -----------------------------------------------------

# A claim as the server logs it (log_statement = all): the statement, on the lines after the
# log line's head, begins with its first CTE.
CLAIM_LOGGED = re.compile(r"LOG:\s+(?:execute [^:]*|statement):\s*WITH RECURSIVE admitted AS MATERIALIZED")
DB = "fleet"


class LoggedServer:
    """A server of the test's own whose log holds every statement of one database."""

    def __init__(self):
        self.cluster = OwnCluster()
        self.cluster.create_database(DB)
        self.url = self.cluster.url(DB)
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"], cwd=ROOT,
                       env=process_env(DATABASE_URL=self.url), check=True, timeout=300)
        with self.cluster.connect(DB, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {DB} SET log_statement = 'all'")
        self.log = self.cluster.pgdata / "log"
        assert self.log.exists(), "the server's log is not where OwnCluster's server writes it"

    def mark(self) -> int:
        return self.log.stat().st_size

    def claims_since(self, mark: int) -> int:
        with open(self.log, "rb") as log:
            log.seek(mark)
            return len(CLAIM_LOGGED.findall(log.read().decode(errors="replace")))

    def query(self, sql: str, params=()):
        with self.cluster.connect(DB, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def destroy(self):
        self.cluster.destroy()


@pytest.fixture
def logged_server():
    server = LoggedServer()
    try:
        yield server
    finally:
        server.destroy()


def _start_fleet(processes, server, workers: int, queue: str = "default", **env):
    fleet = processes.start_python("-m", "tests.support.fleet_for_tests", str(workers), "1", queue,
                                   env=process_env(DATABASE_URL=server.url, **env), name=f"fleet{workers}")

    def ready():
        assert fleet.poll() is None, processes.output(fleet)
        return server.query("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")[0][0] == workers

    wait_for(ready, timeout=60, message=f"{workers} workers to register")
    return fleet


def _arrive(processes, server, jobs: int, rate: float, queue: str = "default") -> None:
    arrivals = processes.start_python("-m", "tests.support.arrivals_for_tests", str(jobs), str(rate), queue,
                                      env=process_env(DATABASE_URL=server.url), name="arrivals")
    assert arrivals.wait(timeout=120) == 0, processes.output(arrivals)


def _succeeded(server) -> int:
    return server.query("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'succeeded'")[0][0]


JOBS = 80
RATE = 20.0  # jobs per second: one every 50 ms, each its own transaction and notification


@pytest.mark.slow
@pytest.mark.own_server
def test_claims_per_job_stay_flat_from_one_idle_worker_to_thirty_two(processes, logged_server):
    server = logged_server
    per_job = {}
    for workers in (1, 8, 32):
        start = server.mark()
        fleet = _start_fleet(processes, server, workers)
        # Every worker has made its first claim (and read the ring with the others on it).
        wait_for(lambda start=start, workers=workers: server.claims_since(start) >= workers, timeout=30,
                 message="first claims")
        before = _succeeded(server)
        mark = server.mark()
        began = time.monotonic()
        _arrive(processes, server, JOBS, RATE)
        wait_for(lambda before=before: _succeeded(server) == before + JOBS, timeout=60,
                 message=f"{JOBS} jobs to succeed with {workers} workers")
        # The fleet also polls, about once per second between all its workers: on a loaded machine
        # the 80 jobs take longer than their 4 s, and those polls are not claims made per job.
        polls = time.monotonic() - began + 2
        per_job[workers] = max(0.0, server.claims_since(mark) - polls) / JOBS
        assert processes.stop(fleet, timeout=60) == 0, processes.output(fleet)
    # About one claim per job, whatever the number of idle workers (before, each of them claimed at
    # every notification: 32 workers made about 32 claims per job). On a machine so loaded that
    # heartbeats come late, views of the ring differ for a moment and a few notifications wake more
    # than their slots (2.4 claims per job seen with 32 workers, two test suites at once on 2 cores).
    assert all(claims <= 3 for claims in per_job.values()), per_job
    assert max(per_job.values()) - min(per_job.values()) <= 1.5, per_job


@pytest.mark.slow
@pytest.mark.own_server
def test_idle_workers_of_another_queue_make_no_claim_per_job(processes, logged_server):
    server = logged_server
    fleet = _start_fleet(processes, server, 8, queue="reports")
    wait_for(lambda: server.claims_since(0) >= 8, timeout=30, message="first claims")
    mark = server.mark()
    began = time.monotonic()
    _arrive(processes, server, JOBS, RATE, queue="default")  # no worker serves it: the jobs wait
    claims = server.claims_since(mark)
    elapsed = time.monotonic() - began
    # Only the fleet's poll, about once per second between all eight (it was once per second each:
    # 8 per second). The turns settle while the eight workers' first heartbeats put them on the ring,
    # which may bring a turn forward a few times (up to five in a full suite on a loaded machine).
    assert claims <= elapsed / 1.0 + 6, (claims, elapsed)
    assert server.query("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'scheduled'")[0][0] == JOBS
    assert processes.stop(fleet, timeout=60) == 0, processes.output(fleet)


# A job's run and task run, due now, inserted with no notification: as if every one was lost.
SILENT_JOB = """
WITH r AS (
    INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason,
                                  payload_hash, created_at)
    VALUES (now(), 'job', '{}', 'default', 0, 0, 'running', '', '', now()) RETURNING id
)
INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                  max_attempts, due_at, error, created_at)
SELECT id, 'tests.support.tasks_for_tests:no_argument', 'scheduled',
       '{"kind": "python", "ref": "tests.support.tasks_for_tests:no_argument", "call": "job", "args": [], "kwargs": {}}',
       '{}', 'default', 0, 'default', 0, 0, 1, now(), '', now()
FROM r RETURNING id
"""


@pytest.mark.slow
@pytest.mark.own_server
def test_a_row_whose_notification_was_lost_runs_within_the_poll_interval(processes, logged_server):
    server = logged_server
    poll = 1.0
    fleet = _start_fleet(processes, server, 8, ORCHESTRATOR_POLL_SECONDS=poll)
    wait_for(lambda: server.claims_since(0) >= 8, timeout=30, message="first claims")
    delays = []
    for _ in range(3):
        (task_run_id,) = server.query(SILENT_JOB)[0]
        wait_for(lambda task_run_id=task_run_id: server.query(
            "SELECT state = 'succeeded' FROM orchestrator_taskrun WHERE id = %s", [task_run_id])[0][0],
            timeout=30, message="the silent job to run")
        # From the database's own timestamps: when it became due, when a worker claimed it.
        delays.append(server.query("SELECT extract(epoch FROM started_at - due_at) FROM orchestrator_taskrun "
                                   "WHERE id = %s", [task_run_id])[0][0])
    # The fleet's polls take turns, but some worker looks in every interval.
    assert all(float(delay) <= poll + 0.5 for delay in delays), delays
    assert processes.stop(fleet, timeout=60) == 0, processes.output(fleet)
