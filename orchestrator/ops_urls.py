"""Operational endpoints: /metrics, /healthz, /readyz (filled in by health.py and metrics.py)."""

urlpatterns: list = []
