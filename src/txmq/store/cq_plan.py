"""The consume queues' per-record work: each dispatched record's 20-byte entry, planned into its queue's run of new
entries before any byte is written.

Compiled (setup.py ``HOT_MODULES``): it runs for every record a broker stores (a transaction's half message, its
committed copy and its op marker each), on the store's writer thread, and on a slave for every replicated record.
:mod:`txmq.store.consume_queue` keeps the files, the locking, recovery's unusual cases and the reads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from txmq.store.dispatch import DispatchRequest

ENTRY = struct.Struct(">qiq")  # commit-log offset, size, tags code


class Plan:
    """What one put does to one queue, worked out before any byte is written."""

    __slots__ = ("base", "entries", "queue", "reset", "truncate")

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.base: int = queue.max  # offset of entries[0]
        self.entries: list[bytes] = []
        self.truncate = False  # truncate the queue to base before writing
        self.reset = False  # empty queue restarting at base


def plan_puts(
    dispatches: list[DispatchRequest],
    plans: dict[tuple[str, int], Plan],
    queue_for_write: Callable[[tuple[str, int]], Any],
    unusual: Callable[[Plan, int, bytes, int], None],
) -> int:
    """Plan the entries of ``dispatches`` into ``plans`` (one per queue, made with ``queue_for_write``): an entry at
    its queue's next offset is appended to the plan; any other (recovery's re-dispatch, a gap) goes to
    ``unusual(plan, offset, entry, next_offset)``. Returns the end of the last record in the commit log."""
    batch_end = 0
    pack = ENTRY.pack
    for d in dispatches:
        end = d.physical_offset + d.size
        if end > batch_end:
            batch_end = end
        if not d.has_consume_queue:
            continue
        key = (d.topic, d.queue_id)
        plan = plans.get(key)
        if plan is None:
            plan = Plan(queue_for_write(key))
            plans[key] = plan
        raw = pack(d.physical_offset, d.size, d.tags_code)
        next_offset = plan.base + len(plan.entries)
        if d.queue_offset == next_offset:
            plan.entries.append(raw)
        else:
            unusual(plan, d.queue_offset, raw, next_offset)
    return batch_end
