"""Retention: delete old commit-log segments (never the active one, never one a guard protects), then let the
consume queues and the key index follow.

A segment's age is the store time of the first record of the next segment, an upper bound of its newest record's
time that comes from the injected clock (file mtimes would not), so the fake clock drives it in tests.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from typing import Any

from txmq.clock import Clock
from txmq.store.commit_log import CommitLog
from txmq.store.config import StoreConfig

log = logging.getLogger("txmq.store")

HOUR_MS = 3_600_000


class RetentionService:
    """Decides which segments may go and has ``delete(count, guard)`` delete them (on the store's writer thread)."""

    def __init__(
        self,
        config: StoreConfig,
        clock: Clock,
        commit_log: CommitLog,
        delete: Callable[[int, int], list[str]],
        disk_usage: Callable[[], float] | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._commit_log = commit_log
        self._delete = delete
        self._disk_usage = disk_usage if disk_usage is not None else self._real_disk_usage
        self._guards: list[Callable[[], int]] = []
        self._timer: Any = None
        self._running = False
        self.last_run: asyncio.Future[list[str]] | None = None  # the latest timer-driven run, for observers
        self.deleted_total = 0

    def add_guard(self, guard: Callable[[], int]) -> None:
        """``guard()`` returns the lowest commit-log offset that must be kept (e.g. the oldest in-doubt half)."""
        self._guards.append(guard)

    def guard_offset(self) -> int:
        """The lowest offset any guard protects (no limit when there are none). A failing guard protects all."""
        lowest = 2**63 - 1
        for guard in self._guards:
            try:
                lowest = min(lowest, int(guard()))
            except Exception:
                log.exception("retention guard %r failed; keeping every segment this round", guard)
                return 0
        return lowest

    def _real_disk_usage(self) -> float:
        usage = shutil.disk_usage(self._config.store_path_root_dir)
        return usage.used / usage.total if usage.total else 0.0

    def plan(self, now_ms: int | None = None, *, manual: bool = False) -> tuple[int, str]:
        """How many of the oldest segments may be deleted now, and why (0 and a reason when none)."""
        cfg = self._config
        now = self._clock.now_ms() if now_ms is None else now_ms
        ratio = self._disk_usage()
        at_time = time.localtime(now / 1000).tm_hour in cfg.delete_hours()
        disk_full = ratio >= cfg.disk_max_used_space_ratio / 100.0
        forced = cfg.clean_file_forcibly_enable and ratio >= cfg.disk_space_clean_forcibly_ratio / 100.0
        if not (at_time or disk_full or manual):
            return 0, "not the time to delete and the disk is not full"
        reason = f"forced: disk {ratio:.0%} full" if forced else ("disk full" if disk_full else "deleteWhen")
        if manual and not (at_time or disk_full):
            reason = "manual"
        commit_log = self._commit_log
        segs = commit_log.segments
        guard = self.guard_offset()
        reserved_ms = cfg.file_reserved_time * HOUR_MS
        count = 0
        for i in range(len(segs) - 1):  # the last (active) segment is never deleted
            if count >= cfg.delete_commit_log_files_batch_max:
                break
            seg = segs[i]
            if seg.end > guard:
                break
            if not forced:
                newest = commit_log.first_store_timestamp(segs[i + 1])
                if newest is None or now - newest < reserved_ms:
                    break
            count += 1
        return count, reason

    def run_once(self, now_ms: int | None = None, *, manual: bool = False) -> list[str]:
        """Delete what :meth:`plan` allows (blocking: the writer thread does the deleting). Returns the paths."""
        count, reason = self.plan(now_ms, manual=manual)
        if count == 0:
            return []
        deleted = self._delete(count, self.guard_offset())
        if deleted:
            self.deleted_total += len(deleted)
            log.info(
                "retention (%s): deleted %d commit-log segment(s); log now starts at %d",
                reason,
                len(deleted),
                self._commit_log.min_offset,
            )
        return deleted

    # -- the periodic check (cleanResourceInterval) on the store's clock --------------------------------------

    def start(self) -> None:
        self._running = True
        self._schedule()

    def stop(self) -> None:
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        interval = self._config.clean_resource_interval / 1000.0
        self._timer = self._clock.call_later(interval, self._tick)

    def _tick(self) -> None:
        if not self._running:
            return
        loop = asyncio.get_running_loop()
        # Deleting files and waiting for the writer block, so the run happens on a worker thread.
        self.last_run = loop.run_in_executor(None, self._run_logged)
        self._schedule()

    def _run_logged(self) -> list[str]:
        try:
            return self.run_once()
        except Exception:
            log.exception("retention run failed")
            return []
