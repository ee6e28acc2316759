"""The gate between a worker and one of its children: which jobs of the batch the child was sent
it has begun, and how many it may begin.

A worker sends a child that runs short jobs several of them in one message (``Pool.start_tasks``):
the child then goes from one to the next without waiting for the worker, and wakes once per batch
instead of once per job. A job sent ahead must still be taken back while it has not begun: the
job the child runs may be slow or hang, a job claimed later may outrank it, it may be cancelled,
a drain hands it back, a sync makes it run the new code. So the child begins each job of a batch
only through ``begin``, and the worker takes back the jobs not begun through ``take_back``; both
read and write the same three numbers under one lock, in memory the two processes share (made
before the fork): a job is either begun by the child or taken back by the worker, never both,
and the worker knows which.

The lock is held for a few instructions. A child killed while holding it (SIGKILL from outside,
at just that moment) would keep it: the worker waits at most ``LOCK_SECONDS`` for it and then
takes nothing back; the child's death, which the worker sees next, says what it had begun
(``begun``, read without the lock once the child is gone).
"""

from __future__ import annotations

import mmap
import multiprocessing
import struct

# The batch's number, how many of its jobs the child has begun, how many it may begin.
LAYOUT = struct.Struct("qqq")

# How long the worker waits for the lock before giving up on a take-back (see above): the child
# holds it for microseconds, and the worker's loop waits meanwhile.
LOCK_SECONDS = 0.05


class Gate:
    def __init__(self):
        self.memory = mmap.mmap(-1, LAYOUT.size)  # anonymous and shared: the forked child sees the same page
        # A lock of the fork context: unnamed once made, so no resource tracker process is started
        # for it (the spawn and forkserver contexts, the default on Python 3.14, would).
        self.lock = multiprocessing.get_context("fork").Lock()

    # --- the worker's side ------------------------------------------------------------------------

    def open(self, batch: int, jobs: int) -> None:
        """A new batch of ``jobs`` jobs, numbered ``batch``, for an idle child (before it is sent)."""
        with self.lock:
            LAYOUT.pack_into(self.memory, 0, batch, 0, jobs)

    def take_back(self, batch: int) -> int | None:
        """Let the child begin no more jobs of this batch: how many it has begun (the rest are the
        worker's again), or None when the lock could not be had (nothing is taken back)."""
        if not self.lock.acquire(timeout=LOCK_SECONDS):
            return None
        try:
            number, begun, _allowed = LAYOUT.unpack_from(self.memory, 0)
            if number != batch:
                return None
            LAYOUT.pack_into(self.memory, 0, number, begun, begun)
            return begun
        finally:
            self.lock.release()

    def begun(self, batch: int) -> int | None:
        """How many jobs of this batch the child had begun, read without the lock: only once the
        child is gone (None: another batch's numbers)."""
        number, begun, _allowed = LAYOUT.unpack_from(self.memory, 0)
        return begun if number == batch else None

    def close(self) -> None:
        self.memory.close()

    # --- the child's side -------------------------------------------------------------------------

    def begin(self, batch: int) -> bool:
        """Whether the child may begin the next job of this batch (it then counts as begun)."""
        with self.lock:
            number, begun, allowed = LAYOUT.unpack_from(self.memory, 0)
            if number != batch or begun >= allowed:
                return False
            LAYOUT.pack_into(self.memory, 0, number, begun + 1, allowed)
            return True
