"""The retry policy, defined once: how many attempts a task run gets and how long it waits
between them. Workflow tasks (``definition.Task``), one-off jobs (``jobs.enqueue``), callbacks
(``CALLBACKS``), webhook deliveries (``webhooks()``) and the ``django.tasks`` backend's OPTIONS
each state a ``RetryPolicy`` (notification messages share the webhooks'); its ``spec()`` is what a task run's spec stores, and ``problem()``
the one check of each value, wherever it comes from.

The rule, applied by ``resolver.END_TASK_RUNS`` when an attempt did not succeed::

    delay = min(retry_max_delay, retry_delay * retry_backoff ** (attempt - 1)) * jitter

with jitter uniform in [0.5, 1.0), so many tasks failing together do not retry together. After
``max_attempts`` attempts the task run is dead (the dead-letter queue).

The SQL is generated here from the defaults below, as ``states.TRIGGER_RULE_DECISIONS`` generates
the resolver's CASE: ``delay_sql`` is that formula, and ``allowance_sql`` the fresh allowance of
attempts a task run gets when it is created, cleared, retried, reprocessed by a backfill or
mapped again (``allowance`` is the same in Python). A spec without a key (a row written before
the key existed, or by hand) gets the default, in SQL as in Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.conf import app_settings
from orchestrator.limits import MAX_ATTEMPTS, MAX_INT

# The spec keys of the policy's fields, in the order a spec lists them.
SPEC_KEYS = {"max_attempts": "max_attempts", "delay": "retry_delay", "backoff": "retry_backoff",
             "max_delay": "retry_max_delay"}
JITTER_LOW = 0.5  # the jitter's lower bound; its upper one is 1


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    delay: float = 10.0  # seconds before the second attempt
    backoff: float = 2.0  # each further wait is this many times the one before ...
    max_delay: float = 3600.0  # ... up to this many seconds

    def spec(self) -> dict:
        """The policy as a task run's spec stores it."""
        return {key: getattr(self, field) for field, key in SPEC_KEYS.items()}

    @classmethod
    def of(cls, spec: dict) -> RetryPolicy:
        """The policy a spec states, the defaults standing in for keys it lacks."""
        return cls(**{field: spec[key] for field, key in SPEC_KEYS.items() if key in spec})

    def problems(self) -> list[tuple[str, object, str]]:
        """(spec key, value, what is wrong) for each value this policy cannot have."""
        return [(key, getattr(self, field), message) for field, key in SPEC_KEYS.items()
                if (message := problem(key, getattr(self, field)))]

    def wait(self, attempt: int) -> float:
        """The delay after ``attempt`` failed, before jitter (what ``delay_sql`` computes)."""
        if self.delay <= 0 or self.max_delay <= 0:
            return 0.0
        return math.exp(min(math.log(self.max_delay),
                            math.log(self.delay) + (attempt - 1) * math.log(max(self.backoff, 1))))


DEFAULT = RetryPolicy()
# A callback is a job of its own (see callbacks.py): a few tries, soon.
CALLBACKS = RetryPolicy(max_attempts=3, max_delay=600.0)


# A delivery to an endpoint or to people (a webhook, a notification message): five tries in all.
DELIVERY_ATTEMPTS = 5


def webhooks() -> RetryPolicy:
    """A webhook delivery's and a notification message's: backing off from WEBHOOK_RETRY_SECONDS."""
    return RetryPolicy(max_attempts=DELIVERY_ATTEMPTS, delay=app_settings.WEBHOOK_RETRY_SECONDS, max_delay=600.0)


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def problem(key: str, value) -> str | None:
    """What keeps ``value`` from being the policy's ``key`` (a spec key), or None."""
    if key == "max_attempts":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
            return f"must be a whole number of at least 1 and at most {MAX_ATTEMPTS}"
        return None
    if key == "retry_backoff":
        if not _is_number(value) or not 1 <= value <= MAX_INT:
            return "must be a number, 1 or more"
        return None
    if key in ("retry_delay", "retry_max_delay"):
        if not _is_number(value) or not 0 <= value <= MAX_INT:
            return "must be a number of seconds, 0 or more"
        return None
    raise KeyError(key)


def allowance(spec: dict) -> int:
    """The attempts a new task run of this spec may make (``allowance_sql`` in Python)."""
    value = spec.get("max_attempts", DEFAULT.max_attempts)
    return min(MAX_ATTEMPTS, max(1, int(value)))


def _field(alias: str, key: str, cast: str) -> str:
    """A spec value in SQL, the default standing in for a missing key."""
    prefix = f"{alias}." if alias else ""
    default = getattr(DEFAULT, next(field for field, k in SPEC_KEYS.items() if k == key))
    return f"COALESCE(({prefix}spec->>'{key}')::{cast}, {default})"


def allowance_sql(alias: str = "") -> str:
    """The fresh allowance of attempts of the task runs ``alias`` (a table alias, or none)."""
    return f"LEAST({MAX_ATTEMPTS}, GREATEST(1, {_field(alias, 'max_attempts', 'int')}))"


def delay_sql(alias: str, attempts: str) -> str:
    """The jittered delay in seconds after attempt number ``attempts`` (an SQL expression) of the
    task runs ``alias`` failed. Computed through logarithms: ``power(backoff, attempts - 1)``
    overflows a float8 once a task run has made about a thousand attempts (they add up over
    clears and retries), and the error would fail the whole batch of outcomes it is part of,
    again at every try; ``min(ln max_delay, ln delay + (n - 1) ln backoff)`` never exceeds the
    logarithm of the cap."""
    delay, backoff, cap = (_field(alias, key, "float8") for key in ("retry_delay", "retry_backoff", "retry_max_delay"))
    return (f"CASE WHEN {delay} > 0 AND {cap} > 0 THEN exp(LEAST(ln({cap}), "
            f"ln({delay}) + ({attempts} - 1) * ln(GREATEST({backoff}, 1)))) ELSE 0 END"
            f" * ({JITTER_LOW} + random() * {1 - JITTER_LOW})")
