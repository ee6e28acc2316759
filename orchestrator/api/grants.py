"""The API of rights per tenant (``TenantGrant``): superusers list, give and take them. A right
given or taken is in the audit log (action ``grant`` or ``revoke``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.urls import reverse
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from orchestrator import audit
from orchestrator.api.base import APIBase, body, errors, validated
from orchestrator.api.permissions import SuperusersOnly
from orchestrator.api.schema import extend_schema
from orchestrator.models import TenantGrant


class GrantSerializer(serializers.ModelSerializer):
    user = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    group = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = TenantGrant
        fields = ["id", "user", "group", "role", "tenant", "workflow", "created_at"]


class GrantRequestSerializer(serializers.Serializer):
    user = serializers.CharField(required=False, max_length=150, help_text="A user name (or give group).")
    group = serializers.CharField(required=False, max_length=150, help_text="A group's name (or give user).")
    role = serializers.ChoiceField(choices=TenantGrant.Role.choices)
    tenant = serializers.CharField(required=False, default="", allow_blank=True, max_length=200)
    workflow = serializers.CharField(required=False, default="", allow_blank=True, max_length=200)

    def validate(self, data):
        if bool(data.get("user")) == bool(data.get("group")):
            raise ValidationError({"user": ["give a user or a group (one of them)"]})
        if bool(data["tenant"]) == bool(data["workflow"]):
            raise ValidationError({"tenant": ["name a tenant or a workflow (one of them)"]})
        for key in ("user", "group", "tenant", "workflow"):
            if "\x00" in data.get(key, ""):
                raise ValidationError({key: ["contains a NUL character"]})
        if data.get("user"):
            data["user"] = get_user_model().objects.filter(username=data["user"]).first() or _unknown("user", data)
        else:
            data["group"] = Group.objects.filter(name=data["group"]).first() or _unknown("group", data)
        return data


def _unknown(key: str, data: dict):
    raise ValidationError({key: [f"unknown {key} {data[key]!r}"]})


class GrantListView(APIBase):
    permission_classes = [SuperusersOnly]

    @extend_schema(tags=["access"], operation_id="grants_list", summary="Rights per tenant or workflow (superusers)",
                   responses={200: GrantSerializer(many=True), **errors(401, 403)})
    def get(self, request):
        grants = TenantGrant.objects.select_related("user", "group").order_by("id")
        return Response(GrantSerializer(grants, many=True).data)

    @extend_schema(tags=["access"], summary="Give a user or a group Viewer or Operator rights on a tenant or a "
                   "workflow (superusers)", request=GrantRequestSerializer,
                   responses={201: GrantSerializer, **errors(400, 401, 403)})
    def post(self, request):
        data = validated(GrantRequestSerializer, body(request))
        try:
            with transaction.atomic():
                grant = TenantGrant.objects.create(user=data.get("user"), group=data.get("group"), role=data["role"],
                                                   tenant=data["tenant"], workflow=data["workflow"])
        except IntegrityError:
            raise ValidationError({"non_field_errors": ["this right is given already"]}) from None
        audit.record("grant", request=request, target=grant, role=grant.role, tenant_name=grant.tenant,
                     workflow_name=grant.workflow)
        return Response(GrantSerializer(grant).data, status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("orchestrator:api:grant", args=[grant.pk])})


class GrantDetailView(APIBase):
    permission_classes = [SuperusersOnly]

    def get_grant(self, pk: int) -> TenantGrant:
        grant = TenantGrant.objects.select_related("user", "group").filter(pk=pk).first()
        if grant is None:
            raise NotFound(f"no grant {pk}")
        return grant

    @extend_schema(tags=["access"], summary="A right (superusers)", responses={200: GrantSerializer,
                                                                              **errors(401, 403, 404)})
    def get(self, request, pk):
        return Response(GrantSerializer(self.get_grant(pk)).data)

    @extend_schema(tags=["access"], summary="Take a right back (superusers)", request=None,
                   responses={204: None, **errors(401, 403, 404)})
    def delete(self, request, pk):
        grant = self.get_grant(pk)
        audit.record("revoke", request=request, target=grant, role=grant.role, tenant_name=grant.tenant,
                     workflow_name=grant.workflow)
        grant.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
