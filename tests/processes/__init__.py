"""Tests that start real processes (workers, schedulers, servers, launchers, clusters of PostgreSQL) and wait on them: most of the suite's time is here."""
