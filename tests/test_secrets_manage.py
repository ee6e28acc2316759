"""Managing the secrets store: the API and the admin (superusers and Secrets managers only, values
write-only), the audit of every change, key rotation without downtime, and the start-up check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import checks, secretstore
from orchestrator.models import AuditEvent, Secret
from tests.conftest import ROOT
from tests.support import secret_tasks
from tests.support.api_support import client_for, make_user
from tests.test_secrets import KEY, STRIPE, WAREHOUSE, leaks

NEW_KEY = Fernet.generate_key().decode()


@pytest.fixture
def keyed(settings):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    return settings


@pytest.fixture
def manager(db):
    return make_user("mara", secretstore.MANAGERS)


# --- the API ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_secrets_manager_stores_replaces_and_deletes_and_no_answer_holds_a_value(keyed, manager):
    api = client_for(manager)
    created = api.post("/api/secrets/", {"name": "stripe", "value": STRIPE, "description": "live key"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["set_on"].startswith("set on ") and created.json()["set_on"].endswith(" by mara")
    conn = api.post("/api/secrets/", {"kind": "connection", "name": "warehouse", "url": WAREHOUSE}, format="json")
    assert conn.status_code == 201, conn.content
    fields = api.post("/api/secrets/", {"kind": "connection", "name": "crm",
                                        "fields": {"host": "crm", "port": 443, "password": STRIPE}}, format="json")
    assert fields.status_code == 201, fields.content
    answers = [created, conn, fields, api.get("/api/secrets/"), api.get("/api/secrets/secret/stripe/"),
               api.get("/api/secrets/connection/warehouse/")]
    replaced = api.put("/api/secrets/secret/stripe/", {"value": STRIPE + "-2"}, format="json")
    described = api.patch("/api/secrets/secret/stripe/", {"description": "rotated"}, format="json")
    answers += [replaced, described]
    for answer in answers:
        assert answer.status_code in (200, 201)
        assert leaks(answer.content.decode()) == [] and "-2" not in answer.content.decode()
    assert secretstore.lookup("secret", "stripe").value == STRIPE + "-2"
    assert secretstore.lookup("connection", "crm").value == {"fields": {"host": "crm", "port": 443, "password": STRIPE}}
    assert described.json()["description"] == "rotated"
    stripe_id = str(Secret.objects.get(name="stripe").pk)
    assert api.delete("/api/secrets/secret/stripe/").status_code == 204
    assert not Secret.objects.filter(name="stripe").exists()

    changes = list(AuditEvent.objects.filter(action__startswith="secret_").order_by("id")
                   .values_list("action", "actor_name", "target_id", "source"))
    assert [change[0] for change in changes] == ["secret_set", "secret_set", "secret_set", "secret_set",
                                                "secret_describe", "secret_delete"]
    assert all(actor == "mara" and source == "api" for _, actor, _, source in changes)
    assert changes[0][2] == stripe_id
    assert leaks(json.dumps(list(AuditEvent.objects.values()), default=str)) == []


@pytest.mark.django_db
@pytest.mark.parametrize("group", ["Viewers", "Operators", None])
def test_only_superusers_and_secrets_managers_reach_the_secrets_api(keyed, group):
    secretstore.put("secret", "stripe", {"value": STRIPE})
    api = client_for(make_user(f"user-{group}", group))
    assert api.get("/api/secrets/").status_code == 403
    assert api.get("/api/secrets/secret/stripe/").status_code == 403
    assert api.post("/api/secrets/", {"name": "x", "value": "abcdef"}, format="json").status_code == 403
    assert api.put("/api/secrets/secret/stripe/", {"value": "abcdef"}, format="json").status_code == 403
    assert api.delete("/api/secrets/secret/stripe/").status_code == 403
    assert client_for(None).get("/api/secrets/").status_code == 401
    assert secretstore.lookup("secret", "stripe").value == STRIPE


@pytest.mark.django_db
@pytest.mark.parametrize(("request_body", "field"), [
    ({"name": "bad name", "value": "abcdef"}, "name"),
    ({"name": "stripe"}, "value"),
    ({"name": "stripe", "value": ""}, "value"),
    ({"name": "stripe", "url": "https://x"}, "value"),
    ({"kind": "connection", "name": "w", "url": "nope"}, "url"),
    ({"kind": "connection", "name": "w", "fields": {"port": 70000}}, "fields"),
    ({"kind": "vault", "name": "w", "value": "abcdef"}, "kind"),
    ({"name": "dup", "value": "abcdef"}, "name"),
])
def test_bad_requests_are_400s_naming_the_field_and_store_nothing(keyed, manager, request_body, field):
    secretstore.put("secret", "dup", {"value": "first-value"})
    before = list(Secret.objects.values_list("name", "value"))
    answer = client_for(manager).post("/api/secrets/", request_body, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.content
    assert list(Secret.objects.values_list("name", "value")) == before


@pytest.mark.django_db
def test_without_a_key_the_api_says_so_instead_of_failing(settings, manager):
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    answer = client_for(manager).post("/api/secrets/", {"name": "stripe", "value": STRIPE}, format="json")
    assert answer.status_code == 400 and "ORCHESTRATOR_SECRETS_KEYS" in answer.json()["non_field_errors"][0]
    assert not Secret.objects.exists()


# --- the admin -------------------------------------------------------------------------------------


def admin_client(user) -> Client:
    user.is_staff = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_admin_stores_a_value_it_never_shows_again(keyed, manager):
    client = admin_client(manager)
    added = client.post("/admin/orchestrator/secret/add/", {"kind": "secret", "name": "stripe", "value": STRIPE,
                                                           "description": "live"})
    assert added.status_code == 302, added.content.decode()[:2000]
    row = Secret.objects.get(name="stripe")
    pages = [client.get("/admin/orchestrator/secret/"), client.get(f"/admin/orchestrator/secret/{row.pk}/change/")]
    assert all(page.status_code == 200 for page in pages)
    assert all(leaks(page.content.decode()) == [] for page in pages)
    assert "set on " in pages[0].content.decode() and "by mara" in pages[0].content.decode()
    # Saved without a value: the stored one stays; with one: replaced.
    kept = client.post(f"/admin/orchestrator/secret/{row.pk}/change/", {"description": "still live", "value": ""})
    assert kept.status_code == 302 and secretstore.lookup("secret", "stripe").value == STRIPE
    client.post(f"/admin/orchestrator/secret/{row.pk}/change/", {"description": "new", "value": "sk_new_value"})
    assert secretstore.lookup("secret", "stripe").value == "sk_new_value"
    client.post(f"/admin/orchestrator/secret/{row.pk}/delete/", {"post": "yes"})
    assert not Secret.objects.exists()
    actions = list(AuditEvent.objects.filter(action__startswith="secret_").order_by("id")
                   .values_list("action", "source"))
    assert actions == [("secret_set", "admin"), ("secret_describe", "admin"), ("secret_set", "admin"),
                       ("secret_delete", "admin")]


@pytest.mark.django_db
def test_staff_outside_the_secrets_managers_cannot_see_the_secrets_admin(keyed):
    secretstore.put("secret", "stripe", {"value": STRIPE})
    client = admin_client(make_user("ops", "Operators"))
    assert client.get("/admin/orchestrator/secret/").status_code == 403
    assert client.post("/admin/orchestrator/secret/add/", {"kind": "secret", "name": "x",
                                                          "value": "abcdef"}).status_code == 403
    assert Secret.objects.count() == 1


@pytest.mark.django_db
def test_the_admin_form_reports_a_bad_value_and_a_missing_key(settings, manager):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    client = admin_client(manager)
    bad = client.post("/admin/orchestrator/secret/add/", {"kind": "connection", "name": "w", "value": "nope"})
    assert bad.status_code == 200 and "scheme://" in bad.content.decode()
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    no_key = client.post("/admin/orchestrator/secret/add/", {"kind": "secret", "name": "s", "value": STRIPE})
    assert no_key.status_code == 200 and "ORCHESTRATOR_SECRETS_KEYS" in no_key.content.decode()
    assert not Secret.objects.exists()


# --- rotation ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_rotation_re_encrypts_every_value_under_the_new_key_while_old_values_stay_readable(settings, capsys):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    for index in range(7):
        secretstore.put("secret", f"s{index}", {"value": f"value-{index}"})
    secretstore.put("connection", "warehouse", {"url": WAREHOUSE})
    # The new key first, the old one after it: old values are still read before any rotation.
    settings.ORCHESTRATOR_SECRETS_KEYS = [NEW_KEY, KEY]
    assert secretstore.lookup("secret", "s3").value == "value-3"
    secretstore.put("secret", "s0", {"value": "changed"})  # written under the new key already
    assert secretstore.under_old_keys() == 7
    with CaptureQueriesContext(connection) as queries:
        call_command("rotate_secrets_key", "--batch-size", "3")
    out = capsys.readouterr().out
    assert "re-encrypted 7 under the newest key" in out and "0 left under older keys" in out
    statements = [q["sql"] for q in queries.captured_queries if "orchestrator_secret " in q["sql"]
                  or "orchestrator_secret\n" in q["sql"]]
    assert sum(sql.lstrip().startswith("UPDATE") for sql in statements) == 3, "one update per batch of 3"
    assert set(Secret.objects.values_list("key_id", flat=True)) == {secretstore.key_id(NEW_KEY)}
    # The old key can go: every value reads with the new one alone.
    settings.ORCHESTRATOR_SECRETS_KEYS = [NEW_KEY]
    assert [secretstore.lookup("secret", f"s{i}").value for i in range(1, 7)] == [f"value-{i}" for i in range(1, 7)]
    assert secretstore.lookup("secret", "s0").value == "changed"
    assert secretstore.lookup("connection", "warehouse").value == {"url": WAREHOUSE}
    rotated = AuditEvent.objects.get(action="secret_rotate")
    assert rotated.detail["rotated"] == 7 and rotated.detail["key_id"] == secretstore.key_id(NEW_KEY)


@pytest.mark.django_db
def test_rotation_names_the_values_no_key_reads_and_a_new_key_can_be_made(settings, capsys):
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    secretstore.put("secret", "lost", {"value": "abcdef"})
    settings.ORCHESTRATOR_SECRETS_KEYS = [NEW_KEY]  # the old key dropped too early
    with pytest.raises(CommandError, match="1 cannot be decrypted with any key: secret lost"):
        call_command("rotate_secrets_key")
    call_command("rotate_secrets_key", "--new-key")
    Fernet(capsys.readouterr().out.strip().splitlines()[-1])  # a valid key
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    with pytest.raises(CommandError, match="ORCHESTRATOR_SECRETS_KEYS"):
        call_command("rotate_secrets_key")


# --- the start-up check ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_checks_report_a_bad_key_and_stored_values_without_a_key(settings):
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    assert checks.check_secrets_store() == [], "nothing stored, no key: nothing to say"
    settings.ORCHESTRATOR_SECRETS_KEYS = ["short"]
    assert [p.id for p in checks.check_secrets_store()] == ["orchestrator.E014"]
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    settings.ORCHESTRATOR_SECRETS_BACKENDS = ["env", "tests.nowhere.Backend"]
    problems = checks.check_secrets_store()
    assert [p.id for p in problems] == ["orchestrator.E014"] and "tests.nowhere.Backend" in problems[0].msg
    settings.ORCHESTRATOR_SECRETS_BACKENDS = ["database"]
    settings.ORCHESTRATOR_SECRETS_KEYS = [KEY]
    secretstore.put("secret", "stripe", {"value": STRIPE})
    assert checks.check_secrets_store() == []
    settings.ORCHESTRATOR_SECRETS_KEYS = []
    problems = checks.check_secrets_store()
    assert [p.id for p in problems] == ["orchestrator.E014"] and "holds values" in problems[0].msg


def test_the_standalone_project_makes_its_own_key_in_development_and_the_variable_wins(tmp_path):
    def keys(**env):
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORCHESTRATOR_DATA_DIR": str(tmp_path), **env}
        result = subprocess.run([sys.executable, "-c", "import project.settings as s; "
                                 "print(','.join(getattr(s, 'ORCHESTRATOR_SECRETS_KEYS', [])))"],
                                cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    made = keys()
    Fernet(made)
    assert (tmp_path / "secrets-key").read_text().strip() == made and keys() == made, "kept for the next start"
    assert oct((tmp_path / "secrets-key").stat().st_mode & 0o777) == "0o600"
    assert keys(ORCHESTRATOR_SECRETS_KEYS=NEW_KEY) == "", "the variable wins (read by the app from the environment)"
    assert keys(DATABASE_URL="postgres://u@db/x", DEBUG="0") == "", "production sets its own"


@pytest.mark.django_db
def test_the_audit_page_and_api_show_secret_changes_and_reads_without_a_value(keyed, manager):
    client_for(manager).post("/api/secrets/", {"name": "stripe", "value": STRIPE}, format="json")
    secretstore.put("connection", "warehouse", {"url": WAREHOUSE})
    secret_tasks.probe.test(keep=True)
    operator = make_user("olga", "Operators")
    page = Client()
    page.force_login(operator)
    html = page.get(reverse("orchestrator:web:audit") + "?source=task")
    assert html.status_code == 200 and "secret_read" in html.content.decode()
    api = client_for(operator).get("/api/audit/?action=secret_read")
    assert api.status_code == 200 and len(api.json()["results"]) == 4
    everything = html.content.decode() + api.content.decode() + client_for(operator).get("/api/audit/").content.decode()
    assert leaks(everything) == []
