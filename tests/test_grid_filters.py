"""The grid's filters: run state, trigger and a range of logical dates, kept in the URL and in
every link of the grid; a bad value is a 400 naming it, never a server error."""

from __future__ import annotations

import html
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Run, RunState
from tests.test_grid import columns, etl, grid_page, run_at, user  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db


def test_the_grid_shows_only_the_runs_that_pass_its_filters_and_its_links_keep_them(client, etl):  # noqa: F811
    client.force_login(user("victor", access.VIEWERS))
    march = [run_at(etl, datetime(2026, 3, day, 1, 30, tzinfo=UTC)) for day in range(1, 6)]
    Run.objects.filter(pk=march[1].pk).update(state=RunState.FAILED)
    Run.objects.filter(pk=march[3].pk).update(state=RunState.FAILED, trigger="backfill")

    assert columns(grid_page(client, etl)) == [r.pk for r in march]
    # Failed runs only, then failed backfills only.
    assert columns(grid_page(client, etl, "?state=failed")) == [march[1].pk, march[3].pk]
    assert columns(grid_page(client, etl, "?state=failed&trigger=backfill")) == [march[3].pk]
    # Days from 2 to 3 March (UTC: the viewer has no browser zone), both included.
    assert columns(grid_page(client, etl, "?since=2026-03-02&until=2026-03-03")) == [march[1].pk, march[2].pk]

    # Paging keeps the filters: two failed runs a page, the older link and the size links say so.
    page = grid_page(client, etl, "?state=failed&runs=50")
    assert 'href="?state=failed&amp;runs=50&amp;run=' in page  # a picked run keeps them
    assert '<a href="?state=failed#grid">25</a>' in page
    assert 'id="grid-unfilter"' in page
    assert '<option value="failed" selected>' in page
    # Nothing matches: said so, not "no runs yet".
    page = grid_page(client, etl, "?state=missed")
    assert columns(page) == [] and "No runs match these filters." in page


def test_the_grid_pages_older_runs_under_its_filters(client, etl):  # noqa: F811
    client.force_login(user("victor", access.VIEWERS))
    runs = [run_at(etl, datetime(2026, 3, day, 1, 30, tzinfo=UTC)) for day in range(1, 29)]
    Run.objects.filter(pk__in=[r.pk for r in runs[::2]]).update(state=RunState.FAILED)
    failed = [r.pk for r in runs[::2]]  # 14 runs
    page = grid_page(client, etl, "?state=failed&runs=25")
    assert columns(page) == failed
    assert 'id="grid-older"' not in page
    # The size links only offer sizes; at 25 per page, 14 failed runs fit. With a smaller range:
    page = grid_page(client, etl, "?state=failed&until=2026-03-10")
    assert columns(page) == failed[:5]


@pytest.mark.parametrize(("query", "field"), [
    ("?state=exploded", "state"), ("?trigger=cron", "trigger"), ("?since=yesterday", "since"),
    ("?until=2026-02-30", "until"), ("?since=2026-03-05&until=2026-03-01", "since"),
])
def test_a_bad_grid_filter_is_a_400_naming_it(client, etl, query, field):  # noqa: F811
    client.force_login(user("victor", access.VIEWERS))
    response = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + query)
    assert response.status_code == 400
    assert field in html.unescape(response.content.decode())
