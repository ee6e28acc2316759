#!/usr/bin/env python
"""A Django project of its own, like a team's existing one, that adds the orchestrator the way the
README's "Add it to an existing Django project" says. The tests run it as separate processes."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
