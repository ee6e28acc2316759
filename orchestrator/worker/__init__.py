"""The worker: claims due task runs of its queues and runs them in a pool of child processes."""

from orchestrator.worker.role import Slot, Worker

__all__ = ["Slot", "Worker"]
