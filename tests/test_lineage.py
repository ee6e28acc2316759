"""Datasets seen from outside: the API lists their events (cursor pages, filtered by dataset,
with the consumer runs each started), the lineage pages say who produces and consumes each
dataset and what happened, the workflow page shows its producers and consumers, and the
dashboard lists the runs that missed their deadline."""

import re
from datetime import timedelta
from html import unescape
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils.html import escape

from orchestrator import access
from orchestrator import clock as process_clock
from orchestrator.models import Dataset, DatasetEvent, Run
from orchestrator.runs import trigger_workflow
from tests.support.api_support import client_for, make_user
from tests.support.features_support import scheduler_tick, worker_loop
from tests.test_datasets import MODULE, consumer_runs, produce

pytestmark = pytest.mark.django_db


@pytest.fixture
def wfs(tmp_path):
    from tests.support.features_support import sync_module

    return sync_module(tmp_path, MODULE.format(consumer_options=""))


@pytest.fixture
def loop(db):
    return worker_loop()


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vera", password="pw-vera")
    access.add_to_group(user, access.VIEWERS)
    client.force_login(user)
    return user


@pytest.fixture
def api():
    return client_for(make_user("victor", access.VIEWERS))


def produced(wfs, clock, loop, times=1):
    for rows in range(times):
        produce(wfs, clock, loop, rows=rows)
        clock.advance(seconds=60)
    scheduler_tick(clock)


@pytest.mark.time_sensitive
def test_the_api_lists_dataset_events_newest_first_with_the_runs_they_started(wfs, clock, loop, api):
    produced(wfs, clock, loop, times=3)
    produce(wfs, clock, loop, name="fx")
    scheduler_tick(clock)
    body = api.get("/api/dataset-events/", {"dataset": "sales_daily"}).json()
    assert [e["dataset"] for e in body["results"]] == ["sales_daily"] * 3
    assert [e["metadata"] for e in body["results"]] == [{"rows": 2}, {"rows": 1}, {"rows": 0}]
    newest = body["results"][0]
    event = DatasetEvent.objects.get(pk=newest["id"])
    assert (newest["workflow"], newest["task"], newest["run"], newest["task_run"]) == (
        "producer", "publish", event.run_id, event.task_run_id)
    # Each event started one run of "consumer"; "joined" (mode all) took every pending
    # sales_daily event with the fx_rates one, in a single run.
    [consumer] = [c for c in newest["consumer_runs"] if c["workflow"] == "consumer"]
    assert consumer["run"] in [r.pk for r in consumer_runs("consumer")]
    [joined_run] = consumer_runs("joined")
    assert all(any(c == {"workflow": "joined", "run": joined_run.pk, "consumed_at": c["consumed_at"]}
                   for c in e["consumer_runs"]) for e in body["results"])
    # All datasets, and cursor pages of one event each that walk them all once.
    assert len(api.get("/api/dataset-events/").json()["results"]) == 7  # 3 x (daily, audit) + fx_rates
    seen, url = [], "/api/dataset-events/?limit=1"
    for _ in range(10):
        page = api.get(url).json()
        seen += [e["id"] for e in page["results"]]
        if not page["next"]:
            break
        url = page["next"]
    assert seen == sorted(DatasetEvent.objects.values_list("id", flat=True), reverse=True)
    assert [e["dataset"] for e in api.get("/api/dataset-events/", {"workflow": "fx"}).json()["results"]] == ["fx_rates"]


@pytest.mark.time_sensitive
def test_the_event_list_refuses_bad_filters_and_names_an_unknown_dataset(wfs, api, anonymous_api):
    response = api.get("/api/dataset-events/", {"dataset": "nope"})
    assert response.status_code == 404 and response.json()["dataset"] == ["unknown dataset 'nope'"]
    response = api.get("/api/dataset-events/", {"since": "yesterday"})
    assert response.status_code == 400 and "since" in response.json()
    response = api.get("/api/dataset-events/", {"cursor": "sideways.3"})
    assert response.status_code == 400 and "cursor" in response.json()
    response = api.get("/api/dataset-events/", {"dataset": "a\x00b"})
    assert response.status_code == 400
    assert anonymous_api.get("/api/dataset-events/").status_code in (401, 403)


@pytest.fixture
def anonymous_api():
    from rest_framework.test import APIClient

    return APIClient()


def test_the_schema_describes_the_event_list(anonymous_api):
    paths = anonymous_api.get("/api/schema/?format=json").json()["paths"]
    operation = paths["/api/dataset-events/"]["get"]
    assert operation["operationId"] == "dataset_events_list"
    assert {p["name"] for p in operation["parameters"]} >= {"dataset", "workflow", "since", "until", "cursor", "limit"}


@pytest.mark.time_sensitive
def test_the_lineage_pages_show_producers_consumers_and_recent_events(wfs, clock, loop, viewer, client):
    produced(wfs, clock, loop, times=2)
    html = client.get(reverse("orchestrator:web:datasets")).content.decode()
    row = re.search(r'<tr><td><a href="/dataset/\?name=sales_daily">sales_daily</a>.*?</tr>', html, re.S).group(0)
    assert ">producer</a>.publish" in row and ">consumer</a>" in row and ">joined</a>" in row
    assert '<td class="num">2</td>' in row
    # fx_rates is declared but was never produced: listed, with no event.
    assert re.search(r'>fx_rates</a>.*?<td class="num">0</td>', html, re.S)
    page = client.get(reverse("orchestrator:web:dataset_named"), {"name": "sales_daily"}).content.decode()
    # The first address of a dataset's page still answers.
    first = client.get(reverse("orchestrator:web:dataset", args=["sales_daily"])).content.decode()
    assert re.search(r"<main.*</main>", first, re.S).group(0) == re.search(r"<main.*</main>", page, re.S).group(0)
    producers = re.search(r'id="producers">.*?</section>', page, re.S).group(0)
    assert ">producer</a>, task <code>publish</code>" in producers
    consumers = re.search(r'id="consumers">.*?</section>', page, re.S).group(0)
    assert "consumer</a>, one run per event" in consumers
    assert "joined</a>, once all of fx_rates, sales_daily have an event" in consumers
    events = re.search(r'id="events">.*?</section>', page, re.S).group(0)
    started = [int(n) for n in re.findall(r"consumer <a href=\"[^\"]+\">run #(\d+)</a>", events)]
    assert sorted(started) == [r.pk for r in consumer_runs("consumer")] and len(started) == 2
    assert "joined <span class=\"muted\">pending</span>" in events  # waits for fx_rates
    assert client.get(reverse("orchestrator:web:dataset", args=["unknown"])).status_code == 404
    assert client.get(reverse("orchestrator:web:dataset_named"), {"name": "unknown"}).status_code == 404


@pytest.mark.time_sensitive
@pytest.mark.parametrize("name", ["s3://bucket/../../x", "a/./b", "a/..", "./c", "q?x=1&y=#z"])
def test_a_dataset_with_dot_segments_or_query_characters_in_its_name_gets_a_link_that_reaches_its_page(
        viewer, client, name):
    Dataset.objects.create(name=name)
    html = client.get(reverse("orchestrator:web:datasets")).content.decode()
    links = [unescape(href) for href in re.findall(r'<a href="([^"]*)">[^<]*</a></td>', html)]
    link = next(href for href in links if parse_qs(urlsplit(href).query).get("name") == [name])
    # What a browser does to the address first: resolve dot segments in its path.
    resolved = urljoin("http://host/datasets/", link)
    assert resolved == "http://host" + link
    page = client.get(link)
    assert page.status_code == 200
    assert f"/ {escape(name)}</h1>" in page.content.decode()
    assert client.get(reverse("orchestrator:web:dataset_named")).status_code == 400


@pytest.mark.time_sensitive
def test_the_workflows_list_shows_what_dataset_starts_a_workflow_not_manual_only(wfs, viewer, client):
    html = client.get(reverse("orchestrator:web:workflows")).content.decode()

    def row(name):
        return re.search(rf'<tr class="">\s*<td><a class="name" href="/workflows/{name}/">.*?</tr>', html, re.S).group(0)

    consumer, joined, producer = row("consumer"), row("joined"), row("producer")
    assert '<div class="dataset-trigger">on <a href="/dataset/?name=sales_daily">sales_daily</a></div>' in consumer
    assert "at the next event" in consumer and "manual only" not in consumer and ">—<" not in consumer
    assert ('on all of <a href="/dataset/?name=fx_rates">fx_rates</a>, '
            '<a href="/dataset/?name=sales_daily">sales_daily</a>') in joined
    assert "once each of its datasets has an event" in joined and "manual only" not in joined
    assert "manual only" in producer  # no schedule, no dataset trigger


@pytest.mark.time_sensitive
def test_the_workflow_page_shows_what_it_produces_and_what_triggers_it(wfs, viewer, client):
    producer = client.get(reverse("orchestrator:web:workflow", args=["producer"])).content.decode()
    section = re.search(r'<section class="card" id="datasets">.*?</section>', producer, re.S).group(0)
    assert re.search(r"<code>publish</code> → <a [^>]+>sales_daily</a>,\s*which starts <a [^>]+>consumer</a>, "
                     r"<a [^>]+>joined</a> <span class=\"muted small\">\(with fx_rates, sales_daily\)", section)
    assert re.search(r"<code>publish</code> → <a [^>]+>sales_audit</a>,\s*<span class=\"muted\">which no workflow "
                     r"consumes", section)
    joined = client.get(reverse("orchestrator:web:workflow", args=["joined"])).content.decode()
    section = re.search(r'<section class="card" id="datasets">.*?</section>', joined, re.S).group(0)
    assert "all of" in section and ">producer</a>.publish" in section and ">fx</a>.rates" in section
    # A workflow without data has no such section.
    plain = client.get(reverse("orchestrator:web:workflow", args=["consumer"])).content.decode()
    assert 'id="datasets"' in plain  # consumer is triggered by sales_daily
    assert "any of" in plain


@pytest.mark.time_sensitive
def test_the_dashboard_lists_the_runs_that_missed_their_deadline(wfs, viewer, client):
    now = process_clock.now()  # the pinned clock the dashboard reads
    late, _ = trigger_workflow(wfs["producer"], {}, now=now)
    in_time, _ = trigger_workflow(wfs["producer"], {}, now=now)
    Run.objects.filter(pk=late.pk).update(deadline_at=now - timedelta(minutes=5),
                                          deadline_missed_at=now - timedelta(minutes=1))
    Run.objects.filter(pk=in_time.pk).update(deadline_at=now + timedelta(hours=1))
    html = client.get(reverse("orchestrator:web:dashboard")).content.decode()
    section = re.search(r'<section class="card" id="deadline-misses">.*?</section>', html, re.S).group(0)
    assert "1 in the last 24 h" in section
    assert f">#{late.pk}</a>" in section and f">#{in_time.pk}</a>" not in section
    # A day later the miss has left the list.
    process_clock.current().advance(hours=25)
    html = client.get(reverse("orchestrator:web:dashboard")).content.decode()
    assert "No run missed its deadline." in html
