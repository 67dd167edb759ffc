"""The check journal (``config/transactionJournal.log``): its line format and its one parser.

ASCII, one event per line (docs/transactions.md, section 4.4)::

    C <H> <sentMs>               a CHECK_TRANSACTION_STATE was written to a producer connection
    A <H> <answeredMs> <ANSWER>  the producer answered it (COMMIT, ROLLBACK or UNKNOWN)

``H`` is the half message's commit-log offset. An ``A`` line answers the latest unanswered ``C`` line of its ``H``.
An unterminated last line is a torn append and is ignored. The broker and the Spark audit both read it with
:func:`parse_journal`; neither opens the file here (the core does no IO).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

JOURNAL_NAME = "transactionJournal.log"
LEGACY_CHECKS_NAME = "transactionChecks.json"  # the format before the journal: {"checks": {"<H>": [n, lastMs]}}


@dataclass(slots=True)
class CheckAttempt:
    """One CHECK_TRANSACTION_STATE that went out, and the producer's answer (None until one arrives)."""

    sent_ms: int
    answer: str | None = None  # COMMIT, ROLLBACK or UNKNOWN
    answered_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sentAt": self.sent_ms, "answer": self.answer, "answeredAt": self.answered_ms}


@dataclass
class Journal:
    """What a journal says: the check attempts per half message, and how many lines it had (and how many were bad)."""

    attempts: dict[int, list[CheckAttempt]] = field(default_factory=dict)
    lines: int = 0
    bad: int = 0


def check_line(half_phys: int, sent_ms: int) -> str:
    return f"C {half_phys} {sent_ms}\n"


def answer_line(half_phys: int, answered_ms: int, answer: str) -> str:
    return f"A {half_phys} {answered_ms} {answer}\n"


def journal_lines(histories: Iterable[tuple[int, list[CheckAttempt]]]) -> list[str]:
    """The lines that say ``histories`` (half offset, its attempts), in order: what a rewritten journal holds."""
    out: list[str] = []
    for half_phys, attempts in histories:
        for attempt in attempts:
            out.append(check_line(half_phys, attempt.sent_ms))
            if attempt.answer is not None:
                out.append(answer_line(half_phys, attempt.answered_ms or 0, attempt.answer))
    return out


def parse_journal(data: bytes) -> Journal:
    """Parse a journal's bytes. Malformed lines are counted in ``bad`` and skipped; a torn last line is dropped."""
    journal = Journal()
    lines = data.decode("ascii", "replace").split("\n")
    lines.pop()  # empty after the last newline, or a torn append
    journal.lines = len(lines)
    attempts = journal.attempts
    for line in lines:
        parts = line.split(" ")
        try:
            if parts[0] == "C" and len(parts) == 3:
                attempts.setdefault(int(parts[1]), []).append(CheckAttempt(int(parts[2])))
            elif parts[0] == "A" and len(parts) == 4:
                for attempt in reversed(attempts.get(int(parts[1]), [])):
                    if attempt.answer is None:
                        attempt.answer, attempt.answered_ms = parts[3], int(parts[2])
                        break
            else:
                journal.bad += 1
        except ValueError:
            journal.bad += 1
    return journal


def parse_legacy_checks(data: bytes) -> dict[int, list[CheckAttempt]]:
    """``transactionChecks.json`` (before the journal): ``n`` checks, all at the last check's time. Raises
    ``ValueError`` when it cannot be read."""
    try:
        raw = json.loads(data)
        return {
            int(key): [CheckAttempt(int(value[1])) for _ in range(int(value[0]))]
            for key, value in (raw.get("checks") or {}).items()
        }
    except (TypeError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError(f"not a transactionChecks.json document: {exc}") from None
