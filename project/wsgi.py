import os

from django.core.wsgi import get_wsgi_application

from project import database

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
database.prepare()
application = get_wsgi_application()

# gunicorn does not run system checks; refuse to serve with a configuration they reject.
from django.core import checks  # noqa: E402

_errors = [
    e for e in checks.run_checks(include_deployment_checks=True) if e.is_serious() and e.id.startswith("orchestrator.")
]
if _errors:
    raise SystemExit("\n".join(f"{e.id}: {e.msg} {e.hint or ''}" for e in _errors))
