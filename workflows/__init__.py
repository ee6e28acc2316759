"""Workflow modules: every ``*.py`` here is imported by ``manage.py sync_workflows``."""
