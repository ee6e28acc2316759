"""The indexes of the pages and the API of a big run (``orchestrator/reads.py``): a run's tasks in
the order they were created, without its mapped tasks' instances (partial: only the rows with
map_index -1), and its task runs by state, task and map index. Built concurrently, so the upgrade
of a big task-run table blocks no writer."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('orchestrator', '0025_throughput'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='taskrun',
            index=models.Index(condition=models.Q(('map_index', -1)), fields=['run', 'id'], name='taskrun_tasks_of_run'),
        ),
        AddIndexConcurrently(
            model_name='taskrun',
            index=models.Index(fields=['run', 'state', 'task', 'map_index'], name='taskrun_run_state'),
        ),
    ]
