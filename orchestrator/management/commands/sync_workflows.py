from django.core.management.base import BaseCommand, CommandError

from orchestrator.sync import sync_workflows


class Command(BaseCommand):
    help = "Import every module in the workflows folder, validate its workflows and store them."

    def add_arguments(self, parser):
        parser.add_argument("--strict", action="store_true", help="Exit with an error if anything is broken.")

    def handle(self, *args, strict=False, **options):
        report = sync_workflows(notice=lambda message: self.stderr.write(message))
        for name in report.created:
            self.stdout.write(self.style.SUCCESS(f"created   {name}"))
        for name in report.new_versions:
            self.stdout.write(self.style.SUCCESS(f"updated   {name} (new graph version)"))
        for name in report.unchanged:
            self.stdout.write(f"unchanged {name}")
        for name in report.removed:
            self.stdout.write(self.style.WARNING(f"removed   {name} (no module defines it any more)"))
        for module, error in report.import_errors.items():
            self.stderr.write(self.style.ERROR(f"module {module} failed to import: {error}"))
        for name, error in report.broken.items():
            self.stderr.write(self.style.ERROR(f"broken    {name}:"))
            for line in error.splitlines():
                self.stderr.write(f"    {line}")
        self.stdout.write(f"code generation {report.generation}: running workers replace their child processes, "
                          "which run the code now on disk")
        if strict and not report.ok:
            raise CommandError("some workflows are broken (see above)")
