"""The pop state on disk: a snapshot (``pop/snapshot.json``, written atomically) and a journal of the changes since
(``pop/journal.log``, one JSON row a line). Appends are group-committed: every row waiting when a write starts
shares one write and one fsync, and a caller's future resolves only when its rows are on disk."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import orjson

from txmq.broker.pop.state import Entry, IllegalPopTransition, PopTable
from txmq.util import atomic_write_json

log = logging.getLogger("txmq.broker.pop")


class PopJournal:
    def __init__(self, folder: Path, *, sync: bool = True) -> None:
        self.folder = folder
        self.snapshot_path = folder / "snapshot.json"
        self.journal_path = folder / "journal.log"
        self.sync = sync
        self._file: object | None = None
        self._pending: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flushing: asyncio.Task[None] | None = None
        self.size = 0

    def load(self) -> PopTable:
        """Fold the snapshot and the journal, then write them back as one snapshot and an empty journal."""
        self.folder.mkdir(parents=True, exist_ok=True)
        table = PopTable()
        if self.snapshot_path.exists():
            try:
                table = PopTable.from_snapshot(orjson.loads(self.snapshot_path.read_bytes()))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise RuntimeError(f"the pop snapshot {self.snapshot_path} is unreadable: {exc}") from exc
        replayed = skipped = 0
        if self.journal_path.exists():
            lines = self.journal_path.read_bytes().split(b"\n")
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    entry = Entry.from_row(orjson.loads(line))
                except (ValueError, TypeError) as exc:
                    if number >= len(lines) - 1:  # a torn last line: the write it belonged to was never answered
                        log.warning("pop journal: ignoring a torn last line (%s)", exc)
                        continue
                    raise RuntimeError(f"the pop journal {self.journal_path} line {number} is unreadable") from exc
                try:
                    table.replay(entry)
                    replayed += 1
                except IllegalPopTransition as exc:
                    skipped += 1
                    log.warning("pop journal line %d skipped: %s", number, exc)
        self.compact(table)
        if replayed or skipped:
            log.info("pop state: %d journal entries replayed, %d skipped", replayed, skipped)
        return table

    def compact(self, table: PopTable) -> None:
        """Write ``table`` as the snapshot and start an empty journal (no append may be in flight)."""
        atomic_write_json(self.snapshot_path, table.snapshot())
        self.close()
        self._file = open(self.journal_path, "wb")  # noqa: SIM115  (kept open for appends)
        self.size = 0

    def append(self, entries: list[Entry]) -> asyncio.Future[None]:
        """A future that resolves when ``entries`` are on disk."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if not entries:
            waiter.set_result(None)
            return waiter
        self._pending.extend(orjson.dumps(e.to_row()) + b"\n" for e in entries)
        self._waiters.append(waiter)
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush(), name="txmq-pop-journal")
        return waiter

    @property
    def idle(self) -> bool:
        return self._flushing is None

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                data = b"".join(self._pending)
                waiters = self._waiters
                self._pending = []
                self._waiters = []
                try:
                    await loop.run_in_executor(None, self._write, data)
                except OSError as exc:
                    log.error("writing the pop journal failed: %s", exc)
                    for w in waiters:
                        if not w.done():
                            w.set_exception(exc)
                    continue
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
        finally:
            self._flushing = None

    def _write(self, data: bytes) -> None:
        f = self._file
        if f is None:
            raise OSError("the pop journal is closed")
        f.write(data)  # type: ignore[attr-defined]
        f.flush()  # type: ignore[attr-defined]
        if self.sync:
            os.fsync(f.fileno())  # type: ignore[attr-defined]
        self.size += len(data)

    async def drain(self) -> None:
        while self._flushing is not None:
            await asyncio.shield(self._flushing)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # type: ignore[attr-defined]
            self._file = None
