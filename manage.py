#!/usr/bin/env python
"""The standalone project's command line. Without DATABASE_URL it starts the embedded PostgreSQL of
the data folder first (it keeps running for the next command; ``./dev stop`` stops it)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    if os.environ["DJANGO_SETTINGS_MODULE"] == "project.settings":
        from project import database

        database.prepare()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
