"""The indexes of admission (``orchestrator/admission.py``): a workflow's running runs, counted
against its ``max_active_runs``, and its waiting runs in the order they start (lane, then id).
Partial: a run takes an entry only while it runs or waits, and a job's run (no workflow) never.
Built concurrently, so the upgrade of a big run table blocks no writer."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('orchestrator', '0020_fleet_wake_token'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('state', 'running'), ('workflow__isnull', False)), fields=['workflow'], name='run_running_of_workflow'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('state', 'pending'), ('workflow__isnull', False)), fields=['workflow', 'lane', 'id'], name='run_pending_of_workflow'),
        ),
    ]
