"""The peers benchmark's CPU split: what the PostgreSQL server and this process's tree spent."""

import subprocess
import sys

import pytest
from django.db import connection

from orchestrator.bench import peers

pytestmark = pytest.mark.django_db


def test_a_process_tree_counts_its_live_and_its_reaped_descendants():
    # pid -> (parent, CPU of itself and of its reaped children)
    table = {1: (0, 5.0), 10: (1, 1.0), 11: (10, 0.5), 12: (10, 0.25), 20: (2, 7.0)}
    assert peers._tree_cpu(10, table) == 1.75
    assert peers._tree_cpu(1, table) == 6.75
    assert peers._tree_cpu(99, table) == 0.0


def test_the_server_s_cpu_and_this_process_tree_s_are_read_apart():
    server = peers._server_pid()
    if server is None:
        pytest.skip("the test database's server is not on this machine")
    before = peers.cpu_now(server)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    middle = peers.cpu_now(server)
    # A child that burns CPU and is reaped counts in this process's tree. (The server's figure
    # takes in every database of it: other tests' work too, so only its lower bound is checked.)
    subprocess.run([sys.executable, "-c", "sum(range(20_000_000))"], check=True)
    after = peers.cpu_now(server)
    server_work, _ = peers.cpu_per_job(before, middle, 1)
    _, python = peers.cpu_per_job(middle, after, 1)
    assert server_work >= 50_000  # microseconds: three million rows counted
    assert python >= 200_000  # twenty million additions in a child
    assert peers.cpu_per_job((None, 0.0), (None, 1.0), 4) == (None, 250_000.0)
