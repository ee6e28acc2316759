"""A dataset's page: its lineage drawn (producers → dataset → consumers), and an event recorded by
hand by an operator after a confirmation that names the workflows it starts, written to the audit
log, started like a producer's event; the same through the API; Viewers see and do none of it."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from orchestrator import access, clock, datasets
from orchestrator.models import AuditEvent, ConsumerRun, DatasetEvent, Run
from orchestrator.sync import sync_workflows
from orchestrator.web import lineage
from tests.test_grid import user

pytestmark = pytest.mark.django_db
NAME = "regional_sales_daily"


@pytest.fixture
def synced():
    sync_workflows()


def text(response) -> str:
    return html.unescape(response.content.decode())


def test_the_page_draws_producers_the_dataset_and_consumers(client, synced):
    client.force_login(user("victor", access.VIEWERS))
    page = text(client.get(lineage.url(NAME)))
    assert f"lineage of dataset {NAME}" in page
    assert 'aria-label="regional_sales.publish: producer"' in page
    assert 'aria-label="sales_dashboard: consumer"' in page
    assert f"<title>{NAME}: dataset</title>" in page
    # A viewer gets no form.
    assert 'id="record-event"' not in page


def test_an_operator_records_an_event_after_confirming_and_its_consumer_starts(client, synced):
    client.force_login(user("olivia", access.OPERATORS))
    assert 'id="record-event"' in text(client.get(lineage.url(NAME)))
    url = reverse("orchestrator:web:dataset_event")

    # First the confirmation, naming what it starts; nothing recorded yet.
    response = client.post(url, {"name": NAME, "metadata": '{"rows": 120}'})
    assert response.status_code == 200
    page = text(response)
    assert f"Record an event of {NAME}?" in page and "sales_dashboard" in page
    assert not DatasetEvent.objects.exists()

    response = client.post(url, {"name": NAME, "metadata": '{"rows": 120}', "confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == lineage.url(NAME)
    event = DatasetEvent.objects.get()
    assert event.metadata == {"rows": 120} and event.task_run_id is None and not event.handled
    record = AuditEvent.objects.get(action="dataset_event")
    assert record.actor_name == "olivia" and record.detail == {"dataset": NAME, "metadata": {"rows": 120}}
    assert "recorded by hand" in text(client.get(lineage.url(NAME)))

    # The scheduler's step turns it into a run of the consumer, as for a producer's event.
    datasets.trigger_consumers(clock.now())
    consumer = ConsumerRun.objects.get(event=event)
    assert consumer.workflow.name == "sales_dashboard" and Run.objects.filter(pk=consumer.run_id).exists()


@pytest.mark.parametrize(("metadata", "says"), [
    ("{not json", "metadata is not valid JSON"), ("[1, 2]", "metadata must be a JSON object"),
    ('{"x": NaN}', "metadata:"),
])
def test_bad_metadata_is_refused_next_to_its_field_and_records_nothing(client, synced, metadata, says):
    client.force_login(user("olivia", access.OPERATORS))
    response = client.post(reverse("orchestrator:web:dataset_event"), {"name": NAME, "metadata": metadata,
                                                                       "confirm": "yes"})
    assert response.status_code == 400
    assert says in text(response) and 'aria-invalid="true"' in text(response)
    assert not DatasetEvent.objects.exists() and not AuditEvent.objects.filter(action="dataset_event").exists()


def test_an_unknown_dataset_or_a_viewer_records_nothing(client, synced):
    client.force_login(user("olivia", access.OPERATORS))
    url = reverse("orchestrator:web:dataset_event")
    assert client.post(url, {"name": "nope", "confirm": "yes"}).status_code == 404
    assert client.post(url, {"confirm": "yes"}).status_code == 400
    client.force_login(user("victor", access.VIEWERS))
    assert client.post(url, {"name": NAME, "confirm": "yes"}).status_code == 403
    assert not DatasetEvent.objects.exists()


def test_the_api_records_an_event_for_operators_only(client, synced):
    url = reverse("orchestrator:api:dataset-events")
    client.force_login(user("victor", access.VIEWERS))
    assert client.post(url, {"dataset": NAME}, content_type="application/json").status_code == 403
    client.force_login(user("olivia", access.OPERATORS))
    response = client.post(url, {"dataset": NAME, "metadata": {"day": "2026-03-01"}}, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["dataset"] == NAME and response.json()["metadata"] == {"day": "2026-03-01"}
    assert AuditEvent.objects.get(action="dataset_event").source == "api"
    assert client.post(url, {"dataset": "nope"}, content_type="application/json").status_code == 404
    response = client.post(url, {"dataset": NAME, "metadata": [1]}, content_type="application/json")
    assert response.status_code == 400 and "metadata" in response.json()
    assert DatasetEvent.objects.count() == 1
