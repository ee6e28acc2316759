"""A mapped instance's own item (``TaskRun.item``), so a claimed instance never loads the
mapped-over list; and the index of a run's unfinished task runs (``taskrun_unfinished``), so a
run's end is decided by one index probe instead of reading every task run of the run, and the
resolver reads a run's unfinished tasks without its instances. Instances
created before have no item: they read it from the list (``taskcontext.UPSTREAM``). The index is
built concurrently, so the upgrade of a big task-run table blocks no writer. A run's reason also
says why it timed out (it then ends failed)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('orchestrator', '0026_pages_at_size'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='reason',
            field=models.TextField(blank=True, help_text='Why the run was skipped, missed, cancelled or timed out.'),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='item',
            field=models.JSONField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name='taskrun',
            index=models.Index(condition=models.Q(('state__in', ['waiting', 'scheduled', 'queued', 'running', 'mapped', 'awaiting'])), fields=['run', 'map_index'], name='taskrun_unfinished'),
        ),
    ]
