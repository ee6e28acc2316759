import os

from django.core.asgi import get_asgi_application

from project import database

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
database.prepare()
application = get_asgi_application()
