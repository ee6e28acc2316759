from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "project"
    verbose_name = "Standalone project"

    def ready(self):
        from project import checks  # noqa: F401 - registers the system checks
