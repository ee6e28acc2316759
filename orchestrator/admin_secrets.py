"""The secrets store in the admin: superusers and the Secrets managers group add, replace and
delete secrets and connections. A value is write-only: the form never shows it (not even to
who set it), the list shows "set on <date> by <user>"; every change is in the audit log."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from orchestrator import secretstore
from orchestrator.models import Secret

VALUE_HELP = ("Write-only: never shown again once saved. A secret's value; a connection's URL "
              "(scheme://user:password@host:port/database) or a JSON object of its fields (host, port, login, "
              "password, database, scheme, extra).")


class SecretForm(forms.ModelForm):
    value = forms.CharField(required=False, strip=False, help_text=VALUE_HELP,
                            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}))

    class Meta:
        model = Secret
        fields = ["kind", "name", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.data_to_store = None
        if self.instance.pk:
            # The name and kind are what tasks declare: a secret is renamed by adding another.
            for name in ("kind", "name"):
                self.fields[name].disabled = True
            self.fields["value"].help_text = "Leave empty to keep the stored value. " + VALUE_HELP

    def clean(self):
        cleaned = super().clean()
        kind, name, value = cleaned.get("kind"), cleaned.get("name"), cleaned.get("value")
        try:
            secretstore.check_name(kind, name)
        except secretstore.StoreError as exc:
            self.add_error("name", str(exc))
        if value or not self.instance.pk:
            try:
                self.data_to_store = secretstore.stored_data(kind, value)
            except secretstore.StoreError as exc:
                self.add_error("value", str(exc))
        if self.data_to_store is not None:
            try:
                secretstore.encrypt({})
            except secretstore.KeyMissing as exc:
                self.add_error(None, str(exc))
        return cleaned


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin):
    form = SecretForm
    list_display = ["name", "kind", "description", "set_on", "key_state"]
    list_filter = ["kind"]
    search_fields = ["name", "description"]
    fields = ["kind", "name", "description", "value", "set_on"]
    readonly_fields = ["set_on"]

    @admin.display(description="set")
    def set_on(self, obj):
        return obj.set_on if obj and obj.pk else "-"

    @admin.display(description="key")
    def key_state(self, obj):
        try:
            newest = secretstore.key_id(secretstore.app_settings.SECRETS_KEYS[0])
        except IndexError:
            return "no key set"
        return "newest" if obj.key_id == newest else "older key: run rotate_secrets_key"

    def has_module_permission(self, request):
        return secretstore.may_manage(request.user)

    def has_view_permission(self, request, obj=None):
        return secretstore.may_manage(request.user)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission

    def save_model(self, request, obj, form, change):
        # Written by the store (encrypted, audited), never by the ModelForm: it has no value field.
        if form.data_to_store is not None:
            stored = secretstore.put(obj.kind, obj.name, form.data_to_store, request=request,
                                     description=obj.description)
            obj.pk, obj.value = stored.pk, stored.value
        elif change and "description" in form.changed_data:
            secretstore.describe(obj, obj.description, request=request)

    def delete_model(self, request, obj):
        secretstore.delete(obj, request=request)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            secretstore.delete(obj, request=request)

    def log_addition(self, request, obj, message):
        return None  # the audit log has it (secretstore.put), without a value in Django's history either

    log_change = log_deletion = log_addition

    def log_deletions(self, request, queryset):
        return None
