"""The check schedule: pending transactions ordered by their next check time, so a round costs O(due), not O(pending).

A heap of (due time, sequence, half offset). A decided or rescheduled transaction leaves its old entry behind (a heap
cannot drop one); :meth:`CheckSchedule.pop_due` skips entries whose due time no longer matches, and the heap is
rebuilt from the pending table when stale entries are most of it. No IO.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from typing import Protocol


class Scheduled(Protocol):
    phys: int
    due_ms: int


class CheckSchedule:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int]] = []  # (due_ms, seq, half phys)
        self._seq = itertools.count()

    def __len__(self) -> int:
        """Entries, stale ones included."""
        return len(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def add(self, rec: Scheduled, pending: Mapping[int, Scheduled], slack: int) -> None:
        """Schedule ``rec`` at its ``due_ms``; past ``2 * len(pending) + slack`` entries, rebuild from ``pending``
        (which holds ``rec``) so that rounds pop no backlog of stale entries."""
        heap = self._heap
        if len(heap) > 2 * len(pending) + slack:
            seq = self._seq
            heap[:] = [(p.due_ms, next(seq), phys) for phys, p in pending.items()]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (rec.due_ms, next(self._seq), rec.phys))

    def push(self, rec: Scheduled, due_ms: int) -> None:
        """Move ``rec`` to ``due_ms`` (its old entry goes stale)."""
        rec.due_ms = due_ms
        heapq.heappush(self._heap, (due_ms, next(self._seq), rec.phys))

    def pop_due(self, now: int) -> Iterator[tuple[int, int]]:
        """(half offset, due time) of every entry due at ``now``, earliest first; the caller skips stale ones."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            due_ms, _seq, phys = heapq.heappop(heap)
            yield phys, due_ms
