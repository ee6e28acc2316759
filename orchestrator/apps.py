from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Orchestrator"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from orchestrator import checks, conf, registry  # noqa: F401 - checks registers the system checks

        conf.connect_signals()
        # The job modules, as the admin discovers admin.py: what may run is known at start-up.
        registry.autodiscover()
