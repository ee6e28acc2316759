"""A check schemathesis loads for tests/processes/test_api_fuzz.py (the config's ``hooks``): three operations
may refuse a schema-valid request, each for what no OpenAPI schema can state, and for nothing else.
schemathesis' own positive_data_acceptance check lets them answer 400; this one reads each such
400 and fails when it names a field the schema could have judged."""

import schemathesis

# (method, path): the fields whose refusal a schema cannot foresee.
CANNOT_SAY = {
    # The params are checked against the workflow's own declared params (the schema allows any object).
    ("POST", "/api/workflows/{name}/runs/"): {"params"},
    # A workflow and a schedule that must exist, a cron expression and timezone that must parse,
    # an end after the start, a range the calendar and MAX_BACKFILL_RUNS allow, params as above.
    ("POST", "/api/backfills/"): {"workflow", "schedule", "cron", "timezone", "params", "start", "end"},
    # A reference of the right form (the schema's pattern) that names no registered function.
    ("POST", "/api/jobs/"): {"ref"},
    # Run ids that must name stored runs.
    ("POST", "/api/runs/bulk/"): {"ids"},
}
TAKE_A_KEY = {("POST", "/api/workflows/{name}/runs/"), ("POST", "/api/jobs/")}


def keys_differ(case) -> bool:
    """An Idempotency-Key header and an idempotency_key field that name different keys (the header
    and the body are checked apart, so a schema cannot say they must agree; the 400 says it)."""
    header = (case.headers or {}).get("Idempotency-Key")
    field = case.body.get("idempotency_key") if isinstance(case.body, dict) else None
    return header is not None and field not in (None, "") and field != header


@schemathesis.check
def refused_only_for_what_a_schema_cannot_say(ctx, response, case):
    meta = case.meta
    key = (case.method.upper(), case.operation.path)
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400 or key not in CANNOT_SAY:
        return None
    allowed = CANNOT_SAY[key] | ({"idempotency_key"} if key in TAKE_A_KEY and keys_differ(case) else set())
    named = set(response.json()) - {"detail"}
    if not named or not named <= allowed:
        raise AssertionError(f"a schema-valid request was refused for {sorted(named - allowed) or 'no field'}, which "
                             f"the schema could have said: {response.text[:500]}")
    if named == {"ref"} and "unknown job" not in response.json()["ref"][0]:
        raise AssertionError(f"a schema-valid job reference was refused for its form: {response.text[:500]}")
    return None
