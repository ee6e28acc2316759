"""The standalone project: a thin Django project around the ``orchestrator`` app, with the embedded
PostgreSQL. ``./dev run``, ``./dev test`` and the Docker image run it; the repository's top-level
``manage.py``, ``workflows/``, ``templates/`` and ``static/`` are its folders. It is not part of
the app's distribution: a Django project of your own installs the app instead."""
