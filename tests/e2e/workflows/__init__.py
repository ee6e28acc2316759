"""Workflows used by the browser tests (synced next to the examples in workflows/)."""
