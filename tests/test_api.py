# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The REST API's workflows and runs: reading, triggering with params and idempotency keys,
permissions, and JSON errors for every kind of bad input."""

import re
from datetime import UTC, datetime

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command

from orchestrator import clock
from orchestrator.models import Run, RunState, TaskRun, Trigger
from orchestrator.runs import trigger_workflow
from tests.conftest import daily_fire_times
from tests.support.api_support import (  # noqa: F401 - fixtures
    anonymous,
    api,
    client_for,
    make_user,
    operator,
    stored,
    viewer,
    viewer_api,
    workflow,
)

pytestmark = pytest.mark.django_db


def trigger(client, name="reports", data=None, **extra):
    return client.post(f"/api/workflows/{name}/runs/", data if data is not None else {"params": {"day": "2026-03-01"}},
                       format="json", **extra)


# --- reading -------------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_it_lists_workflows_and_shows_the_graph_params_and_next_fire_times(api, workflow):
    listed = api.get("/api/workflows/")
    assert listed.status_code == 200
    assert [w["name"] for w in listed.json()] == ["reports"]

    detail = api.get("/api/workflows/reports/").json()
    assert detail["graph"]["edges"] == [["extract", "load"]]
    assert {t["name"]: t["max_attempts"] for t in detail["graph"]["tasks"]} == {"extract": 3, "load": 1}
    assert detail["params"]["orders"]["default"] == 5
    assert detail["params"]["day"]["required"] is True
    [schedule] = detail["schedules"]
    fires = [datetime.fromisoformat(at) for at in schedule["next_fire_times"]]
    # 02:30 in Berlin: 00:30 or 01:30 UTC depending on daylight saving time, 01:00 UTC after the gap
    assert fires == daily_fire_times(2, 30, "Europe/Berlin", clock.now(), 5)


@pytest.mark.time_sensitive
def test_an_unknown_workflow_is_a_json_404(api, workflow):
    for url in ("/api/workflows/nope/", "/api/workflows/nope/runs/", "/api/runs/999999/", "/api/task-runs/5/",
                "/api/no-such-endpoint/", "/api/runs/abc/", f"/api/runs/{2**80}/",
                "/api/backfills/0/", "/api/jobs/1/"):
        response = api.get(url)
        assert response.status_code == 404, url
        assert response["Content-Type"] == "application/json", url
        assert response.json()["detail"], url
    assert "nope" in api.get("/api/workflows/nope/").json()["detail"]
    assert "did you mean /api/workflows/reports/runs/" in api.post("/api/workflows/reports/runs").json()["detail"]


@pytest.mark.time_sensitive
def test_it_shows_a_run_with_its_counts_its_task_runs_paged_and_a_task_run_with_its_attempts(api, workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    detail = api.get(f"/api/runs/{run.pk}/").json()
    assert detail["workflow"] == "reports"
    assert detail["params"] == {"orders": 5, "currency": "EUR", "day": "2026-03-01"}
    # Counts, not the task runs themselves: those are a page away.
    assert detail["tasks"] == {"total": 2, "by_state": {"scheduled": 1, "waiting": 1}}
    assert detail["mapped"] == [] and "task_runs" not in detail
    assert detail["task_runs_url"] == f"/api/runs/{run.pk}/task-runs/"
    page = api.get(detail["task_runs_url"]).json()
    assert [(t["task"], t["map_index"], t["state"]) for t in page["results"]] == [
        ("extract", -1, "scheduled"), ("load", -1, "waiting")]
    assert page["next"] is None and page["previous"] is None

    extract = TaskRun.objects.get(run=run, task="extract")
    task_run = api.get(f"/api/task-runs/{extract.pk}/").json()
    assert task_run["run"] == run.pk and task_run["attempt_list"] == []
    assert task_run["spec"]["ref"].endswith("reports:extract")


# --- listing runs ---------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_it_pages_runs_newest_first_with_a_cursor(api, workflow):
    ids = [trigger_workflow(workflow, {"day": "2026-03-01"})[0].pk for _ in range(5)]
    first = api.get("/api/runs/?limit=2").json()
    assert [r["id"] for r in first["results"]] == ids[::-1][:2]
    second = api.get(first["next"]).json()
    assert [r["id"] for r in second["results"]] == ids[::-1][2:4]
    third = api.get(second["next"]).json()
    assert [r["id"] for r in third["results"]] == ids[:1] and third["next"] is None


@pytest.mark.time_sensitive
def test_it_filters_runs_by_workflow_state_trigger_and_dates(api, workflow):
    old, _ = trigger_workflow(workflow, {"day": "2026-03-01"}, logical_date=datetime(2026, 1, 1, tzinfo=UTC))
    new, _ = trigger_workflow(workflow, {"day": "2026-03-01"}, trigger=Trigger.API,
                              logical_date=datetime(2026, 2, 1, tzinfo=UTC))
    Run.objects.filter(pk=old.pk).update(state=RunState.FAILED)

    def ids(query):
        response = api.get(f"/api/runs/?{query}")
        assert response.status_code == 200, response.json()
        return [r["id"] for r in response.json()["results"]]

    assert ids("workflow=reports") == [new.pk, old.pk]
    assert ids("state=failed") == [old.pk]
    assert ids("trigger=api") == [new.pk]
    assert ids("logical_after=2026-01-15T00:00:00Z") == [new.pk]
    assert ids("logical_before=2026-01-15T00:00:00%2B01:00") == [old.pk]
    assert ids("created_after=2000-01-01T00:00:00Z&state=running") == [new.pk]
    assert [r["id"] for r in api.get("/api/workflows/reports/runs/?state=failed").json()["results"]] == [old.pk]


@pytest.mark.time_sensitive
@pytest.mark.parametrize("query, field", [
    ("state=exploded", "state"),
    ("trigger=telepathy", "trigger"),
    ("workflow=a%00b", "workflow"),
    ("created_after=yesterday", "created_after"),
    ("logical_before=2026-01-15T00:00:00", "logical_before"),
    ("created_after=0001-01-01T00:00:00%2B05:00", "created_after"),
    ("cursor=bz14", "cursor"),
])
def test_a_bad_run_filter_is_a_400_naming_it(api, workflow, query, field):
    response = api.get(f"/api/runs/?{query}")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


# --- triggering -----------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_an_operator_triggers_a_run_with_checked_params(api, operator, workflow):
    response = trigger(api, data={"params": {"orders": "7", "day": "2026-03-01"}, "priority": 3})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert response["Location"] == f"/api/runs/{body['id']}/"
    run = Run.objects.get(pk=body["id"])
    assert (run.trigger, run.created_by, run.priority) == ("api", operator, 3)
    assert run.params == {"orders": 7, "currency": "EUR", "day": "2026-03-01"}
    assert body["params"] == run.params and body["tasks"]["total"] == 2


@pytest.mark.time_sensitive
@pytest.mark.parametrize("data, errors", [
    ({"params": {"day": "2026-03-01", "colour": "red"}}, {"params": {"colour": "unknown param 'colour'"}}),
    ({"params": {"day": "2026-03-01", "orders": "many"}}, {"params": {"orders": "expected an integer"}}),
    ({"params": {"day": "2026-03-01", "currency": "GBP"}}, {"params": {"currency": "is not one of"}}),
    ({"params": {}}, {"params": {"day": "this param is required"}}),
    ({"params": [1, 2]}, {"params": "expected a JSON object"}),
    ({"params": {"day": "2026-03-01"}, "priority": 10**40}, {"priority": "less than or equal to 100"}),
    ({"params": {"day": "2026-03-01"}, "priority": "high"}, {"priority": "valid integer"}),
    ({"params": {"day": "2026-03-01"}, "logical_date": "2026-03-01T00:00:00"}, {"logical_date": "no timezone"}),
    ({"params": {"day": "2026-03-01"}, "logical_date": "soon"}, {"logical_date": "expected a date and time"}),
    ({"params": {"day": "2026-03-01"}, "idempotency_key": "a\x00b"}, {"idempotency_key": "Null characters"}),
    ({"params": {"day": "2026-03-01\x00"}}, {"params": "NUL character"}),
    ({"params": {"day": "2026-03-01"}, "idempotency_key": "k" * 300}, {"idempotency_key": "no more than 255"}),
])
def test_bad_trigger_input_is_a_400_per_field_and_changes_nothing(api, workflow, data, errors):
    before = stored()
    response = trigger(api, data=data)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"]
    for field, expected in errors.items():
        got = body[field]
        if isinstance(expected, dict):
            for name, message in expected.items():
                assert message in got[name][0], body
        else:
            assert expected.lower() in str(got).lower(), body
    assert stored() == before


@pytest.mark.time_sensitive
@pytest.mark.parametrize("payload, content_type", [
    (b'{"params": {"day": ', "application/json"),
    (b"[1, 2, 3]", "application/json"),
    (b'"just a string"', "application/json"),
    (b"null", "application/json"),
    (b'{"params": {"day": "2026-03-01"}, "priority": NaN}', "application/json"),
    (b'{"priority": 1' + b"0" * 5000 + b"}", "application/json"),
    (b"\xff\xfe not utf-8", "application/json"),
])
def test_malformed_or_non_object_json_is_a_400(api, workflow, payload, content_type):
    before = stored()
    response = api.generic("POST", "/api/workflows/reports/runs/", payload, content_type=content_type)
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    assert stored() == before


@pytest.mark.time_sensitive
def test_a_broken_or_removed_workflow_cannot_be_triggered(api, workflow):
    workflow.present = False
    workflow.save()
    response = trigger(api)
    assert response.status_code == 400
    assert "no longer defined" in response.json()["workflow"][0]
    assert not Run.objects.exists()


# --- idempotency ----------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_the_same_key_and_payload_returns_the_existing_run_with_200(api, workflow):
    first = trigger(api, HTTP_IDEMPOTENCY_KEY="nightly-2026-03-01")
    again = trigger(api, HTTP_IDEMPOTENCY_KEY="nightly-2026-03-01")
    in_body = trigger(api, data={"params": {"day": "2026-03-01"}, "idempotency_key": "nightly-2026-03-01"})
    assert (first.status_code, again.status_code, in_body.status_code) == (201, 200, 200)
    assert first.json()["id"] == again.json()["id"] == in_body.json()["id"]
    assert Run.objects.count() == 1


@pytest.mark.time_sensitive
def test_the_same_key_with_another_payload_is_a_409_saying_so(api, workflow):
    first = trigger(api, HTTP_IDEMPOTENCY_KEY="k1")
    before = stored()
    other = trigger(api, data={"params": {"day": "2026-03-02"}}, HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 409
    assert "already used for a different request" in other.json()["detail"]
    assert other.json()["existing_id"] == first.json()["id"]
    assert stored() == before


@pytest.mark.time_sensitive
def test_a_header_and_a_body_key_that_differ_are_a_400(api, workflow):
    response = trigger(api, data={"params": {"day": "2026-03-01"}, "idempotency_key": "a"}, HTTP_IDEMPOTENCY_KEY="b")
    assert response.status_code == 400 and "differ" in response.json()["idempotency_key"][0]
    for bad in (" ", "k" * 256):
        response = trigger(api, HTTP_IDEMPOTENCY_KEY=bad)
        assert response.status_code == 400 and "Idempotency-Key header" in response.json()["idempotency_key"][0]
    # A NUL byte is refused before the view, as anywhere in a request.
    response = trigger(api, HTTP_IDEMPOTENCY_KEY="a\x00b")
    assert response.status_code == 400 and "the header Idempotency-Key contains a NUL" in response.json()["detail"]
    assert not Run.objects.exists()


# --- permissions -----------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_anonymous_requests_are_401_and_bad_tokens_too(anonymous, workflow):
    for method, url in [("get", "/api/workflows/"), ("get", "/api/runs/"), ("post", "/api/workflows/reports/runs/")]:
        response = getattr(anonymous, method)(url)
        assert response.status_code == 401, url
        assert response["WWW-Authenticate"] == "Token"
    anonymous.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert anonymous.get("/api/workflows/").status_code == 401
    assert not Run.objects.exists()


@pytest.mark.time_sensitive
def test_a_viewer_reads_but_cannot_trigger_and_a_user_without_a_role_cannot_read(viewer_api, workflow):
    assert viewer_api.get("/api/workflows/reports/").status_code == 200
    assert viewer_api.get("/api/runs/").status_code == 200
    before = stored()
    response = trigger(viewer_api)
    assert response.status_code == 403
    assert "Operators" in response.json()["detail"]
    assert stored() == before
    nobody = client_for(make_user("nobody", None))
    assert nobody.get("/api/workflows/").status_code == 403


@pytest.mark.time_sensitive
def test_a_logged_in_session_works_too_with_csrf_for_writes(settings, workflow):
    from django.test import RequestFactory
    from rest_framework.test import APIClient

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only
    make_user("sam", "Operators", password="sam-password")
    client = APIClient(enforce_csrf_checks=True)
    # The request lets django-axes count the attempt per user and address.
    assert client.login(request=RequestFactory().post("/login/"), username="sam", password="sam-password")
    assert client.get("/api/workflows/").status_code == 200
    assert trigger(client).status_code == 403  # a session without the CSRF token cannot write
    assert not Run.objects.exists()


def test_create_token_prints_each_new_token_once_and_reset_revokes_the_earlier_ones(operator, capsys):
    def token_works(key):
        client = client_for(None)
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client.get("/api/runs/").status_code == 200

    call_command("create_token", "olga")
    first = capsys.readouterr().out.strip()
    call_command("create_token", "olga")
    second = capsys.readouterr().out.strip()
    assert first and second and first != second, "the key is shown once: a new call makes another token"
    assert token_works(first) and token_works(second)
    call_command("create_token", "olga", "--reset")
    third = capsys.readouterr().out.strip()
    assert token_works(third) and not token_works(first) and not token_works(second)


def test_create_token_can_create_an_api_user_with_a_role(capsys):
    call_command("create_token", "ci-bot", "--create", "--role", "operator")
    key = capsys.readouterr().out.strip()
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.post("/api/dlq/retry/", {"ids": []}, format="json").status_code == 400  # allowed, bad input
    with pytest.raises(Exception, match="no user 'ghost'"):
        call_command("create_token", "ghost")


# --- schema and docs ---------------------------------------------------------------------------------


def test_the_schema_and_the_docs_page_are_served_without_a_cdn(anonymous):
    schema = anonymous.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    for path in ("/api/workflows/{name}/runs/", "/api/jobs/", "/api/dlq/retry/", "/api/backfills/",
                 "/api/task-runs/{id}/attempts/{number}/log/", "/api/runs/{id}/cancel/"):
        assert path in paths, path
    docs = anonymous.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html and "/static/drf_spectacular_sidecar/" in html
    assert "cdn" not in html.lower() and "https://" not in html
    # The assets themselves are static files of this installation (collectstatic/whitenoise serve them).
    bundle = re.search(r'src="/static/(drf_spectacular_sidecar/[^"]+\.js)"', html).group(1)
    assert finders.find(bundle)


READS = ["/api/workflows/", "/api/workflows/reports/", "/api/workflows/reports/runs/", "/api/runs/", "/api/runs/1/",
         "/api/task-runs/1/", "/api/task-runs/1/attempts/1/log/", "/api/jobs/", "/api/jobs/1/", "/api/dlq/",
         "/api/backfills/", "/api/backfills/1/"]
WRITES = ["/api/workflows/reports/pause/", "/api/workflows/reports/resume/", "/api/workflows/reports/runs/",
          "/api/runs/1/cancel/", "/api/runs/1/retry/", "/api/jobs/", "/api/dlq/retry/", "/api/dlq/discard/",
          "/api/backfills/"]


@pytest.mark.time_sensitive
def test_every_endpoint_needs_credentials_and_the_right_role(anonymous, viewer_api, workflow):
    nobody = client_for(make_user("nobody", None))
    before = stored()
    for url in READS:
        assert anonymous.get(url).status_code == 401, url
        assert nobody.get(url).status_code == 403, url
    for url in WRITES:
        assert anonymous.post(url, {}, format="json").status_code == 401, url
        assert nobody.post(url, {}, format="json").status_code == 403, url
        assert viewer_api.post(url, {"ids": [1]}, format="json").status_code == 403, url
    assert stored() == before
