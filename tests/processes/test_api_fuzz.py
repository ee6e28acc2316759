# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""A schema-driven fuzz run: schemathesis generates requests (valid and invalid) for every
operation of /api/schema/ and sends them to a real server as an operator. No answer may be a
5xx, every answer must match the schema (status code, content type, headers, body), and the
server must accept what the schema allows and refuse what it does not (schemathesis'
positive_data_acceptance and negative_data_rejection checks)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.api.permissions import create_token
from orchestrator.runs import trigger_workflow
from tests.support.api_support import operator, start_server, workflow  # noqa: F401 - fixtures

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "negative_data_rejection", "positive_data_acceptance",
    "missing_required_header", "unsupported_method", "refused_only_for_what_a_schema_cannot_say",
])
HOOKS = Path(__file__).resolve().parent.parent / "support" / "api_fuzz_checks.py"

# Three operations check what a schema cannot say, so for them a schema-valid request may still be
# a 400: the params of a trigger are checked against the workflow's own declared params (the
# schema allows any object), a backfill names a workflow and a schedule that must exist and a
# cron expression that must parse, and a job names a function that must be registered; an
# Idempotency-Key header and an idempotency_key field may differ. tests/support/api_fuzz_checks.py fails
# such a 400 when it names anything else. Every other operation must accept every request its
# schema allows.
CONFIG = textwrap.dedent(f"""
    hooks = "{HOOKS}"

    [phases.coverage]
    unexpected-methods = ["delete"]

    [[operations]]
    include-path-regex = "^/api/(workflows/[^/]+/runs|backfills|jobs)/$"
    include-method = "POST"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409"]
""")


@pytest.mark.slow  # about a minute on an idle 2-core machine, several when it is shared
@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_schema(processes, operator, workflow,
                                                                           tmp_path):
    # Backfills over random date ranges stay small, so the run stays within its time budget.
    base = start_server(processes, ORCHESTRATOR_MAX_BACKFILL_RUNS="20", DEBUG="0", ALLOWED_HOSTS="127.0.0.1")
    token = create_token(operator)
    trigger_workflow(workflow, {"day": "2026-03-01"})  # something to read, cancel and retry
    # The coverage phase sends the schema's boundary values (huge numbers, empty and long strings,
    # wrong types); one unexpected method per path is enough to see 405s answered in JSON.
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run", f"{base}/api/schema/",
        "--header", f"Authorization: Token {token}",
        "--checks", CHECKS, "--max-examples", "5", "--seed", "20261129", "--workers", "2",
        "--phases", "examples,coverage,fuzzing", "--request-timeout", "10", "--max-failures", "20",
        "--generation-database", "none", "--no-color", "--output-truncate", "false",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"schemathesis ran out of its time budget:\n{exc.stdout}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20000:]
    assert "passed" in output.lower()
