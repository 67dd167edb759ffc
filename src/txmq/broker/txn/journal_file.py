"""The check journal on disk (``<store>/config/transactionJournal.log``; format and parser in :mod:`txmq.txn.journal`):
lines are buffered per check round and appended with an fsync; the file is rewritten from memory at start and when it
grows past twice its live lines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from txmq.txn.journal import (
    JOURNAL_NAME,
    LEGACY_CHECKS_NAME,
    CheckAttempt,
    journal_lines,
    parse_journal,
    parse_legacy_checks,
)
from txmq.util import atomic_write_bytes

log = logging.getLogger("txmq.broker.transactions")

SLACK = 10_000  # journal lines allowed beyond twice the live ones before it is rewritten


class JournalFile:
    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / JOURNAL_NAME
        self._legacy_path = config_dir / LEGACY_CHECKS_NAME
        self._buf: list[str] = []
        self._lines = 0  # lines in the file now
        self._live = 0  # lines it had when last rewritten

    def add(self, line: str) -> None:
        self._buf.append(line)

    @property
    def wants_compaction(self) -> bool:
        return self._lines > 2 * self._live + SLACK

    def flush(self) -> None:
        """Append the buffered lines now (blocking)."""
        lines, self._buf = self._buf, []
        self._append(lines)

    async def flush_async(self) -> None:
        if self._buf:
            lines, self._buf = self._buf, []
            await asyncio.to_thread(self._append, lines)

    def _append(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="ascii") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
            self._lines += len(lines)
        except OSError as exc:
            log.error("appending to the transaction journal %s failed: %s", self.path, exc)

    async def rewrite(self, histories: Iterable[tuple[int, list[CheckAttempt]]]) -> None:
        """Rewrite the file from memory: the check history of every record held (built on the loop, so everything
        buffered is in it)."""
        out = journal_lines(histories)
        self._buf.clear()
        data = "".join(out).encode("ascii")
        try:
            await asyncio.to_thread(atomic_write_bytes, self.path, data)
            self._lines = self._live = len(out)
            with contextlib.suppress(FileNotFoundError):
                self._legacy_path.unlink()
        except OSError as exc:
            log.error("rewriting the transaction journal %s failed: %s", self.path, exc)

    def load(self) -> dict[int, list[CheckAttempt]]:
        """The check attempts per half message (blocking); an unreadable file starts the history over."""
        try:
            journal = parse_journal(self.path.read_bytes())
        except FileNotFoundError:
            journal = parse_journal(b"")
        except OSError as exc:
            log.error("the transaction journal %s is unreadable (%s); check history starts over", self.path, exc)
            journal = parse_journal(b"")
        if journal.bad:
            log.error("%d malformed line(s) in the transaction journal %s skipped", journal.bad, self.path)
        self._lines = journal.lines
        attempts = journal.attempts
        # The format before the journal: half offset -> [checks, last check ms]. Honoured once, then removed.
        try:
            for phys, legacy in parse_legacy_checks(self._legacy_path.read_bytes()).items():
                attempts.setdefault(phys, legacy)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error("legacy check counts %s are unreadable (%s); ignored", self._legacy_path, exc)
        return attempts
