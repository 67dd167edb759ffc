"""Damaged commit-log ranges: found by recovery, the start-up scrub or a read, kept in ``<root>/damaged`` (one JSON
object a line) so that nothing in them is served, reported once with their offsets, and counted.

A damaged *record* keeps its frame (magic, TOTALSIZE, PHYSICALOFFSET, field lengths) but its body CRC fails: its
consume-queue entry stays and every read skips it. A damaged *range* is bytes that are no record at all; the walk
resumed at the next sound record, and consume-queue entries of the records lost in it point at its start.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from dataclasses import dataclass

import orjson

log = logging.getLogger("txmq.store")

DAMAGED_FILE = "damaged"


@dataclass(slots=True, frozen=True)
class Damage:
    start: int  # commit-log offsets [start, end)
    end: int
    file: str  # the segment file holding ``start``
    reason: str
    kind: (
        str  # "record" (a record whose body CRC fails), "range" (bytes that are no record), "missing" (file cut short)
    )

    def describe(self) -> str:
        return f"[{self.start}, {self.end}) in {self.file} ({self.end - self.start} bytes, {self.kind}): {self.reason}"

    def to_json(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "file": self.file, "reason": self.reason, "kind": self.kind}


class DamageLog:
    """The store's damaged ranges. ``contains`` is what reads ask; it costs one truth test while nothing is damaged."""

    def __init__(self, root: str | None) -> None:
        self.path = os.path.join(root, DAMAGED_FILE) if root is not None else None
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ranges: list[Damage] = []
        self._seen_reads: set[int] = set()  # offsets a read already reported (one log line each)
        self.skipped_reads = 0  # records a read refused to serve because they are damaged

    def load(self, min_offset: int = 0) -> None:
        """Read ``damaged``; ranges wholly below ``min_offset`` (deleted by retention) are forgotten."""
        if self.path is None or not os.path.exists(self.path):
            return
        kept: list[Damage] = []
        with open(self.path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    raw = orjson.loads(line)
                    d = Damage(
                        int(raw["start"]), int(raw["end"]), str(raw["file"]), str(raw["reason"]), str(raw["kind"])
                    )
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    log.warning("%s: ignoring a line that does not parse (%s): %r", self.path, exc, line[:200])
                    continue
                if d.end > min_offset:
                    kept.append(d)
        for d in kept:
            self._insert(d)
        if kept:
            log.warning(
                "commit log: %d damaged ranges on record in %s are never served: %s",
                len(kept),
                self.path,
                "; ".join(d.describe() for d in kept[:10]),
            )

    def _insert(self, d: Damage) -> bool:
        i = bisect.bisect_left(self._starts, d.start)
        if i < len(self._ranges) and self._ranges[i].start == d.start:
            return False
        self._starts.insert(i, d.start)
        self._ranges.insert(i, d)
        return True

    def add(self, d: Damage, *, persist: bool = True) -> bool:
        """Record ``d`` (logged as an error, appended to the file); False when it was already on record."""
        with self._lock:
            if not self._insert(d):
                return False
            if persist and self.path is not None:
                try:
                    with open(self.path, "ab") as f:
                        f.write(orjson.dumps(d.to_json()) + b"\n")
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as exc:
                    log.error("could not record damaged range in %s (%s)", self.path, exc)
        log.error("commit log: damaged %s; it is never served", d.describe())
        return True

    def read_refused(self, phys: int, file: str, why: str) -> None:
        """A read found the record at ``phys`` damaged: count it, and log it the first time."""
        self.skipped_reads += 1
        if phys in self._seen_reads:
            return
        with self._lock:
            if len(self._seen_reads) < 100_000:
                self._seen_reads.add(phys)
        log.error("commit log: damaged record at offset %d in %s not served (%s)", phys, file, why)

    def contains(self, phys: int) -> bool:
        """True when ``phys`` lies in a damaged range on record."""
        starts = self._starts
        if not starts:
            return False
        i = bisect.bisect_right(starts, phys) - 1
        return i >= 0 and phys < self._ranges[i].end

    @property
    def ranges(self) -> list[Damage]:
        return list(self._ranges)

    def stats(self) -> dict[str, object]:
        return {
            "damaged_ranges": len(self._ranges),
            "damaged_bytes": sum(d.end - d.start for d in self._ranges),
            "damaged_reads_skipped": self.skipped_reads,
        }
