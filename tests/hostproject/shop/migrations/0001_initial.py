from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.CharField(max_length=20, unique=True)),
                ("total_cents", models.PositiveIntegerField(default=0)),
                ("status", models.CharField(default="new", max_length=20)),
                ("invoiced", models.BooleanField(default=False)),
                ("notes", models.JSONField(default=list)),
            ],
        ),
    ]
