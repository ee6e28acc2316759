"""The secrets store and masking in this process: encryption at rest, declarations, reads by
tasks (audited), masking of everything an attempt stores, and the backends."""

from __future__ import annotations

import base64
import io
import json
from urllib.parse import quote

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from orchestrator import executor, masking, secrets, secretstore
from orchestrator.dsl import Workflow
from orchestrator.models import Attempt, AuditEvent, Secret
from orchestrator.validation import validate
from tests.support import secret_tasks

KEY = Fernet.generate_key().decode()
STRIPE = "sk_live_4f8Ab/c+d=e&f"  # quoted, base64'd and JSON-escaped differently from itself
WAREHOUSE = "postgres://loader:p%40ss%2Fw0rd!@db.internal:5432/dwh"
WAREHOUSE_PASSWORD = "p@ss/w0rd!"


@pytest.fixture
def keyed(settings):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    return settings


@pytest.fixture
def stored(keyed):
    secretstore.put("secret", "stripe", {"value": STRIPE})
    secretstore.put("connection", "warehouse", {"url": WAREHOUSE})
    return keyed


def leaks(text: str) -> list[str]:
    """The forms of the values that appear in ``text``."""
    values = [STRIPE, WAREHOUSE, WAREHOUSE_PASSWORD]
    found = set()
    for value in values:
        for form in (value, quote(value, safe=""), base64.b64encode(value.encode()).decode(), json.dumps(value)[1:-1]):
            if form in (text or ""):
                found.add(form)
    return sorted(found)


# --- at rest -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_values_are_stored_encrypted_and_read_back_with_the_key(stored):
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM orchestrator_secret")
        rows = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert leaks(rows) == [] and "loader" not in rows, "nothing of a value is stored in clear"
    assert secretstore.lookup("secret", "stripe").value == STRIPE
    assert secretstore.lookup("connection", "warehouse").value == {"url": WAREHOUSE}
    row = Secret.objects.get(name="stripe")
    assert row.key_id == secretstore.key_id(KEY) and KEY not in row.key_id
    assert row.set_on.startswith("set on ") and row.set_on.endswith(" by " + row.updated_by_name)


@pytest.mark.django_db
def test_without_a_key_nothing_is_stored_and_the_error_says_which_setting(settings):
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    with pytest.raises(secretstore.KeyMissing, match="ORCHESTRATOR_SECRETS_KEYS"):
        secretstore.put("secret", "stripe", {"value": STRIPE})
    assert not Secret.objects.exists()
    settings.ORCHESTRATOR_SECRETS_KEYS = ["not-a-key"]
    assert secretstore.key_problems() == [
        "ORCHESTRATOR_SECRETS_KEYS[0] is not a Fernet key (32 bytes in URL-safe base64, 44 characters)"]


@pytest.mark.parametrize(("kind", "value", "field", "message"), [
    ("secret", "", "value", "non-empty string"),
    ("secret", 12, "value", "non-empty string"),
    ("connection", "not a url", "url", "scheme://"),
    ("connection", '{"host": "h", "port": "x"}', "fields", "port must be a whole number"),
    ("connection", '{"hots": "h"}', "fields", "unknown connection field(s) hots"),
    ("connection", "{broken", "value", "not valid"),
])
def test_bad_values_are_refused_naming_the_field(kind, value, field, message):
    with pytest.raises(secretstore.StoreError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        secretstore.stored_data(kind, value)
    assert caught.value.field == field


# --- declarations --------------------------------------------------------------------------------


def test_declarations_land_in_the_spec_and_bad_ones_are_reported_at_sync():
    spec = secret_tasks.probe.to_spec()["tasks"]
    assert spec["leak"]["secrets"] == ["stripe"] and spec["leak"]["connections"] == ["warehouse"]
    assert spec["sneak"]["secrets"] == ["stripe"] and "connections" not in spec["sneak"]
    assert spec["shell_leak"]["secret_env"] == {"SECRET_STRIPE": "stripe"}
    assert spec["shell_leak"]["connection_env"] == {"DB": "warehouse"}
    assert validate(secret_tasks.probe) == []

    bad = Workflow("bad-secrets", secrets="ok", connections=[3], module="tests")
    bad.shell("a", "true", secrets={"1X": "stripe"})
    bad.shell("b", "true", env={"SECRET_STRIPE": "x"}, secrets=["stripe"])
    fields = {error.field: error.message for error in validate(bad)}
    assert "is not a connection name" in fields["connections"]
    assert "not an environment variable name" in fields["tasks.a.secrets"]
    assert "also a variable of env=" in fields["tasks.b.secrets"]


def test_a_workflow_without_secrets_keeps_its_spec_and_hash():
    wf = Workflow("plain", module="tests")
    wf.shell("a", "true")
    assert set(wf.to_spec()["tasks"]["a"]) == {"kind", "max_attempts", "retry_delay", "retry_backoff",
                                               "retry_max_delay", "timeout", "queue", "priority", "trigger_rule",
                                               "upstream", "command", "env"}


# --- masking -------------------------------------------------------------------------------------


def test_the_masker_hides_every_form_even_across_writes():
    masker = masking.Masker()
    masker.add(STRIPE)
    out = "".join(masker.feed(piece) for piece in ["key=", STRIPE[:5], STRIPE[5:], " and ",
                                                    quote(STRIPE, safe=""), " ", base64.b64encode(STRIPE.encode()).decode()])
    out += masker.flush()
    assert out == "key=*** and *** ***"
    assert masker.mask_json(json.dumps({"k": STRIPE, "l": [f"x {STRIPE}"]})) == '{"k": "***", "l": ["x ***"]}'
    short = masking.Masker()
    short.add("abc")  # too short to mask without hiding the log
    assert short.mask("abcabc") == "abcabc"


@pytest.mark.django_db
def test_a_task_that_prints_logs_raises_and_returns_a_secret_is_masked_everywhere(stored):
    outcome = secret_tasks.probe.test(params={"fail": False}, keep=True)
    leak = outcome["leak"]
    assert leak.state == "succeeded", leak.error
    assert leak.result == {"key": "***", "nested": ["Bearer ***"], "password": "***"}
    assert leaks(leak.log) == [] and "*** " in leak.log and "in pieces: ***" in leak.log
    assert "quoted: ***, base64: ***" in leak.log and "RuntimeError: inner ***" in leak.log

    failed = secret_tasks.probe.test(params={"fail": True}, keep=True)["leak"]
    assert failed.state == "dead"
    assert failed.error == "ValueError: the API refused key *** at ***"
    attempt = Attempt.objects.filter(task_run__task="leak").latest("id")
    assert "ValueError: the API refused key *** at ***" in attempt.traceback
    assert leaks(attempt.traceback + attempt.error + failed.log) == []
    assert "the API refused key ***" in failed.log

    shell = outcome["shell_leak"]
    assert shell.state == "succeeded", shell.error
    assert "shell sees ***" in shell.log and "and ***" in shell.log and leaks(shell.log) == []


@pytest.mark.django_db
def test_a_task_reading_an_undeclared_secret_fails_saying_so(stored):
    sneak = secret_tasks.probe.test()["sneak"]
    assert sneak.state == "dead"
    assert sneak.error.startswith("SecretNotDeclared: task 'sneak' reads the secret "
                                  "'payroll', which it does not declare: add secrets=['payroll']")
    assert not AuditEvent.objects.filter(action="secret_read", target_id="secret:payroll").exists()


@pytest.mark.django_db
def test_every_read_by_a_task_is_audited_once_per_attempt_without_the_value(stored):
    secret_tasks.probe.test(keep=True)
    reads = AuditEvent.objects.filter(action="secret_read").order_by("id")
    seen = {(event.detail["task"], event.target_id) for event in reads}
    assert seen == {("leak", "secret:stripe"), ("leak", "connection:warehouse"),
                    ("shell_leak", "secret:stripe"), ("shell_leak", "connection:warehouse")}
    assert reads.count() == 4, "one record per secret and attempt"
    event = reads.filter(detail__task="leak").first()
    assert event.source == "task" and event.detail["run"] > 0 and event.actor is None
    assert event.detail["task_run"] and event.detail["attempt"] == 1 and event.detail["backend"] == "database"
    everything = json.dumps(list(AuditEvent.objects.values()), default=str)
    assert leaks(everything) == []


@pytest.mark.django_db
def test_a_missing_secret_or_key_fails_the_task_with_a_clear_message(keyed):
    missing = secret_tasks.probe.test()["leak"]
    assert missing.error.startswith("SecretNotFound: the secret 'stripe' is not set (looked in: database)")
    secretstore.put("secret", "stripe", {"value": STRIPE})
    keyed.ORCHESTRATOR_SECRETS_KEYS = []
    no_key = secret_tasks.probe.test()["leak"]
    assert no_key.error.startswith("KeyMissing: the secrets store has no key: set ORCHESTRATOR_SECRETS_KEYS")


def test_secrets_are_read_only_by_a_running_task():
    with pytest.raises(secrets.SecretError, match="read by a task while it runs"):
        secrets.secret("stripe")


# --- backends ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_environment_and_a_mounted_folder_can_hold_secrets(keyed, monkeypatch, tmp_path):
    keyed.ORCHESTRATOR_SECRETS_BACKENDS = ["env", "files", "database"]
    keyed.ORCHESTRATOR_SECRETS_DIR = str(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_SECRET_STRIPE", STRIPE)
    (tmp_path / "connection-warehouse").write_text(json.dumps({"scheme": "postgres", "host": "db.internal",
                                                               "login": "loader", "password": WAREHOUSE_PASSWORD,
                                                               "database": "dwh"}) + "\n")
    outcome = secret_tasks.probe.test(keep=True)
    leak = outcome["leak"]
    assert leak.state == "succeeded", leak.error
    assert leak.result == {"key": "***", "nested": ["Bearer ***"], "password": "***"}
    assert "connecting to *** as loader with ***" in leak.log
    backends = set(AuditEvent.objects.filter(action="secret_read").values_list("detail__backend", flat=True))
    assert backends == {"env", "files"}
    keyed.ORCHESTRATOR_SECRETS_BACKENDS = ["tests.nowhere.Backend"]
    assert "is not a backend" in secret_tasks.probe.test()["leak"].error


def test_a_connection_reads_its_url_and_fields():
    conn = secrets.Connection.from_stored("w", {"url": WAREHOUSE + "?sslmode=require"})
    assert (conn.scheme, conn.host, conn.port, conn.login, conn.password, conn.database) == \
        ("postgres", "db.internal", 5432, "loader", WAREHOUSE_PASSWORD, "dwh")
    assert conn.extra == {"sslmode": "require"} and WAREHOUSE_PASSWORD not in repr(conn)
    built = secrets.Connection.from_stored("w", {"fields": {"scheme": "postgres", "host": "h", "port": 5433,
                                                            "login": "u", "password": "p@ss", "database": "d"}})
    assert built.url == "postgres://u:p%40ss@h:5433/d"


def test_a_row_cannot_grant_what_the_code_does_not_declare():
    # A shell task row naming secrets its workflow's stored graph does not declare is refused.
    message = {"id": 1, "task": "t", "spec": {"kind": "shell", "command": "echo", "env": {},
                                              "secret_env": {"X": "stripe"}}}
    with pytest.raises(executor.TaskFailure, match="refused"):
        executor.check_shell(message, declared={"kind": "shell", "command": "echo", "env": {}})
    # A job's spec (which an API client can add keys to) grants nothing: only @job(secrets=...) does.
    job = {"id": 2, "run_id": 1, "number": 1, "task": "tests.support.secret_tasks:async_sneak",
           "spec": {"kind": "python", "ref": "tests.support.secret_tasks:async_sneak", "call": "job", "args": [],
                    "kwargs": {}, "secrets": ["stripe"]}}
    reply = executor.run(job, log_stream=io.StringIO())
    assert reply[2] == "failed" and reply[4].startswith(
        "SecretNotDeclared: job 'tests.support.secret_tasks:async_sneak' reads the secret 'stripe', which it does "
        "not declare")
