"""The loop every role runs on: back-off with jitter up to a cap, one log line per database outage
whatever the error's kind, the role's reconnect step, and signals that end the wait at once."""

from __future__ import annotations

import logging
import os
import signal
import time

import psycopg
import pytest
from django.db import InterfaceError, OperationalError

from orchestrator.loop import Backoff, Loop, Role


def test_the_back_off_doubles_up_to_the_cap_with_half_of_each_delay_random():
    low = Backoff(first=0.2, cap=1.0, rng=lambda: 0.0)
    assert [low.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    high = Backoff(first=0.2, cap=1.0, rng=lambda: 1.0)
    assert [high.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    high.reset()
    assert high.next() == 0.2


def test_the_back_off_stays_at_its_cap_through_any_number_of_failures():
    backoff = Backoff(first=0.2, cap=30.0, rng=lambda: 1.0)
    assert [backoff.next() for _ in range(5000)][-1] == 30.0


class Flaky(Role):
    """Fails with a different kind of database error on each of its first ticks."""

    role = "flaky"

    def __init__(self, errors):
        self.errors = list(errors)
        self.ticks = 0
        self.reconnects = 0
        self.memory = []  # what a worker keeps: outcomes not yet recorded

    def tick(self) -> bool:
        self.ticks += 1
        self.memory.append(self.ticks)
        if self.errors:
            raise self.errors.pop(0)
        return False

    def next_wait(self) -> float:
        return 0.0

    def reconnected(self) -> None:
        self.reconnects += 1

    def finished(self, stop_requests: int) -> bool:
        return self.ticks >= 6


@pytest.mark.django_db
def test_any_database_error_is_one_outage_logged_once_then_reconnected_and_resumed(caplog):
    errors = [OperationalError("server closed the connection unexpectedly"),
              psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
              InterfaceError("connection already closed")]
    role = Flaky(errors)
    delays = []
    backoff = Backoff(first=0.001, cap=0.004, rng=lambda: 1.0)
    original = backoff.next
    backoff.next = lambda: delays.append(original()) or delays[-1]
    with caplog.at_level(logging.DEBUG, logger="orchestrator.loop"):
        Loop(role, poll=0, backoff=backoff, handle_signals=False).run()
    # Three failures in a row back off 1, 2, 4 ms (the cap), then the loop resumes.
    assert delays == [0.001, 0.002, 0.004]
    assert role.ticks == 6 and role.memory == [1, 2, 3, 4, 5, 6]  # nothing the role held was dropped
    assert role.reconnects == 3  # before each retry, once a new connection was made
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["flaky: database error (OperationalError: server closed the connection unexpectedly); "
                        "retrying with back-off up to 0.004s, keeping the work in memory"]
    assert any("flaky: the database answers again after" in r.getMessage() for r in caplog.records)


class Sleepy(Role):
    role = "sleepy"

    def __init__(self):
        self.ticks = 0

    def tick(self) -> bool:
        self.ticks += 1
        os.kill(os.getpid(), signal.SIGTERM)  # as if from outside, during the tick
        return False

    def next_wait(self) -> float:
        return 60.0


@pytest.mark.django_db
def test_sigterm_ends_the_wait_at_once_and_stops_the_loop_after_the_tick():
    previous = signal.getsignal(signal.SIGTERM)
    began = time.monotonic()
    role = Sleepy()
    Loop(role, poll=60).run()
    assert role.ticks == 1
    assert time.monotonic() - began < 30  # not the 60 s wait
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back


class Recorder(Role):
    """Records what the loop hands it; finished after ``ticks`` ticks."""

    def __init__(self, role, channels, wait, ticks=3, poll=None):
        self.role, self.channels, self.wait, self.ticks_left = role, channels, wait, ticks
        self.poll = poll
        self.notes, self.ticks, self.started, self.stopped = [], 0, False, False

    def start(self, loop):
        self.started = True

    def tick(self) -> bool:
        self.ticks += 1
        return False

    def next_wait(self):
        return self.wait

    def notified(self, notifies):
        self.notes += [note.channel for note in notifies]

    def finished(self, stop_requests):
        return self.ticks >= self.ticks_left

    def stop(self):
        self.stopped = True


def test_roles_together_on_one_loop_keep_their_own_channels_waits_and_ends():
    from types import SimpleNamespace

    from orchestrator.loop import Together

    scheduler = Recorder("scheduler", ("schedules",), wait=5.0, ticks=2)
    dispatcher = Recorder("dispatcher", ("dispatch",), wait=None, ticks=4, poll=0.25)
    both = Together(scheduler, dispatcher)
    assert both.role == "scheduler+dispatcher" and both.channels == ("schedules", "dispatch")
    both.start(SimpleNamespace(poll=9.0))
    assert scheduler.started and dispatcher.started
    # The earliest wait wins; a role's None is its own poll.
    assert both.next_wait() == 0.25
    both.notified([SimpleNamespace(channel="dispatch"), SimpleNamespace(channel="schedules"),
                   SimpleNamespace(channel="dispatch")])
    assert scheduler.notes == ["schedules"] and dispatcher.notes == ["dispatch", "dispatch"]
    # Done only when every role is done; each ticks on every turn.
    both.tick(), both.tick()
    assert not both.finished(1)
    both.tick(), both.tick()
    assert both.finished(1) and scheduler.ticks == dispatcher.ticks == 4
    both.stop()
    assert scheduler.stopped and dispatcher.stopped


class Choosy(Role):
    """Has nothing to do for notifications saying "not me"."""

    role = "choosy"
    channels = ("orchestrator_test_choosy",)

    def __init__(self):
        self.notes = []

    def tick(self) -> bool:
        return False

    def notified(self, notifies):
        self.notes += [note.payload for note in notifies]
        return any(note.payload == "me" for note in notifies)


@pytest.mark.django_db(transaction=True)
def test_a_notification_the_role_has_nothing_to_do_for_does_not_end_the_wait():
    from orchestrator.channels import listen_params

    role = Choosy()
    loop = Loop(role, poll=60, handle_signals=False)
    loop._ensure_listener()
    try:
        with psycopg.connect(**listen_params(), autocommit=True) as sender:
            sender.execute("SELECT pg_notify('orchestrator_test_choosy', 'not me')")
            began = time.monotonic()
            loop.wait(0.5)
            # Read, and waited on to the end: a fleet's other workers stay asleep.
            assert role.notes == ["not me"] and time.monotonic() - began >= 0.5
            sender.execute("SELECT pg_notify('orchestrator_test_choosy', 'me')")
            began = time.monotonic()
            loop.wait(30)
            assert role.notes == ["not me", "me"] and time.monotonic() - began < 30
    finally:
        loop._close_listener()
