"""The sequence that wake-up tokens are drawn from (``orchestrator.channels``): a notification of
N due rows draws N values in the statement that sends it, and the workers that own the matching
places on their queue's ring answer. Not cached per session: one order for every sender is what
makes the turns go round the fleet (PostgreSQL logs a sequence once per 32 values anyway)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ('orchestrator', '0019_beyond_approvals'),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE SEQUENCE orchestrator_wake_token AS bigint CYCLE",
            "DROP SEQUENCE orchestrator_wake_token",
        ),
    ]
