"""Schedules in the Django admin: validated cron, time zone and params, a preview of the next fire
times, code-declared schedules read-only except pause, and pause/resume actions."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User

from orchestrator import access, clock
from orchestrator.models import Schedule
from orchestrator.sync import sync_workflows
from tests.conftest import daily_fire_times
from tests.test_scheduler import make_schedule, make_workflow

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/orchestrator/schedule/add/"


@pytest.fixture
def admin_client(client):
    # No password: hashing one costs more than the whole test.
    client.force_login(User.objects.create(username="op", is_superuser=True, is_staff=True))
    return client


@pytest.fixture
def workflow():
    return make_workflow("etl", params={"region": {"type": "str", "required": False, "default": "emea",
                                                   "choices": ["emea", "apac"]}})


def form_data(workflow, **overrides):
    data = {"workflow": workflow.pk, "name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
            "catchup": "latest", "max_catchup": "", "overlap": "forbid", "start_deadline": "", "jitter": "0",
            "params": "{}"}
    data.update(overrides)
    return data


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cron", "61 * * * *", "minute field value 61 is out of range 0-59"),
    ("cron", "0 0 30 2 *", "it can never fire"),
    ("timezone", "Mars/Olympus", "unknown timezone &#x27;Mars/Olympus&#x27;"),
    ("params", '{"region": "mars"}', "region: &quot;mars&quot; is not one of"),
    ("params", '{"colour": 1}', "unknown param"),
    ("params", "[1, 2]", "expected an object of param values"),
])
def test_the_add_form_refuses_bad_input_with_a_clear_message_and_saves_nothing(admin_client, workflow, field, value,
                                                                                 message):
    response = admin_client.post(ADD_URL, form_data(workflow, **{field: value}))
    assert response.status_code == 200
    html = response.content.decode()
    assert message in html
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    assert Schedule.objects.count() == 0


@pytest.mark.time_sensitive
def test_an_operator_adds_a_schedule_that_fires_at_its_next_time(admin_client, workflow):
    response = admin_client.post(ADD_URL, form_data(workflow, cron="30  2 * * *", params='{"region": "apac"}'))
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule = Schedule.objects.get()
    assert (schedule.source, schedule.cron, schedule.params) == ("admin", "30 2 * * *", {"region": "apac"})
    assert schedule.next_fire_at > clock.now()
    # the next 02:30 in Berlin (the fall-back day lasts 25 hours, the spring-forward day has no 02:30)
    assert schedule.next_fire_at == daily_fire_times(2, 30, "Europe/Berlin", clock.now(), 1)[0]


@pytest.mark.time_sensitive
def test_the_change_page_previews_the_next_fire_times_in_local_time_and_utc(admin_client, workflow):
    schedule = make_schedule(workflow, "30 2 * * *", now=clock.now(), tz="Europe/Berlin", name="nightly")
    html = admin_client.get(f"/admin/orchestrator/schedule/{schedule.pk}/change/").content.decode()
    assert "fire-time-preview" in html
    for at in daily_fire_times(2, 30, "Europe/Berlin", clock.now(), 5):  # five local times and UTC
        local = at.astimezone(ZoneInfo("Europe/Berlin"))
        assert f"{local:%a %Y-%m-%d %H:%M:%S %Z}" in html and f"{at:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "every day at 02:30" in html


@pytest.mark.time_sensitive
def test_a_code_declared_schedule_is_read_only_except_paused(admin_client, workflow):
    schedule = make_schedule(workflow, "0 * * * *", now=clock.now(), source="code")
    url = f"/admin/orchestrator/schedule/{schedule.pk}/change/"
    form = admin_client.get(url).context["adminform"].form
    assert list(form.fields) == ["paused"]
    response = admin_client.post(url, {"paused": "on", "cron": "*/5 * * * *"})
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.paused, schedule.cron) == (True, "0 * * * *")
    assert admin_client.post(f"/admin/orchestrator/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 403


@pytest.mark.time_sensitive
def test_changing_the_cron_of_an_admin_schedule_moves_its_next_fire_time(admin_client, workflow):
    schedule = make_schedule(workflow, "0 0 1 1 *", now=clock.now(), name="nightly")
    data = form_data(workflow, cron="*/5 * * * *", timezone="UTC")
    del data["workflow"]  # fixed once created
    assert admin_client.post(f"/admin/orchestrator/schedule/{schedule.pk}/change/", data).status_code == 302
    schedule.refresh_from_db()
    assert schedule.next_fire_at - clock.now() <= timedelta(minutes=5)


@pytest.mark.time_sensitive
def test_pause_and_resume_actions(admin_client, workflow):
    schedules = [make_schedule(workflow, now=clock.now(), name=f"s{i}") for i in range(2)]
    ids = [str(s.pk) for s in schedules]
    admin_client.post("/admin/orchestrator/schedule/", {"action": "pause_schedules", "_selected_action": ids})
    assert set(Schedule.objects.values_list("paused", flat=True)) == {True}
    admin_client.post("/admin/orchestrator/schedule/", {"action": "resume_schedules", "_selected_action": ids})
    assert set(Schedule.objects.values_list("paused", flat=True)) == {False}


def test_a_viewer_sees_schedules_but_cannot_add_or_change_them(client, workflow):
    viewer = User.objects.create(username="viewer", is_staff=True)
    access.add_to_group(viewer, access.VIEWERS)
    client.force_login(viewer)
    assert client.get("/admin/orchestrator/schedule/").status_code == 200
    assert client.post(ADD_URL, form_data(workflow)).status_code == 403
    assert Schedule.objects.count() == 0


@pytest.mark.time_sensitive
def test_sync_never_touches_a_schedule_made_in_the_admin():
    sync_workflows()
    from orchestrator.models import Workflow

    etl = Workflow.objects.get(name="nightly_etl")
    mine = Schedule.objects.create(workflow=etl, name="hourly-extra", cron="0 * * * *", source="admin",
                                   params={"orders": 5})
    sync_workflows()
    mine.refresh_from_db()
    assert (mine.cron, mine.params, mine.source) == ("0 * * * *", {"orders": 5}, "admin")
    assert set(etl.schedules.values_list("source", flat=True)) == {"code", "admin"}


# -- the CLI preview ------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_the_schedules_command_lists_state_and_next_fire_times_in_local_time_and_utc(workflow):
    from io import StringIO

    from django.core.management import call_command

    make_schedule(workflow, "30 2 * * *", now=clock.now(), tz="Europe/Berlin", name="nightly")
    make_schedule(workflow, "@hourly", now=clock.now(), name="hourly", paused=True)
    out = StringIO()
    call_command("schedules", "--next", "3", stdout=out)
    text = out.getvalue()
    assert "etl/hourly  [admin]  paused" in text
    assert "etl/nightly  [admin]  active" in text
    assert "'30 2 * * *' Europe/Berlin: every day at 02:30; catchup latest, overlap allow" in text
    nightly = text[text.index("etl/nightly"):]
    lines = [line for line in nightly.splitlines() if line.strip().startswith("next")]
    berlin = ZoneInfo("Europe/Berlin")
    assert lines == [f"    next  {at.astimezone(berlin):%a %Y-%m-%d %H:%M:%S %Z}  =  {at:%Y-%m-%d %H:%M:%S} UTC"
                     for at in daily_fire_times(2, 30, "Europe/Berlin", clock.now(), 3)]
