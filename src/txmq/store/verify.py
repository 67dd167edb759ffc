"""Verifying a whole commit log: every record's frame and body CRC, segment by segment, listing each damaged range.

One walk serves the offline check (``txmq admin store verify``, files opened read-only, the broker need not run)
and the scrub a store runs in the background after it starts. Damage never stops the walk: it resumes at the next
sound record (:func:`~txmq.protocol.record.find_record`).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.record import WalkResult, find_record, walk_segment
from txmq.store.commit_log import SEGMENT_NAME_RE, release_scan_pages
from txmq.store.damage import Damage

log = logging.getLogger("txmq.store")

SCRUB_CHUNK = 1 << 20  # bytes walked while holding the GIL: about a millisecond
SCRUB_PAUSE_SECONDS = 0.001  # then a pause: at most about half a core, and under 100 MB/s


@dataclass(slots=True)
class VerifyReport:
    directory: str
    segments: int = 0
    records: int = 0
    bytes: int = 0
    end: int = 0  # end of the data found (one past the last sound record)
    damage: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not damage: a torn tail after a crash, which a start cuts
    stopped: bool = False  # the scrub was asked to stop before the end

    @property
    def ok(self) -> bool:
        return not self.damage


def verify_buffer(
    buf: Any,
    base: int,
    path: str,
    start: int,
    limit: int,
    last: bool,
    report: VerifyReport,
    *,
    chunk: int = 0,
    pause: Callable[[], bool] | None = None,
) -> None:
    """Verify ``buf[start:limit]``, a segment whose first byte is offset ``base``; damage lands in ``report``.

    With ``chunk``, the walk goes ``chunk`` bytes at a time and calls ``pause()`` in between (True: stop). The
    compiled walk holds the GIL while it runs, so a background scrub must not walk a 1 GiB segment in one call.
    """

    def skipped(phys: int, size: int, why: str) -> None:
        report.damage.append(Damage(phys, phys + size, path, why, "record"))

    pos = start
    while pos < limit:
        walk = WalkResult()
        part_end = min(limit, pos + chunk) if chunk > 0 else limit
        for _ in walk_segment(
            buf,
            base=base,
            start=pos,
            limit=limit,
            tail_room=0,
            yield_from=base + limit,  # verify only
            stop_at=base + part_end,
            skip_bad_crc=True,
            on_skip=skipped,
            result=walk,
        ):
            pass
        report.records += walk.records
        report.bytes += walk.bytes
        stop = walk.end - base
        if walk.records or walk.skipped:
            report.end = max(report.end, walk.end)
        if part_end < limit and stop >= part_end and walk.clean_end and not walk.blank:
            pos = stop  # the end of this chunk, a record boundary
            if pause is not None and pause():
                report.stopped = True
                return
            continue
        if walk.blank:
            report.end = max(report.end, base + limit)
            return
        nxt = find_record(buf, base, stop, limit)
        if nxt >= 0:
            why = walk.reason if not walk.clean_end else f"zeros at {walk.end} in the middle of the data"
            report.damage.append(Damage(walk.end, base + nxt, path, why, "range"))
            pos = nxt
            continue
        if walk.clean_end and _all_zero(buf, stop, limit):
            if not last and stop < limit:
                report.damage.append(
                    Damage(walk.end, base + limit, path, "segment ends without its end-of-file blank", "range")
                )
            return
        if last:
            report.notes.append(
                f"torn tail [{walk.end}, {base + limit}) in {path} ({walk.reason}): not acknowledged data a crash "
                "left; the next start cuts it"
            )
        else:
            report.damage.append(Damage(walk.end, base + limit, path, walk.reason, "range"))
        return


def _all_zero(buf: Any, start: int, limit: int) -> bool:
    chunk = 1 << 20
    zeros = bytes(chunk)
    pos = start
    while pos < limit:
        n = min(chunk, limit - pos)
        if buf[pos : pos + n] != zeros[:n]:
            return False
        pos += n
    return True


def verify_directory(directory: str, segment_size: int | None = None) -> VerifyReport:
    """Verify the commit-log files in ``directory`` (``<store>/commitlog``) read-only."""
    report = VerifyReport(directory)
    names = sorted(n for n in os.listdir(directory) if SEGMENT_NAME_RE.match(n))
    if not names:
        report.notes.append(f"{directory} holds no commit-log segment")
        return report
    sizes = [os.path.getsize(os.path.join(directory, n)) for n in names]
    if segment_size is None:
        segment_size = max(sizes)
    expected_start = int(names[0])
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        path = os.path.join(directory, name)
        start = int(name)
        last = i == len(names) - 1
        if start != expected_start:
            report.damage.append(
                Damage(expected_start, start, path, f"segment {name} does not follow the previous one", "missing")
            )
        expected_start = start + segment_size
        report.segments += 1
        if size < segment_size and not last:
            report.damage.append(
                Damage(
                    start + size,
                    start + segment_size,
                    path,
                    f"file cut short: {size} of {segment_size} bytes",
                    "missing",
                )
            )
        if size == 0:
            continue
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            verify_buffer(mm, start, path, 0, size, last, report)
        finally:
            mm.close()
    return report


class Scrubber:
    """Verifies a store's segments on a background thread after it starts, reporting damage to ``on_damage``."""

    def __init__(self, segments: Callable[[], tuple[Any, ...]], end: int, on_damage: Callable[[Damage], None]) -> None:
        self._segments = segments
        self._end = end
        self._on_damage = on_damage
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.report: VerifyReport | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txmq-store-scrub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _pause(self) -> bool:
        """Between chunks: let the broker's threads run (the compiled walk holds the GIL), and stop when asked."""
        return self._stop.wait(SCRUB_PAUSE_SECONDS)

    def _run(self) -> None:
        report = VerifyReport("")
        try:
            for seg in self._segments():
                if self._stop.is_set():
                    report.stopped = True
                    break
                if seg.start >= self._end:
                    break
                limit = min(seg.size, self._end - seg.start)
                before = len(report.damage)
                try:
                    verify_buffer(
                        seg.mm,
                        seg.start,
                        seg.path,
                        0,
                        limit,
                        seg.start + seg.size >= self._end,
                        report,
                        chunk=SCRUB_CHUNK,
                        pause=self._pause,
                    )
                except ValueError:  # its map was closed: retention deleted it, or the store is closing
                    continue
                finally:
                    release_scan_pages(seg)  # its pages stay in the page cache, not in the broker's RSS
                for d in report.damage[before:]:
                    self._on_damage(d)
        except Exception:
            log.exception("commit-log scrub failed")
        self.report = report
        log.info(
            "commit-log scrub %s: %d records, %d bytes verified, %d damaged ranges",
            "stopped" if report.stopped else "done",
            report.records,
            report.bytes,
            len(report.damage),
        )
