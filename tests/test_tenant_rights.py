# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Rights per tenant and per workflow: given to a user or a group, read once per request, applied
to querysets and objects; the audit log keeps each record's tenant; the admin, the API and
create_token give them. The route-by-route matrix is tests/test_tenant_access.py."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access, audit
from orchestrator.models import AuditEvent, Run, TaskRun, TaskState, TenantGrant, Workflow
from orchestrator.runs import create_run
from tests.support.api_support import client_for, make_user, operator, workflow  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def other_workflow(workflow: Workflow, name: str, tenant: str) -> Workflow:
    """A copy of ``workflow`` (its graph version) under another name, in ``tenant``."""
    return Workflow.objects.create(name=name, tenant=tenant, module=workflow.module,
                                   current_version=workflow.current_version)


def test_a_group_grant_gives_its_members_the_tenant_and_a_workflow_grant_one_workflow(workflow):
    Workflow.objects.filter(pk=workflow.pk).update(tenant="sales")
    billing = other_workflow(workflow, "billing", "finance")
    payroll = other_workflow(workflow, "payroll", "finance")
    team = Group.objects.create(name="sales-team")
    TenantGrant.objects.create(group=team, role=TenantGrant.Role.OPERATOR, tenant="sales")
    ana = make_user("ana", None)
    ana.groups.add(team)
    TenantGrant.objects.create(user=ana, role=TenantGrant.Role.VIEWER, workflow="billing")
    ana = type(ana).objects.get(pk=ana.pk)

    assert sorted(access.visible(ana, Workflow.objects.all()).values_list("name", flat=True)) == ["billing", "reports"]
    assert list(access.operable(ana, Workflow.objects.all()).values_list("name", flat=True)) == ["reports"]
    assert access.can_view(ana, billing) and not access.can_operate(ana, billing)
    assert not access.can_view(ana, payroll)
    run, _ = create_run(billing, trigger="manual")
    assert run.tenant == "finance"
    # A grant on a workflow reaches its runs and task runs by the workflow's name.
    assert list(access.visible(ana, Run.objects.all())) == [run]
    assert access.visible(ana, TaskRun.objects.all()).count() == run.task_runs.count()
    assert access.operable(ana, Run.objects.all()).count() == 0


def test_rights_are_read_once_per_user_object(workflow):
    ana = make_user("ana", None)
    TenantGrant.objects.create(user=ana, role=TenantGrant.Role.VIEWER, tenant="default")
    access.reading(ana)
    with CaptureQueriesContext(connection) as queries:
        access.reading(ana), access.operating(ana), access.reads_anything(ana), access.is_scoped(ana)
    assert len(queries) == 0


def test_without_grants_the_global_groups_keep_their_meaning_and_others_see_nothing(workflow, operator):
    nobody = make_user("nobody", None)
    viewer = make_user("vic", access.VIEWERS)
    assert access.visible(operator, Workflow.objects.all()).count() == 1
    assert access.operable(operator, Workflow.objects.all()).count() == 1
    assert access.visible(viewer, Workflow.objects.all()).count() == 1
    assert access.operable(viewer, Workflow.objects.all()).count() == 0
    assert access.visible(nobody, Workflow.objects.all()).count() == 0
    assert not access.reads_anything(nobody)
    # The pages and the API refuse a user without any right, as before.
    assert client_for(nobody).get(reverse("orchestrator:api:runs")).status_code == 403


def test_a_grant_names_a_user_or_a_group_and_a_tenant_or_a_workflow():
    ana = make_user("ana", None)
    group = Group.objects.create(name="team")
    for fields in ({"tenant": "a"}, {"user": ana, "group": group, "tenant": "a"},
                   {"user": ana, "tenant": "a", "workflow": "w"}, {"user": ana}):
        with pytest.raises(IntegrityError), transaction.atomic():
            TenantGrant.objects.create(role="viewer", **fields)
    TenantGrant.objects.create(user=ana, role="viewer", tenant="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantGrant.objects.create(user=ana, role="viewer", tenant="a")


def test_each_record_of_a_bulk_action_keeps_its_own_task_runs_tenant(workflow, operator):
    billing = other_workflow(workflow, "billing", "finance")
    ours, _ = create_run(workflow, trigger="manual")
    theirs, _ = create_run(billing, trigger="manual")
    ids = [ours.task_runs.first().pk, theirs.task_runs.first().pk]
    audit.record_each("retry", "taskrun", ids, user=operator, source="api")
    assert sorted(AuditEvent.objects.values_list("target_id", "tenant", "workflow")) == sorted(
        [(str(ids[0]), "default", "reports"), (str(ids[1]), "finance", "billing")])
    audit.record("pause", user=operator, source="api", target=billing)
    assert AuditEvent.objects.order_by("-id").values_list("tenant", "workflow").first() == ("finance", "billing")


def test_an_operator_of_a_tenant_reads_only_its_audit_records(workflow, operator):
    billing = other_workflow(workflow, "billing", "finance")
    audit.record("pause", user=operator, source="api", target=workflow)
    audit.record("pause", user=operator, source="api", target=billing)
    fin = make_user("fin", None)
    TenantGrant.objects.create(user=fin, role=TenantGrant.Role.OPERATOR, tenant="finance")
    answer = client_for(fin).get(reverse("orchestrator:api:audit"))
    assert answer.status_code == 200
    assert [row["target_label"] for row in answer.json()["results"]] == ["billing"]
    # A viewer of the tenant does not read the audit log, as a global viewer does not.
    reader = make_user("reader", None)
    TenantGrant.objects.create(user=reader, role=TenantGrant.Role.VIEWER, tenant="finance")
    assert client_for(reader).get(reverse("orchestrator:api:audit")).status_code == 403


def test_a_bulk_retry_of_another_tenants_task_runs_changes_nothing(workflow):
    billing = other_workflow(workflow, "billing", "finance")
    run, _ = create_run(billing, trigger="manual")
    dead = run.task_runs.first()
    TaskRun.objects.filter(pk=dead.pk).update(state=TaskState.DEAD, attempts=1)
    sales = make_user("sales", None)
    TenantGrant.objects.create(user=sales, role=TenantGrant.Role.OPERATOR, tenant="default")
    answer = client_for(sales).post(reverse("orchestrator:api:dlq-retry"), {"ids": [dead.pk]}, format="json")
    assert (answer.status_code, answer.json()) == (200, {"requested": 0, "retried": 0})
    assert TaskRun.objects.get(pk=dead.pk).state == TaskState.DEAD
    # One the user reads but may not act on is refused.
    TenantGrant.objects.create(user=sales, role=TenantGrant.Role.VIEWER, tenant="finance")
    answer = client_for(sales).post(reverse("orchestrator:api:dlq-retry"), {"ids": [dead.pk]}, format="json")
    assert answer.status_code == 403
    assert TaskRun.objects.get(pk=dead.pk).state == TaskState.DEAD


def test_superusers_give_and_take_rights_through_the_api_and_each_is_audited(workflow):
    root = make_user("root", None)
    type(root).objects.filter(pk=root.pk).update(is_superuser=True)
    api = client_for(type(root).objects.get(pk=root.pk))
    make_user("ana", None)
    answer = api.post(reverse("orchestrator:api:grants"), {"user": "ana", "role": "operator", "tenant": "sales"},
                      format="json")
    assert answer.status_code == 201, answer.json()
    grant = answer.json()
    assert (grant["user"], grant["role"], grant["tenant"], grant["workflow"]) == ("ana", "operator", "sales", "")
    assert api.post(reverse("orchestrator:api:grants"), {"user": "ana", "role": "operator", "tenant": "sales"},
                    format="json").status_code == 400
    for bad in ({"user": "ghost", "role": "viewer", "tenant": "x"}, {"user": "ana", "role": "viewer"},
                {"user": "ana", "group": "Viewers", "role": "viewer", "tenant": "x"},
                {"user": "ana", "role": "boss", "tenant": "x"}):
        answer = api.post(reverse("orchestrator:api:grants"), bad, format="json")
        assert answer.status_code == 400, (bad, answer.json())
    assert TenantGrant.objects.count() == 1
    assert api.delete(reverse("orchestrator:api:grant", args=[grant["id"]])).status_code == 204
    assert list(AuditEvent.objects.order_by("id").values_list("action", "target_type")) == [
        ("grant", "tenantgrant"), ("revoke", "tenantgrant")]
    operator = make_user("olga", access.OPERATORS)
    assert client_for(operator).get(reverse("orchestrator:api:grants")).status_code == 403


def test_create_token_gives_a_role_on_a_tenant():
    out, err = io.StringIO(), io.StringIO()
    call_command("create_token", "team-a", "--create", "--role", "operator", "--tenant", "a", stdout=out, stderr=err)
    grant = TenantGrant.objects.get()
    assert (grant.user.username, grant.role, grant.tenant) == ("team-a", "operator", "a")
    assert not grant.user.groups.exists()
    assert "neither" not in err.getvalue()


def test_a_run_page_shows_its_actions_only_to_an_operator_of_its_tenant(client, workflow):
    billing = other_workflow(workflow, "billing", "finance")
    run, _ = create_run(billing, trigger="manual")
    both = make_user("both", None)
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.OPERATOR, tenant="default")
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.VIEWER, tenant="finance")
    client.force_login(both)
    cancel = reverse("orchestrator:web:run_cancel", args=[run.pk])
    page = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert cancel not in page
    assert client.post(cancel).status_code == 403
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.OPERATOR, tenant="finance")
    page = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert cancel in page


def test_a_tenant_users_run_list_costs_the_same_statements_for_one_run_or_many(client, workflow):
    billing = other_workflow(workflow, "billing", "finance")
    ana = make_user("ana", None)
    TenantGrant.objects.create(user=ana, role=TenantGrant.Role.VIEWER, tenant="finance")
    client.force_login(ana)
    create_run(billing, trigger="manual")
    client.get(reverse("orchestrator:api:runs"))  # what a process caches on its first request
    with CaptureQueriesContext(connection) as one:
        assert client.get(reverse("orchestrator:api:runs")).status_code == 200
    for _ in range(20):
        create_run(billing, trigger="manual")
        create_run(workflow, trigger="manual")
    with CaptureQueriesContext(connection) as many:
        answer = client.get(reverse("orchestrator:api:runs"))
    assert len(answer.json()["results"]) == 21
    assert len(many) == len(one)


def test_only_superusers_manage_tenant_grants_in_the_admin(client):
    root = make_user("root", None)
    type(root).objects.filter(pk=root.pk).update(is_superuser=True, is_staff=True)
    staff_operator = make_user("olga", access.OPERATORS)
    type(staff_operator).objects.filter(pk=staff_operator.pk).update(is_staff=True)
    changelist = reverse("admin:orchestrator_tenantgrant_changelist")
    client.force_login(staff_operator)
    assert client.get(changelist).status_code == 403
    client.force_login(type(root).objects.get(pk=root.pk))
    assert client.get(changelist).status_code == 200
    ana = make_user("ana", None)
    answer = client.post(reverse("admin:orchestrator_tenantgrant_add"),
                         {"user": ana.pk, "role": "operator", "tenant": "sales", "workflow": ""})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert list(TenantGrant.objects.values_list("user__username", "role", "tenant")) == [("ana", "operator", "sales")]
    assert AuditEvent.objects.get().action == "grant"
    # Neither or both of tenant and workflow: the form says so and nothing is stored.
    answer = client.post(reverse("admin:orchestrator_tenantgrant_add"),
                         {"user": ana.pk, "role": "viewer", "tenant": "", "workflow": ""})
    assert answer.status_code == 200 and "Name a tenant or a workflow" in answer.content.decode()
    assert TenantGrant.objects.count() == 1
