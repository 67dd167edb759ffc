"""What the parts of the message store share: its health (life-cycle state, the failure that stops appends) and the
positions the writer publishes for readers, the flusher and the checkpointer."""

from __future__ import annotations

import threading


class Health:
    """The store's life cycle (new -> open -> closing -> closed) and the failure that refuses appends until a
    restart. ``put_lock`` makes "check open + enqueue" atomic against shutdown."""

    __slots__ = ("failure", "put_lock", "replica", "state", "writer_dead")

    def __init__(self) -> None:
        self.state = "new"
        # A slave's store: only the master's bytes are appended (txmq.store.replica), every other put is refused.
        self.replica = False
        self.failure: str | None = None  # set when a write/flush/index failed: puts are refused until a restart
        self.writer_dead = False
        self.put_lock = threading.Lock()

    def fail(self, reason: str) -> None:
        """Record the first failure (a later one does not replace it)."""
        self.failure = self.failure or reason


class Published:
    """Positions written by whoever holds the append lock (and the flusher), read by anyone without a lock."""

    __slots__ = ("confirmed", "flushed", "snap", "visible", "written")

    def __init__(self) -> None:
        self.written = 0  # next physical offset to write
        self.flushed = 0  # commit-log bytes known to be fdatasync'ed
        self.confirmed = 0  # commit-log bytes whose records are visible
        self.visible: dict[tuple[str, int], int] = {}  # queue -> max offset readers may see
        # (written position, last store time, last indexed store time) at the end of the last group: everything up
        # to that position is in the consume queues and the index, which is what a checkpoint may claim.
        self.snap = (0, 0, 0)
