"""The scheduler lease on a real PostgreSQL: one holder at a time, epochs that fence a lapsed
leader's writes, and an immediate handover on release."""

import threading
import time

import pytest
from django.db import connection

from orchestrator.lease import LeaderLease, LeaseLost
from orchestrator.models import Lease

pytestmark = pytest.mark.django_db


def expire(name="scheduler"):
    # The lease compares with the database clock, so a lapse is simulated on the row itself.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orchestrator_lease SET expires_at = clock_timestamp() - interval '1 second' WHERE name = %s", [name])


def test_only_one_process_holds_the_lease_until_it_expires():
    a, b = LeaderLease(holder="a", seconds=15), LeaderLease(holder="b", seconds=15)
    assert a.acquire() is True
    assert b.acquire() is False
    assert b.ensure() is False
    row = Lease.objects.get(name="scheduler")
    assert (row.holder, row.epoch) == ("a", 1)
    # It runs for the configured time, measured by the database clock.
    assert 14 <= (row.expires_at - row.acquired_at).total_seconds() <= 15.5

    expire()
    assert b.acquire() is True
    row.refresh_from_db()
    assert (row.holder, row.epoch) == ("b", 2)


def test_renewal_extends_the_lease_and_fails_once_another_holder_took_over():
    a, b = LeaderLease(holder="a", seconds=15), LeaderLease(holder="b", seconds=15)
    a.acquire()
    before = Lease.objects.get().expires_at
    time.sleep(0.01)
    assert a.renew() is True
    assert Lease.objects.get().expires_at > before

    expire()
    b.acquire()
    # The old leader learns it lost the lease and stops counting itself leader.
    assert a.renew() is False
    assert a.is_leader is False
    assert Lease.objects.get().holder == "b"


def test_a_lapsed_lease_cannot_be_renewed_even_before_anyone_else_takes_it():
    a = LeaderLease(holder="a", seconds=15)
    a.acquire()
    expire()
    # A standby may already believe it can take over: the lapsed leader must not resurrect it.
    assert a.renew() is False
    assert a.acquire() is True
    assert Lease.objects.get().epoch == 2


def test_a_leader_that_lost_the_lease_cannot_open_a_write_transaction():
    a, b = LeaderLease(holder="a", seconds=15), LeaderLease(holder="b", seconds=15)
    a.acquire()
    with a.fence():
        pass
    expire()
    b.acquire()
    a.epoch = 1  # a believes it still leads: the fence check must catch it
    with pytest.raises(LeaseLost), a.fence():
        pytest.fail("the body must not run")


def test_release_hands_over_at_once():
    a, b = LeaderLease(holder="a", seconds=15), LeaderLease(holder="b", seconds=15)
    a.acquire()
    assert b.acquire() is False
    a.release()
    assert b.acquire() is True
    assert Lease.objects.get().epoch == 2


@pytest.mark.django_db(transaction=True)
def test_a_takeover_waits_for_the_leaders_open_write_transaction():
    """The fence holds the lease row FOR SHARE: a standby's takeover cannot slip in between the
    leader's check and its writes."""
    a = LeaderLease(holder="a", seconds=1)
    a.acquire()
    inside, release, taken = threading.Event(), threading.Event(), []

    def leader_writes():
        try:
            with a.fence():
                inside.set()
                release.wait(5)
        finally:
            connection.close()

    thread = threading.Thread(target=leader_writes)
    thread.start()
    assert inside.wait(5)
    time.sleep(1.2)  # the lease lapses (by the database clock) while the transaction is open

    def standby():
        try:
            taken.append(LeaderLease(holder="b", seconds=15).acquire())
        finally:
            connection.close()

    other = threading.Thread(target=standby)
    other.start()
    other.join(0.5)
    assert other.is_alive(), "the takeover must wait for the leader's transaction"
    release.set()
    thread.join(5)
    other.join(5)
    assert taken == [True]
    assert Lease.objects.get().holder == "b"
