"""A task run and an attempt name their worker without a constraint in the database: its check
read and share-locked the worker's row once per claimed job (see models.TaskRun.worker)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0021_rules_run_admission_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='worker',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='attempts', to='orchestrator.worker'),
        ),
        migrations.AlterField(
            model_name='taskrun',
            name='worker',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='orchestrator.worker'),
        ),
    ]
