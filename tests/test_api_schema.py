# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The API answers what its OpenAPI schema says, in both directions: what the schema refuses, the
server refuses; what it allows is answered as described. Each case here is one schemathesis found
(tests/processes/test_api_fuzz.py runs it against a live server); these ask the test client and the schema."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from orchestrator.api import schema
from orchestrator.models import TaskRun, TaskState
from orchestrator.runs import trigger_workflow
from tests.support.api_support import api, operator, workflow  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

MARCH = {"start": "2026-03-01T00:00:00Z", "end": "2026-03-03T00:00:00Z", "dry_run": True}


def as_json_schema(node):
    """OpenAPI 3.0's ``nullable`` as JSON Schema says it (a null type)."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: as_json_schema(value) for key, value in node.items()}
    if node.pop("nullable", False):
        if "type" in node:
            node["type"] = [node["type"], "null"]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@pytest.fixture(scope="module")
def document():
    return as_json_schema(copy.deepcopy(schema.generate()))


def allows(document, component: str, body: dict) -> bool:
    """Whether the schema's request component ``component`` allows ``body``."""
    validator = jsonschema.Draft7Validator({**document, "$ref": f"#/components/schemas/{component}"},
                                           format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    return validator.is_valid(body)


def operation(document, path: str, method: str) -> dict:
    return document["paths"][path][method]


# --- POST /api/task-runs/{id}/clear/ ----------------------------------------------------------------


def test_clear_takes_downstream_only_as_the_boolean_the_schema_says(api, workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    TaskRun.objects.filter(pk=extract.pk).update(state=TaskState.SUCCEEDED)
    for wrong in (0, 1, "false", "yes", None):
        response = api.post(f"/api/task-runs/{extract.pk}/clear/", {"downstream": wrong}, format="json")
        assert response.status_code == 400, (wrong, response.content)
        assert list(response.json()) == ["detail", "downstream"]
    assert TaskRun.objects.get(pk=extract.pk).state == TaskState.SUCCEEDED  # nothing was cleared
    response = api.post(f"/api/task-runs/{extract.pk}/clear/", {"downstream": False}, format="json")
    assert response.status_code == 200 and response.json()["changed"] == [extract.pk]


# --- POST /api/backfills/ --------------------------------------------------------------------------


def test_the_schema_refuses_a_backfill_that_names_a_schedule_and_a_cron_expression(api, workflow, document):
    both = {"workflow": "reports", **MARCH, "schedule": "default", "cron": "0 0 * * *"}
    assert not allows(document, "BackfillRequestRequest", both)
    response = api.post("/api/backfills/", both, format="json")
    assert response.status_code == 400 and "not both" in response.json()["cron"][0]
    # Either one alone, or one of them null, is what the schema allows and the server answers.
    day = {"params": {"day": "2026-03-01"}}  # a cron expression brings no schedule's params
    for body in ({"workflow": "reports", **MARCH, "cron": "0 0 * * *", **day},
                 {"workflow": "reports", **MARCH, "schedule": "default", "cron": None},
                 {"workflow": "reports", **MARCH, "schedule": None, "cron": "0 0 * * *", **day}):
        assert allows(document, "BackfillRequestRequest", body), body
        response = api.post("/api/backfills/", body, format="json")
        assert response.status_code == 200, (body, response.content)


# --- POST /api/jobs/ -------------------------------------------------------------------------------


def test_the_schema_states_the_form_of_a_job_reference(api, document):
    for wrong in ("0", "not a reference", "module:", ":function", "a b:c", "a.b:c\n"):
        # (Python's jsonschema reads "$" as Python does, before a last line break; JSON Schema's
        # validators read it as ECMAScript does, and refuse that one too.)
        assert wrong.endswith("\n") or not allows(document, "JobRequestRequest", {"ref": wrong}), wrong
        response = api.post("/api/jobs/", {"ref": wrong}, format="json")
        assert response.status_code == 400 and "package.module:function" in response.json()["ref"][0], wrong
    # A well-formed reference passes the schema; whether it is registered only the server knows.
    assert allows(document, "JobRequestRequest", {"ref": "workflows.jobs:send_welcome_email"})
    assert allows(document, "JobRequestRequest", {"ref": "workflows.nope:thing"})
    assert api.post("/api/jobs/", {"ref": "workflows.jobs:send_welcome_email"}, format="json").status_code == 201


# --- the Idempotency-Key header and the idempotency_key field --------------------------------------


@pytest.mark.parametrize(("path", "body"), [
    ("/api/workflows/{name}/runs/", {"params": {"day": "2026-03-01"}}),
    ("/api/jobs/", {"ref": "workflows.jobs:send_welcome_email"}),
])
def test_the_schema_describes_the_400_for_a_header_and_a_field_that_name_different_keys(api, workflow, document,
                                                                                     path, body):
    described = operation(document, path, "post")
    header = next(p for p in described["parameters"] if p["name"] == "Idempotency-Key")
    assert "differ" in header["description"], header
    assert "differ" in described["responses"]["400"]["description"], described["responses"]["400"]
    response = api.post(path.format(name="reports"), {**body, "idempotency_key": "a"}, format="json",
                        HTTP_IDEMPOTENCY_KEY="b")
    assert response.status_code == 400 and "differ" in response.json()["idempotency_key"][0]
    # The same key both ways is one key.
    response = api.post(path.format(name="reports"), {**body, "idempotency_key": "a"}, format="json",
                        HTTP_IDEMPOTENCY_KEY="a")
    assert response.status_code == 201


# --- every answer under /api/ is JSON ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/runs/1%0A/", "/api/%0A", "/api/runs/%0A/cancel/", "/api/no%0Athing",
                                  "/api/workflows/%0D%0A/runs/x/", "/api/runs/1%0B/"])
def test_an_unknown_api_path_with_a_line_break_is_a_json_404(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json", response.content[:200]
    assert response.json()["detail"].startswith("no API endpoint at /api/")


def test_the_state_enums_keep_their_names_whatever_read_the_enum_settings_first():
    # drf-spectacular caches its enum name overrides: read first without this API's settings
    # (another schema, a check), the cache held none of ours and the states got hashed names.
    from drf_spectacular.plumbing import load_enum_name_overrides

    load_enum_name_overrides()
    names = set(schema.generate()["components"]["schemas"])
    assert {"TaskStateEnum", "RunStateEnum"} <= names
    assert not [name for name in names if name.startswith("State") and name.endswith("Enum")]
