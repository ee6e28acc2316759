"""The pages' second round, through Django's test client: the dashboard's schedule delay, the
workflow page after a refused trigger, the trigger form's order and accessible errors, labelled
filters, descriptions rendered as escaped text, and links a user may follow."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from orchestrator import access, clock
from orchestrator.models import Run, RunState, Trigger, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from tests.test_sync import Folder

pytestmark = pytest.mark.django_db

SHIPPING = '''
"""Ships the day's parcels.

Reads ``orders`` from the :mod:`warehouse` and books a *carrier*; see `docs`_.

- one <b>label</b> per parcel
- a manifest per ``carrier``

Run it by hand::

    manage.py trigger shipping --param batch=<n>
"""
from orchestrator.dsl import Param, Workflow

shipping = Workflow(
    "shipping",
    description=__doc__,
    params={
        "region": Param(str, default="eu", description="Where the parcels leave from, e.g. ``eu``."),
        "batch": Param(int, description="The batch to ship."),
        "notify": Param(bool, default=False),
        "amount": Param(int, default=10),
    },
)


@shipping.task
def book(ctx):
    return ctx.params["batch"]
'''


@pytest.fixture
def shipping(tmp_path):
    folder = Folder(tmp_path)
    folder.write("shipping", SHIPPING)
    report = folder.sync()
    assert report.ok, report
    return Workflow.objects.select_related("current_version").get(name="shipping")


@pytest.fixture
def etl():
    sync_workflows()
    return Workflow.objects.select_related("current_version").get(name="nightly_etl")


def _user(name, group, **extra):
    user = User.objects.create_user(name, password="pw-" + name, **extra)
    access.add_to_group(user, group)
    return user


@pytest.fixture
def as_operator(client):
    client.force_login(_user("olivia", access.OPERATORS))
    return client


@pytest.fixture
def as_viewer(client):
    client.force_login(_user("victor", access.VIEWERS))
    return client


def _input_names(html: str) -> list[str]:
    return [name for name in re.findall(r'name="param\.([\w]+)"', html)]


def _tag(html: str, element_id: str) -> str:
    match = re.search(rf'<(?:input|select|textarea)[^>]*\bid="{element_id}"[^>]*>', html)
    assert match, f"no input with id {element_id}"
    return match.group(0)


@pytest.mark.time_sensitive
def test_the_dashboards_schedule_delay_leaves_backfills_out_as_metrics_does(as_viewer, etl):
    now = clock.now()
    for delay, trigger in [(0.5, Trigger.SCHEDULE), (0.5, Trigger.SCHEDULE),
                           (19 * 86400.0, Trigger.BACKFILL), (28 * 86400.0, Trigger.BACKFILL)]:
        Run.objects.create(workflow=etl, version=etl.current_version, trigger=trigger, state=RunState.SUCCEEDED,
                           logical_date=now - timedelta(seconds=delay), started_at=now - timedelta(minutes=5),
                           finished_at=now - timedelta(minutes=4), schedule_delay=delay)
    html = as_viewer.get(reverse("orchestrator:web:dashboard")).content.decode()
    # Only the two scheduled runs count: half a second each, not the backfill's weeks.
    assert "<b>0.50 s</b><span>schedule delay p50, last hour</span>" in html
    assert "<b>0.50 s</b><span>p95 (2 scheduled runs)</span>" in html
    assert " d " not in re.search(r'<div class="tiles">.*?</div>\s*<div class="cols">', html, re.S).group(0)


@pytest.mark.time_sensitive
def test_after_a_refused_trigger_the_live_part_polls_the_workflow_page_not_the_post_url(as_operator, etl):
    run, _ = create_run(etl, trigger="manual")  # active: the workflow page polls
    assert run.is_active
    response = as_operator.post(reverse("orchestrator:web:workflow_trigger", args=[etl.name]),
                                {"param.orders": "lots"})
    assert response.status_code == 400
    html = response.content.decode()
    polled = re.search(r'<div id="live" hx-get="([^"]+)"', html).group(1)
    assert polled == reverse("orchestrator:web:workflow", args=[etl.name])
    # What it polls answers a GET with the live part.
    assert as_operator.get(polled, HTTP_HX_REQUEST="true").status_code == 200
    # A selected run stays selected in the polled URL of the GET page.
    html = as_operator.get(reverse("orchestrator:web:workflow", args=[etl.name]), {"run": run.pk}).content.decode()
    assert f'hx-get="/workflows/{etl.name}/?run={run.pk}"' in html


@pytest.mark.time_sensitive
def test_the_trigger_form_lists_params_in_the_order_they_were_declared(as_operator, shipping, etl):
    assert shipping.current_version.spec["param_order"] == ["region", "batch", "notify", "amount"]
    html = as_operator.get(reverse("orchestrator:web:workflow", args=["shipping"])).content.decode()
    # Not jsonb's order (batch, amount, notify, region) nor the alphabet's.
    assert _input_names(html) == ["region", "batch", "notify", "amount"]
    html = as_operator.get(reverse("orchestrator:web:workflow", args=["nightly_etl"])).content.decode()
    assert _input_names(html) == ["orders", "currency", "dry_run"]
    # A graph whose params are declared in alphabetical order keeps the spec it had.
    assert "param_order" not in Workflow.objects.get(name="maintenance").current_version.spec


@pytest.mark.time_sensitive
def test_a_refused_trigger_marks_the_wrong_fields_for_assistive_technology(as_operator, shipping):
    url = reverse("orchestrator:web:workflow", args=["shipping"])
    html = as_operator.get(url).content.decode()
    assert " required" in _tag(html, "p-batch") and " required" not in _tag(html, "p-region")
    assert 'aria-describedby="h-batch"' in _tag(html, "p-batch") and "aria-invalid" not in _tag(html, "p-batch")
    # A param's help is escaped text too, its inline code shown as code.
    assert '<span class="help muted small" id="h-region">Where the parcels leave from, e.g. <code>eu</code>.</span>' in html

    response = as_operator.post(reverse("orchestrator:web:workflow_trigger", args=["shipping"]),
                                {"param.region": "eu", "param.batch": "many", "param.amount": "3"})
    assert response.status_code == 400
    html = response.content.decode()
    batch = _tag(html, "p-batch")
    assert 'aria-invalid="true"' in batch and 'aria-describedby="h-batch e-batch"' in batch
    assert re.search(r'<span class="error field-error" id="e-batch">expected an integer, got &quot;many&quot;</span>',
                     html)
    assert "aria-invalid" not in _tag(html, "p-region") and "aria-invalid" not in _tag(html, "p-amount")
    assert not Run.objects.exists()


@pytest.mark.time_sensitive
def test_every_filter_control_of_the_runs_list_and_the_dead_letter_queue_has_a_label(as_viewer, etl):
    for name in ("runs", "dead_letter"):
        html = as_viewer.get(reverse(f"orchestrator:web:{name}")).content.decode()
        form = re.search(r'<form method="get" class="filters">(.*?)</form>', html, re.S).group(1)
        controls = re.findall(r"<(select|input)\b[^>]*>", form)
        assert len(controls) >= 4
        # Every select and input sits inside a <label> (its accessible name).
        unlabelled = re.sub(r"<label>.*?</label>", "", form, flags=re.S)
        assert not re.search(r"<(select|input)\b", unlabelled), (name, unlabelled)


@pytest.mark.time_sensitive
def test_the_dashboard_has_a_main_heading(as_viewer, etl):
    html = as_viewer.get(reverse("orchestrator:web:dashboard")).content.decode()
    assert html.count("<h1>") == 1 and "<h1>Dashboard</h1>" in html


@pytest.mark.time_sensitive
def test_a_description_is_rendered_as_escaped_text_with_its_inline_code(as_viewer, shipping):
    html = as_viewer.get(reverse("orchestrator:web:workflow", args=["shipping"])).content.decode()
    description = re.search(r'<div class="description">(.*?)</div>', html, re.S).group(1)
    assert description == (
        "<p>Ships the day&#x27;s parcels.</p>"
        "<p>Reads <code>orders</code> from the <code>warehouse</code> and books a <em>carrier</em>; see <code>docs</code>.</p>"
        "<ul><li>one &lt;b&gt;label&lt;/b&gt; per parcel</li><li>a manifest per <code>carrier</code></li></ul>"
        "<p>Run it by hand:</p>"
        "<pre>manage.py trigger shipping --param batch=&lt;n&gt;</pre>"
    )
    assert "``" not in html
    listing = as_viewer.get(reverse("orchestrator:web:workflows")).content.decode()
    assert '<div class="muted small">Ships the day&#x27;s parcels.</div>' in listing


@pytest.mark.time_sensitive
def test_only_staff_users_see_the_admin_link(client, etl):
    admin_link = f'href="{reverse("admin:index")}"'
    client.force_login(_user("victor", access.VIEWERS))
    assert admin_link not in client.get(reverse("orchestrator:web:dashboard")).content.decode()
    client.force_login(_user("olivia", access.OPERATORS))
    assert admin_link not in client.get(reverse("orchestrator:web:dashboard")).content.decode()
    client.force_login(_user("sam", access.OPERATORS, is_staff=True))
    assert admin_link in client.get(reverse("orchestrator:web:dashboard")).content.decode()


@pytest.mark.time_sensitive
def test_a_viewer_chooses_utc_once_and_every_page_and_filter_uses_it(as_viewer, etl):
    from datetime import UTC, datetime

    from orchestrator.models import UserPreference

    late = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)  # 2 March in Berlin
    run = Run.objects.create(workflow=etl, version=etl.current_version, logical_date=late, trigger="schedule",
                             state=RunState.SUCCEEDED, started_at=late, finished_at=late + timedelta(minutes=1))
    as_viewer.cookies["orchestrator_tz"] = "Europe/Berlin"
    runs = reverse("orchestrator:web:runs")
    html = as_viewer.get(runs, {"since": "2026-03-02", "until": "2026-03-02"}).content.decode()
    assert 'data-clock="local"' in html and "dates in Europe/Berlin" in html and f"/runs/{run.pk}/" in html

    response = as_viewer.post(reverse("orchestrator:web:clock"), {"clock": "utc", "next": runs})
    assert response.status_code == 302 and response["Location"] == runs
    assert UserPreference.objects.get(user__username="victor").clock == "utc"
    html = as_viewer.get(runs, {"since": "2026-03-02", "until": "2026-03-02"}).content.decode()
    assert 'data-clock="utc"' in html and "dates in UTC" in html and f"/runs/{run.pk}/" not in html
    assert 'value="utc" aria-pressed="true"' in html
    html = as_viewer.get(reverse("orchestrator:web:dead_letter")).content.decode()
    assert 'data-clock="utc"' in html and "dates in UTC" in html


@pytest.mark.time_sensitive
def test_the_clock_switch_refuses_an_unknown_choice_and_anonymous_visitors(client, etl):
    from orchestrator.models import UserPreference

    url = reverse("orchestrator:web:clock")
    assert client.post(url, {"clock": "utc"}).status_code == 302  # to the login page
    client.force_login(_user("victor", access.VIEWERS))
    response = client.post(url, {"clock": "mars"})
    assert response.status_code == 400
    assert "clock must be &quot;local&quot; or &quot;utc&quot;, got &#x27;mars&#x27;" in response.content.decode()
    assert client.get(url).status_code == 405
    assert not UserPreference.objects.exists()
    # A browser zone that does not exist is ignored: dates are then read in UTC, and the page says so.
    client.cookies["orchestrator_tz"] = "Mars/Olympus"
    assert "dates in UTC" in client.get(reverse("orchestrator:web:runs")).content.decode()
