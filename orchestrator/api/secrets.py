"""The secrets store in the API, for superusers and the Secrets managers group: list, create,
replace and delete secrets and connections. Values are write-only: no answer holds one, only
who set it and when ("set on <date> by <user>"); every change is in the audit log."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from orchestrator import secretstore
from orchestrator.api.base import APIBase, body, errors, validated
from orchestrator.api.schema import extend_schema
from orchestrator.models import Secret
from orchestrator.secrets import KINDS


class SecretsManagers(BasePermission):
    message = "managing secrets needs a superuser or the Secrets managers group"

    def has_permission(self, request, view):
        return secretstore.may_manage(request.user)


class SecretSerializer(serializers.ModelSerializer):
    """A secret or connection as the API shows it: never its value."""

    set_on = serializers.CharField(read_only=True)
    updated_by = serializers.CharField(source="updated_by_name", read_only=True)
    under_newest_key = serializers.SerializerMethodField()

    class Meta:
        model = Secret
        fields = ["kind", "name", "description", "set_on", "updated_at", "updated_by", "under_newest_key"]

    def get_under_newest_key(self, obj) -> bool:
        keys = secretstore.app_settings.SECRETS_KEYS
        return bool(keys) and obj.key_id == secretstore.key_id(keys[0])


class SecretWriteSerializer(serializers.Serializer):
    """What a request may send: the value (a secret's; a connection's URL or JSON of fields as text),
    or a connection's ``url`` or ``fields``; and a description."""

    kind = serializers.ChoiceField(choices=KINDS, required=False, default="secret")
    name = serializers.CharField(required=False, max_length=100, trim_whitespace=False)
    value = serializers.CharField(required=False, trim_whitespace=False, write_only=True)
    url = serializers.CharField(required=False, trim_whitespace=False, write_only=True)
    fields = serializers.DictField(required=False, write_only=True)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10000)


def _data(kind: str, values: dict) -> dict | None:
    """What to encrypt, from the request (None: the value is not being replaced)."""
    given = {key: values[key] for key in ("value", "url", "fields") if key in values}
    if not given:
        return None
    if len(given) > 1:
        raise ValidationError({"value": ["send one of value, url or fields"]})
    if kind == "secret" and "value" not in given:
        raise ValidationError({"value": ["a secret has a value (url and fields are a connection's)"]})
    try:
        return secretstore.stored_data(kind, given.get("value"), url=given.get("url"), fields=given.get("fields"))
    except secretstore.StoreError as exc:
        raise ValidationError({exc.field: [str(exc)]}) from None


def _put(kind: str, name: str, data: dict, request, description) -> Secret:
    try:
        return secretstore.put(kind, name, data, request=request, description=description)
    except secretstore.KeyMissing as exc:
        raise ValidationError({"non_field_errors": [str(exc)]}) from None


class SecretListView(APIBase):
    permission_classes = [SecretsManagers]

    @extend_schema(tags=["secrets"], operation_id="secrets_list", summary="Secrets and connections (never their values)",
                   responses={200: SecretSerializer(many=True), **errors(401, 403)})
    def get(self, request):
        return Response(SecretSerializer(Secret.objects.all(), many=True).data)

    @extend_schema(tags=["secrets"], operation_id="secrets_create", summary="Store a new secret or connection",
                   request=SecretWriteSerializer, responses={201: SecretSerializer, **errors(400, 401, 403)})
    def post(self, request):
        values = validated(SecretWriteSerializer, body(request))
        kind, name = values["kind"], values.get("name")
        try:
            secretstore.check_name(kind, name)
        except secretstore.StoreError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        data = _data(kind, values)
        if data is None:
            raise ValidationError({"value": ["a new secret needs its value (a connection: url or fields)"]})
        if Secret.objects.filter(kind=kind, name=name).exists():
            raise ValidationError({"name": [f"the {kind} {name!r} exists: PUT /api/secrets/{kind}/{name}/ replaces it"]})
        try:
            with transaction.atomic():
                row = _put(kind, name, data, request, values.get("description", ""))
        except IntegrityError:  # pragma: no cover - a concurrent create of the same name
            raise ValidationError({"name": [f"the {kind} {name!r} exists"]}) from None
        return Response(SecretSerializer(row).data, status=status.HTTP_201_CREATED)


def _get(kind: str, name: str) -> Secret:
    row = Secret.objects.filter(kind=kind, name=name).first() if kind in KINDS and "\x00" not in name else None
    if row is None:
        raise NotFound(f"no {kind} {name!r}")
    return row


class SecretDetailView(APIBase):
    permission_classes = [SecretsManagers]

    @extend_schema(tags=["secrets"], summary="A secret or connection: who set it and when (never its value)",
                   responses={200: SecretSerializer, **errors(401, 403, 404)})
    def get(self, request, kind, name):
        return Response(SecretSerializer(_get(kind, name)).data)

    @extend_schema(tags=["secrets"], summary="Replace the value and/or the description",
                   request=SecretWriteSerializer, responses={200: SecretSerializer, **errors(400, 401, 403, 404)})
    def put(self, request, kind, name):
        row = _get(kind, name)
        values = validated(SecretWriteSerializer, body(request))
        data = _data(kind, values)
        description = values.get("description")
        if data is not None:
            row = _put(kind, name, data, request, description)
        elif description is not None:
            row = secretstore.describe(row, description, request=request)
        else:
            raise ValidationError({"value": ["send a value (a connection: url or fields) or a description"]})
        return Response(SecretSerializer(row).data)

    patch = put

    @extend_schema(tags=["secrets"], summary="Delete a secret or connection",
                   responses={204: None, **errors(401, 403, 404)})
    def delete(self, request, kind, name):
        secretstore.delete(_get(kind, name), request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)
