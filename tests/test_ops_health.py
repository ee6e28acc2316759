"""/healthz and /readyz: which check failed and why, on a real PostgreSQL."""

from datetime import timedelta

import pytest

from orchestrator import clock
from orchestrator.models import Lease, Worker

pytestmark = pytest.mark.django_db


def add_worker(name="w1", heartbeat_age=0.0, state=Worker.State.RUNNING):
    now = clock.now()
    return Worker.objects.create(
        name=name, host="h", pid=1, queues=["default"], state=state,
        started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=heartbeat_age),
    )


def hold_lease(expires_in=15.0, holder="scheduler@h:1", epoch=3):
    now = clock.now()
    return Lease.objects.update_or_create(
        name="scheduler",
        defaults={"holder": holder, "epoch": epoch, "acquired_at": now, "expires_at": now + timedelta(seconds=expires_in)},
    )[0]


def test_healthz_answers_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.time_sensitive
def test_readyz_passes_when_a_lease_is_held_and_a_worker_is_alive(client):
    hold_lease()
    add_worker(heartbeat_age=2)
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ready"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True, "scheduler": True, "workers": True
    }
    assert "scheduler@h:1" in body["checks"]["scheduler"]["message"]
    assert body["checks"]["workers"]["message"] == "1 worker sent a heartbeat in the last 30 s"


@pytest.mark.time_sensitive
def test_readyz_fails_naming_the_workers_when_every_heartbeat_is_stale(client, settings):
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS = 30.0
    hold_lease()
    add_worker("stale", heartbeat_age=45)
    # A stopped worker's recent heartbeat does not count: it will not take work.
    add_worker("stopped", heartbeat_age=1, state=Worker.State.STOPPED)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["workers"] == {"ok": False, "message": "no worker has sent a heartbeat in the last 30 s"}
    assert body["checks"]["scheduler"]["ok"] is True
    assert body["failed"] == ["workers: no worker has sent a heartbeat in the last 30 s"]


@pytest.mark.time_sensitive
def test_readyz_fails_when_no_scheduler_ever_held_the_lease(client):
    add_worker()
    response = client.get("/readyz")
    assert response.status_code == 503
    check = response.json()["checks"]["scheduler"]
    assert check["ok"] is False
    assert check["message"] == "no scheduler has ever held the lease: is a scheduler process running?"


@pytest.mark.time_sensitive
def test_readyz_fails_when_the_lease_has_expired(client):
    add_worker()
    hold_lease(expires_in=-20, holder="scheduler@old:7")
    response = client.get("/readyz")
    assert response.status_code == 503
    message = response.json()["checks"]["scheduler"]["message"]
    assert message.startswith("the scheduler lease expired ")
    assert "(last holder scheduler@old:7): no scheduler is running" in message


@pytest.mark.time_sensitive
def test_probes_answer_an_unlisted_host_over_plain_http(client, settings):
    # A container runtime probes http://10.0.0.7:8000/healthz: neither the host check nor
    # the HTTPS redirect may turn that into a 400 or a 301.
    settings.ALLOWED_HOSTS = ["orchestrator.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    hold_lease()
    add_worker()
    assert client.get("/healthz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    assert client.get("/readyz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    # Every other page still gets both protections.
    assert client.get("/admin/", HTTP_HOST="10.0.0.7:8000").status_code == 400
    assert client.get("/admin/", HTTP_HOST="orchestrator.example.com").status_code == 301


@pytest.mark.time_sensitive
@pytest.mark.django_db(transaction=True)
def test_readyz_and_metrics_say_so_when_the_database_does_not_answer(client):
    from django.db import connection
    from prometheus_client.parser import text_string_to_metric_families

    original = dict(connection.settings_dict)
    connection.close()
    # Nothing listens on port 1: every query of the request fails to connect.
    connection.settings_dict.update(HOST="127.0.0.1", PORT="1")
    try:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        metrics = client.get("/metrics")
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] is False
    assert checks["database"]["message"].startswith("the database does not answer: ")
    assert checks["scheduler"] == {"ok": False, "message": "not checked: the database does not answer"}
    assert checks["workers"] == {"ok": False, "message": "not checked: the database does not answer"}
    assert metrics.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(metrics.content.decode())}
    assert set(families) == {"orchestrator_database_up"}
    assert families["orchestrator_database_up"].samples[0].value == 0
