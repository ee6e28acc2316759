from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Orchestrator"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from orchestrator import checks  # noqa: F401 - registers the system checks
