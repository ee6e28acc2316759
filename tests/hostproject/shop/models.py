from django.db import models


class Order(models.Model):
    number = models.CharField(max_length=20, unique=True)
    total_cents = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=20, default="new")
    invoiced = models.BooleanField(default=False)
    notes = models.JSONField(default=list)

    def __str__(self):
        return self.number
