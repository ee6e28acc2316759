"""The API's OpenAPI schema and docs page, independent of the project's DRF and drf-spectacular
settings: a project that mounts the app (under any prefix) gets this API's schema at the app's
``api/schema/``, and a project with an API of its own keeps its schema to itself (the two never
mix, so their component names cannot collide)."""

import inspect
from contextvars import ContextVar

from drf_spectacular import plumbing
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import patched_settings
from drf_spectacular.utils import extend_schema as spectacular_extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from orchestrator.api import serializers as api_serializers

SETTINGS = {
    "TITLE": "Orchestrator API",
    "DESCRIPTION": "Trigger workflow runs, enqueue jobs, and manage the dead-letter queue.",
    "VERSION": "0.1.0",
    # The docs page loads Swagger UI from this installation's static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # MarkStateEnum: a task run's and a run's mark take the same two outcomes.
    "ENUM_NAME_OVERRIDES": {"RunStateEnum": "orchestrator.models.RunState",
                            "TaskStateEnum": "orchestrator.models.TaskState",
                            "MarkStateEnum": ["succeeded", "failed"]},
    "PREPROCESSING_HOOKS": ["orchestrator.api.schema.only_this_api"],
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "orchestrator.api.parsing.describe_text_inputs",
                             "orchestrator.api.schema.cross_field_rules"],
}

# True while this API's own schema is generated.
_generating = ContextVar("orchestrator_api_schema", default=False)


class Schema(AutoSchema):
    """drf-spectacular's inspector for this API's views, whatever DEFAULT_SCHEMA_CLASS says; the
    views appear only in this API's own schema."""

    def is_excluded(self) -> bool:
        return not _generating.get() or super().is_excluded()


def extend_schema(**kwargs):
    """drf-spectacular's ``extend_schema``, built on this API's Schema class. The original
    subclasses the project's DEFAULT_SCHEMA_CLASS at import, which may be DRF's own inspector
    (or none at all); a function's ``schema`` attribute is what it takes as its base instead."""
    decorate = spectacular_extend_schema(**kwargs)

    def decorator(f):
        if inspect.isclass(f):
            return decorate(f)
        f.schema = getattr(f, "kwargs", {}).get("schema") or Schema
        try:
            return decorate(f)
        finally:
            del f.schema

    return decorator


def only_this_api(endpoints):
    """The project's URLconf may hold other APIs: describe this one's views only (those whose
    inspector is this module's Schema, which every view of the API inherits from APIBase)."""
    return [endpoint for endpoint in endpoints
            if isinstance(getattr(endpoint[3], "cls", None), type)
            and isinstance(getattr(endpoint[3].cls, "schema", None), Schema)]


def cross_field_rules(result, generator, request, public):
    """drf-spectacular postprocessing hook: an input serializer's ``schema_rules`` (what its
    ``validate()`` refuses that no single field can say) on its request component, so the schema
    refuses what the server refuses."""
    components = result.get("components", {}).get("schemas", {})
    for serializer in vars(api_serializers).values():
        rules = getattr(serializer, "schema_rules", None)
        if isinstance(serializer, type) and rules:
            name = f"{serializer.__name__.removesuffix('Serializer')}Request"
            if name in components:
                components[name].update(rules)
    return result


def _fresh_enum_names() -> None:
    """drf-spectacular caches ENUM_NAME_OVERRIDES per language, whatever settings were in force
    when it first read them: read before this API's settings applied (another schema, a check),
    the cache holds none of ours, and the state enums get hashed names (StateE3dEnum)."""
    cached = getattr(plumbing, "_load_enum_name_overrides", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


class SchemaView(SpectacularAPIView):
    custom_settings = SETTINGS
    permission_classes = []
    schema = None  # not an endpoint of any schema

    def get(self, request, *args, **kwargs):
        token = _generating.set(True)
        _fresh_enum_names()
        try:
            return super().get(request, *args, **kwargs)
        finally:
            _generating.reset(token)
            _fresh_enum_names()


class DocsView(SpectacularSwaggerSplitView):
    """Swagger UI with its script at ``?script`` and its style in a static file: nothing inline,
    as the Content-Security-Policy wants."""

    permission_classes = []
    schema = None
    title = SETTINGS["TITLE"]
    url_name = "orchestrator:api:schema"
    template_name = "orchestrator/api/swagger_ui.html"

    def get(self, request, *args, **kwargs):
        with patched_settings(SETTINGS):
            return super().get(request, *args, **kwargs)


def generate(request=None) -> dict:
    """This API's schema as a dict (for tests and tools)."""
    token = _generating.set(True)
    _fresh_enum_names()
    try:
        with patched_settings(SETTINGS):
            return SchemaGenerator().get_schema(request=request, public=True)
    finally:
        _generating.reset(token)
        _fresh_enum_names()
