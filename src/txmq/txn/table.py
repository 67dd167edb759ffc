"""The transaction table: every transaction the broker knows, what it decides about each input, and the check
schedule. It does no IO: it returns effects (:mod:`txmq.txn.effects`) and the driver carries them out; what it
needs from disk (the half message at an offset, an old decision) the driver supplies.

One transaction is in exactly one of:

* **fresh**: prepared, no record built yet, held as stored (most are decided within milliseconds, so their record
  is never built). Bounded in count and bytes; one older than a second gets its record.
* **pending**: PREPARED with a record, in the check schedule (a heap by due time).
* **history**: its record (pending, discarded, or one of the last ``history_max`` resolved), or a light entry for a
  transaction decided while fresh (:class:`txmq.txn.history.History`).
* **decided**: half offset -> decision for the newest ``decided_max`` decisions (:class:`DecisionWindow`); an older
  one is read from its op marker on disk.

The rules (first decision wins, DISCARD is not a decision, only a DISCARDED transaction can be resumed) are the
rows of :data:`txmq.txn.machine.TRANSITIONS`; this module only looks them up.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import MessageRecord, Prop, encode_offset_msg_id
from txmq.protocol.topics import TRANS_HALF_TOPIC
from txmq.txn.counters import TxCounters
from txmq.txn.effects import AppendJournal, DecisionRequest, Discard, Due, Reply, SendCheck, StoreDecision
from txmq.txn.history import UNKNOWN, History, Light, TransactionRecord, record_from_half
from txmq.txn.journal import CheckAttempt, answer_line, check_line
from txmq.txn.machine import TX_TRANSITIONS, Verdict, rule
from txmq.txn.model import INPUT_OF_DECISION, STATE_OF_DECISION, By, Decision, Input, TxState, state_after
from txmq.txn.schedule import CheckSchedule
from txmq.txn.several import decisions_of_several, join_refusal

log = logging.getLogger("txmq.txn")

NO_GUARD = 2**63 - 1
HEAP_SLACK = 4096  # stale check-schedule entries allowed beyond twice the pending ones
# Fresh half messages are kept as stored, so END_TRANSACTION need not read them back: at most this many, holding at
# most this many bytes of bodies (a 4 MiB body is allowed; 8192 of them must not be). Past either bound, and once one
# is older than FRESH_MS, the oldest get their record (and leave their body).
FRESH_MAX = 8192
FRESH_MAX_BYTES = 64 << 20
FRESH_MS = 1_000
DEFAULT_HISTORY_MAX = 10_000
DEFAULT_DECIDED_MAX = 200_000
DEFAULT_MAX_MESSAGES = 64


@dataclass(frozen=True, slots=True)
class TxSettings:
    """The broker.conf keys the table follows."""

    timeout_ms: int = 6_000  # transactionTimeOut
    check_interval_ms: int = 60_000  # transactionCheckInterval
    check_max: int = 15  # transactionCheckMax
    reserved_ms: int = 72 * 3_600_000  # fileReservedTime: a half message older than this is discarded
    history_max: int = DEFAULT_HISTORY_MAX  # transactionHistoryMax
    decided_max: int = DEFAULT_DECIDED_MAX  # transactionDecidedMax
    resolution_window: int = 1_000  # transactionResolutionWindow
    max_messages: int = DEFAULT_MAX_MESSAGES  # transactionMaxMessages: messages one transaction may hold
    fresh_max: int = FRESH_MAX
    fresh_max_bytes: int = FRESH_MAX_BYTES
    heap_slack: int = HEAP_SLACK


class Disk(Protocol):
    """What the table may ask the driver to read, only when memory does not know."""

    def decision_on_disk(self, phys: int, half: MessageRecord) -> str | None:
        """The decision of the half message at ``phys``, from its op marker (None when undecided)."""

    def record_at(self, phys: int) -> TransactionRecord | None:
        """The record of the transaction at ``phys``, rebuilt from its half message and op marker."""


class DecisionWindow(dict[int, str]):
    """Half commit-log offset -> decision, for the most recent ``limit`` decisions (about 80 bytes each).

    Older decisions leave memory; ``evicted_max`` is the highest offset that left, so a half message above it that
    is not here was never decided, and one at or below it is looked up in its op marker on disk. A dict, so that
    lookups (one per END_TRANSACTION) run in C; only storing goes through :meth:`__setitem__`, which keeps the
    order. ``pop`` leaves the offset's place in the order stale; eviction skips it.
    """

    __slots__ = ("_order", "evicted_max", "limit")

    def __init__(self, limit: int, items: Iterable[tuple[int, str]] = ()) -> None:
        super().__init__()
        self.limit = max(1, limit)
        self._order: collections.deque[int] = collections.deque()
        self.evicted_max = -1
        for phys, decision in items:
            self[phys] = decision

    def __setitem__(self, phys: int, decision: str) -> None:
        if phys not in self:
            self._order.append(phys)
        dict.__setitem__(self, phys, decision)
        if len(self) > self.limit:
            order = self._order
            while len(self) > self.limit:
                old = order.popleft()
                if dict.pop(self, old, None) is not None and old > self.evicted_max:
                    self.evicted_max = old


class TransactionTable:
    """The broker's transactions, decided without IO (see the module's docstring)."""

    def __init__(self, settings: TxSettings, store_host: tuple[str, int]) -> None:
        self.settings = settings
        self.store_host = store_host
        self.pending_records: dict[int, TransactionRecord] = {}  # in doubt, with a record, checked on schedule
        self.fresh: dict[int, MessageRecord] = {}  # prepared, no record yet, as stored (oldest first)
        self.fresh_bytes = 0
        self.decided = DecisionWindow(settings.decided_max)
        self.history = History(settings.history_max)
        self.counters = TxCounters(settings.resolution_window)
        self.discarded_now = 0
        # In-doubt transactions of several messages: id -> their records in order. The first is the one decided,
        # checked and discarded for all; the others are held (in doubt, kept from retention) but never scheduled.
        self.groups: dict[str, list[TransactionRecord]] = {}
        self.schedule = CheckSchedule()

    # -- what it holds -----------------------------------------------------------------------------------------------

    @property
    def in_doubt(self) -> int:
        return len(self.pending_records) + len(self.fresh)

    @property
    def schedule_size(self) -> int:
        """Entries in the check schedule, stale ones included (kept near the pending count)."""
        return len(self.schedule)

    def pending(self) -> dict[int, TransactionRecord]:
        """Every in-doubt transaction by half commit-log offset; fresh ones get their record."""
        self.materialize_all()
        return self.pending_records

    def retention_guard(self) -> int:
        """The lowest half commit-log offset still in doubt (retention keeps its segment)."""
        return min(min(self.pending_records, default=NO_GUARD), min(self.fresh, default=NO_GUARD))

    def lowest_half_queue_offset(self) -> int | None:
        offsets = [p.queue_offset for p in self.pending_records.values()]
        offsets += [m.queue_offset for m in self.fresh.values()]
        return min(offsets, default=None)

    def counter_values(self) -> dict[str, int]:
        return self.counters.snapshot(self.in_doubt, self.discarded_now)

    def list_in_doubt(self, now: int, **filters: Any) -> tuple[int, list[TransactionRecord]]:
        """(how many match, the oldest ``limit`` of them) among the records held (fresh ones get theirs) and
        ``also``: :meth:`txmq.txn.history.History.matching`."""
        self.materialize_all()
        return self.history.matching(now, **filters)

    def light_in(self, states: frozenset[TxState]) -> list[int]:
        return self.history.light_in(states)

    # -- prepare -----------------------------------------------------------------------------------------------------

    def may_join(self, half: MessageRecord) -> str | None:
        """Before a half message that belongs to a transaction of several messages is stored: None when it may be,
        else why not (:func:`txmq.txn.several.join_refusal`)."""
        tx_id = half.properties.get(Prop.TX_ID)
        if tx_id is None:
            return None
        return join_refusal(half, tx_id, self.groups.get(tx_id), self.settings.max_messages)

    def half_stored(self, half: MessageRecord, result: Any) -> None:
        """The store has ``half`` (``result`` is a stored put result: its place and store time): it is in doubt."""
        half.physical_offset = result.physical_offset
        half.queue_offset = result.queue_offset
        half.store_timestamp = result.store_timestamp
        half.store_size = result.size
        self.prepared(half)

    def prepared(self, half: MessageRecord) -> None:
        """A half message is stored (offsets and store time filled in): it is in doubt, and fresh (a message of a
        transaction of several gets its record at once: it is decided with the others)."""
        self.counters.values["halfMessages"] += 1
        if Prop.TX_ID in half.properties:
            self._joined(half)
            return
        fresh = self.fresh
        fresh[half.physical_offset] = half
        self.fresh_bytes += len(half.body)
        settings = self.settings
        while fresh and (len(fresh) > settings.fresh_max or self.fresh_bytes > settings.fresh_max_bytes):
            self.materialize(next(iter(fresh)))

    def _joined(self, half: MessageRecord) -> None:
        rec = record_from_half(half, self.settings.timeout_ms)
        if rec is None:
            return
        rec.due_ms = rec.first_due_ms
        if rec.tx_id is None:
            self.add_pending(rec)
        else:
            members = self.groups.setdefault(rec.tx_id, [])
            members.append(rec)
            if len(members) == 1:
                self.add_pending(rec)
            else:
                self.pending_records[rec.phys] = rec
        self.history.remember(rec)

    def lead_of(self, rec: TransactionRecord) -> TransactionRecord:
        """The message a transaction is decided through: its first, for a transaction of several in doubt."""
        members = self.groups.get(rec.tx_id) if rec.tx_id else None
        return members[0] if members else rec

    def members_of(self, rec: TransactionRecord) -> list[TransactionRecord]:
        """Every message of ``rec``'s transaction in doubt (``[rec]`` for a transaction of one)."""
        members = self.groups.get(rec.tx_id) if rec.tx_id else None
        return list(members) if members else [rec]

    def materialize(self, phys: int) -> TransactionRecord | None:
        """Build the record of the fresh half message at ``phys``: it enters the pending table and the check
        schedule, and its body leaves memory. None when the half message names no producer group."""
        half = self.fresh.pop(phys)
        self.fresh_bytes -= len(half.body)
        rec = record_from_half(half, self.settings.timeout_ms)
        if rec is None:
            return None
        rec.due_ms = rec.first_due_ms
        self.add_pending(rec)
        self.history.remember(rec)
        return rec

    def materialize_all(self) -> None:
        for phys in list(self.fresh):
            self.materialize(phys)

    def materialize_older(self, now: int) -> None:
        """Records for the fresh half messages stored before ``now - FRESH_MS`` (the oldest come first)."""
        fresh = self.fresh
        cutoff = now - FRESH_MS
        while fresh:
            phys = next(iter(fresh))
            if fresh[phys].store_timestamp > cutoff:
                break
            self.materialize(phys)

    # -- decisions ---------------------------------------------------------------------------------------------------

    def decide(
        self, req: DecisionRequest, half: MessageRecord | None, disk: Disk, now: int
    ) -> Reply | StoreDecision | list[StoreDecision]:
        """Validate a COMMIT or ROLLBACK against the half message at ``req.phys`` (``half``: as the driver read it,
        or None) and the table; a ROLLBACK that applies is applied here, a COMMIT once its copies are stored. A
        transaction of several messages gives one decision per message (``half`` only on the first: the driver
        reads the others' for their copies)."""
        phys = req.phys
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return Reply(
                ResponseCode.SYSTEM_ERROR,
                "Find prepared transaction message failed",
                f"END_TRANSACTION {req.msg_id} from {req.origin}: no prepared message at commit-log offset {phys}",
            )
        problem = None
        if half.properties.get(Prop.PGROUP) != req.group:
            problem = "The producer group wrong"
        elif half.queue_offset != req.queue_offset:
            problem = "The transaction state table offset wrong"
        elif half.physical_offset != phys:
            problem = "The commit log offset wrong"
        if problem is not None:
            return Reply(
                ResponseCode.SYSTEM_ERROR,
                problem,
                f"END_TRANSACTION {req.msg_id} from {req.origin} refused: {problem} (group {req.group}, "
                f"tranStateTableOffset {req.queue_offset}, commitLogOffset {phys})",
            )
        decision = req.decision
        fresh = phys in self.fresh
        earlier = self.decided.get(phys)
        if earlier is None and phys <= self.decided.evicted_max and phys not in self.pending_records and not fresh:
            known, earlier = self.history.known_decision(phys)
            if not known:
                earlier = disk.decision_on_disk(phys, half)
        if earlier == UNKNOWN:
            # A marker written by RocketMQ ended it without saying how: refused as a conflicting decision would be.
            earlier_state = state_after(Decision.ROLLBACK if decision == Decision.COMMIT else Decision.COMMIT)
        else:
            earlier_state = state_after(earlier)
        verdict = rule(earlier_state, INPUT_OF_DECISION[decision], req.by)
        if verdict.verdict is Verdict.REPEAT:
            done = "committed" if decision == Decision.COMMIT else "rolled back"
            return Reply(ResponseCode.SUCCESS, f"[TXMQ] transaction {req.msg_id} already {done}; nothing done")
        if verdict.verdict is Verdict.REFUSE:
            self.counters.add("refusedDecisions")
            when, warning = "", None
            if verdict.code == ResponseCode.TRANSACTION_FAILED:  # an operator: say who ended it
                rec = self.history.get(phys) or disk.record_at(phys)
                when = f" by {rec.resolved_by}" if rec is not None and rec.resolved_by else ""
            else:
                warning = (
                    f"END_TRANSACTION {req.msg_id} from {req.origin}: {decision} refused, the transaction was already "
                    f"decided as {earlier}"
                )
            return Reply(
                verdict.code,
                f"[TXMQ] transaction {req.msg_id} was already decided as {earlier}{when}; {decision} refused",
                warning,
            )
        tx_id = half.properties.get(Prop.TX_ID)
        if tx_id is not None:
            return self._decide_several(req, half, tx_id, now)
        rec = self.history.records.get(phys)
        if rec is None:
            if not fresh:
                rec = record_from_half(half, self.settings.timeout_ms)  # a transaction that left the history window
            elif req.transaction_id and req.transaction_id != half.properties.get(Prop.UNIQ_KEY):
                rec = self.materialize(phys)  # a record keeps the other id, for lookups by it
        if rec is not None and req.transaction_id and req.transaction_id != rec.uniq_key:
            rec.transaction_id = req.transaction_id
        uniq_key = rec.uniq_key if rec is not None else half.properties.get(Prop.UNIQ_KEY)
        store = StoreDecision(phys, half.queue_offset, uniq_key, decision, req.by, half, rec, req.msg_id, req.group)
        if decision == Decision.ROLLBACK:  # decided as soon as it is accepted; the marker only records it
            self.applied(store, None, now)
        return store

    def _decide_several(
        self, req: DecisionRequest, half: MessageRecord, tx_id: str, now: int
    ) -> Reply | list[StoreDecision]:
        out = decisions_of_several(req, half, tx_id, self.groups.get(tx_id))
        if not isinstance(out, Reply) and req.decision == Decision.ROLLBACK:
            for d in out:
                self.applied(d, None, now)
        return out

    def applied(self, d: StoreDecision, copy_phys: int | None, now: int) -> None:
        """``d`` is decided (a COMMIT: its copy is stored at ``copy_phys``)."""
        phys = d.phys
        self.decided[phys] = d.decision
        half = self.fresh.pop(phys, None)
        if half is not None:  # decided while fresh: counted, and remembered without a record
            self.fresh_bytes -= len(half.body)
            self.counters.resolved(d.decision, d.by, now - half.store_timestamp)
            self.history.remember_light(phys, Light(d.decision, d.by, now, copy_phys))
            return
        self.pending_records.pop(phys, None)
        rec = d.rec or self.history.get(phys)  # or built while the decision was being stored
        if rec is not None and rec.tx_id:
            self.groups.pop(rec.tx_id, None)
        if rec is not None:
            copy_msg_id = None if copy_phys is None else self._msg_id(copy_phys)
            self.resolve(rec, d.decision, d.by, copy_msg_id, now)

    def resolve(self, rec: TransactionRecord, decision: str, by: str, copy_msg_id: str | None, now: int) -> None:
        """Move ``rec`` to the state of ``decision`` (already applied on disk), and count it."""
        if self._move(rec, decision, by, copy_msg_id, now):
            self.counters.resolved(decision, by, now - rec.prepared_at)

    def recovered(self, rec: TransactionRecord, copy_msg_id: str, now: int) -> None:
        """At start, ``rec`` proved committed by a copy whose marker was lost (the marker is written again)."""
        self.decided[rec.phys] = Decision.COMMIT
        self.pending_records.pop(rec.phys, None)
        if rec.tx_id:
            self.groups.pop(rec.tx_id, None)
        self._move(rec, Decision.COMMIT, By.RECOVERY, copy_msg_id, now)

    def _move(self, rec: TransactionRecord, decision: str, by: str, copy_msg_id: str | None, now: int) -> bool:
        old = rec.state
        new = STATE_OF_DECISION[decision]
        if new not in TX_TRANSITIONS[old]:  # the decided map already refused anything illegal
            log.error("transaction %s: a %s transaction cannot become %s", rec.name, old.value, new.value)
            return False
        rec.state = new
        if old is TxState.DISCARDED:
            self.discarded_now -= 1
        if decision == Decision.DISCARD:
            self.discarded_now += 1
            rec.discarded_at = now
            rec.discarded_msg_id = copy_msg_id
        else:
            rec.resolved_at = now
            rec.resolved_by = by
            if decision == Decision.COMMIT:
                rec.delivered_msg_id = copy_msg_id
        self.history.remember(rec)
        return True

    def _msg_id(self, phys: int) -> str:
        return encode_offset_msg_id(self.store_host, phys)

    # -- checks ------------------------------------------------------------------------------------------------------

    def add_pending(self, rec: TransactionRecord) -> None:
        pending = self.pending_records
        pending[rec.phys] = rec
        self.schedule.add(rec, pending, self.settings.heap_slack)

    def reschedule(self, rec: TransactionRecord, due_ms: int) -> None:
        self.schedule.push(rec, due_ms)

    def due(self, now: int, busy: Container[int]) -> list[Due]:
        """What is due at ``now``: a check, or a discard after ``check_max`` checks or past ``reserved_ms``. A
        transaction in ``busy`` (a decision about it is being stored) is skipped."""
        self.materialize_older(now)  # still undecided after a second: from now on it is checked on schedule
        settings = self.settings
        out: list[Due] = []
        pending = self.pending_records
        for phys, due_ms in self.schedule.pop_due(now):
            rec = pending.get(phys)
            if rec is None or rec.due_ms != due_ms or phys in busy:
                continue
            too_old = now - (rec.prepared_at or rec.born_ms) > settings.reserved_ms  # by store time, as retention
            out.append(Discard(rec) if rec.checks >= settings.check_max or too_old else SendCheck(rec))
        return out

    def still_pending(self, rec: TransactionRecord) -> bool:
        return self.pending_records.get(rec.phys) is rec

    def check_sent(self, rec: TransactionRecord, now: int) -> AppendJournal:
        rec.waiting_for_producer = False
        rec.checks += 1
        rec.last_check_ms = now
        rec.check_log.append(CheckAttempt(now))
        self.counters.add("checksSent")
        self.reschedule(rec, now + self.settings.check_interval_ms)
        return AppendJournal(check_line(rec.phys, now))

    def check_not_sent(self, rec: TransactionRecord, now: int) -> None:
        """No live producer of the group took the check: it waits, and is not counted."""
        rec.waiting_for_producer = True
        self.reschedule(rec, now + self.settings.check_interval_ms)

    def note_answer(self, phys: int, group: str, answer: str, now: int) -> AppendJournal | None:
        """A producer answered the latest unanswered check of the half message at ``phys``."""
        rec = self.history.get(phys)
        if rec is None or rec.group != group:
            return None
        for attempt in reversed(rec.check_log):
            if attempt.answer is None:
                attempt.answer, attempt.answered_ms = answer, now
                self.counters.add("checkAnswers")
                return AppendJournal(answer_line(phys, now, answer))
        return None

    def discarding(self, rec: TransactionRecord) -> list[TransactionRecord]:
        """The copies of ``rec``'s messages to TRANS_CHECK_MAX_TIME_TOPIC are stored: the messages it discards, now
        DISCARD in the decided map (the driver writes the marker, then :meth:`resolve` for each); none when it was
        decided while the copies were stored (the decision stands)."""
        if not self.still_pending(rec):
            return []
        members = (self.groups.pop(rec.tx_id, None) if rec.tx_id else None) or [rec]
        for m in members:
            self.pending_records.pop(m.phys, None)
            self.decided[m.phys] = Decision.DISCARD
        return members

    # -- resume ------------------------------------------------------------------------------------------------------

    def may_resume(self, rec: TransactionRecord) -> Reply | None:
        """None when ``rec`` may be resumed (DISCARDED and held in memory), else the refusal."""
        verdict = rule(rec.state, Input.RESUME, By.OPERATOR)
        if verdict.verdict is not Verdict.APPLY or self.history.get(rec.phys) is not rec:
            return Reply(
                ResponseCode.TRANSACTION_FAILED,
                f"[TXMQ] transaction {rec.name} is {rec.state.value}; only a DISCARDED transaction can be resumed",
            )
        return None

    def resumed(self, members: list[TransactionRecord], now: int) -> None:
        """The resume records are stored: the transaction (``members``, its messages, first first) is pending
        again, and its checks count from zero."""
        for rec in members:
            rec.move_to(TxState.PREPARED)
            self.discarded_now -= 1
            self.decided.pop(rec.phys, None)
            rec.resumed_at.append(now)
            rec.checks = 0
            rec.last_check_ms = 0
            rec.waiting_for_producer = False
            rec.due_ms = now
            self.pending_records[rec.phys] = rec
        first = members[0]
        if first.tx_id:
            self.groups[first.tx_id] = list(members)
        self.add_pending(first)
        self.counters.add("resumes")

    # -- rebuild -----------------------------------------------------------------------------------------------------

    def load(
        self, records: list[TransactionRecord], decided: dict[int, str], journal: dict[int, list[CheckAttempt]]
    ) -> None:
        """Start over from what the driver read at start: the records rebuilt from the half and op queues
        (:mod:`txmq.txn.rebuild`), the decisions in force, and the check journal."""
        self.pending_records.clear()
        self.fresh.clear()
        self.fresh_bytes = 0
        self.history.clear()
        self.groups.clear()
        self.decided = DecisionWindow(self.decided.limit, decided.items())
        self.schedule.clear()
        self.discarded_now = sum(1 for rec in records if rec.state is TxState.DISCARDED)
        interval = self.settings.check_interval_ms
        for rec in records:
            rec.check_log = journal.get(rec.phys, [])
            since = rec.resumed_at[-1] if rec.resumed_at else 0
            counted = [a.sent_ms for a in rec.check_log if a.sent_ms >= since]
            # Counted on from the producer's TRANSACTION_CHECK_TIMES, unless an operator's resume restarted the count.
            rec.checks = (0 if rec.resumed_at else rec.checks) + len(counted)
            rec.last_check_ms = max(counted, default=0)
            if rec.state is TxState.PREPARED:
                rec.due_ms = rec.last_check_ms + interval if counted else max(rec.first_due_ms, since)
                if rec.tx_id:
                    self.groups.setdefault(rec.tx_id, []).append(rec)
                    self.pending_records[rec.phys] = rec
                else:
                    self.add_pending(rec)
            self.history.remember(rec)
        for members in self.groups.values():
            members.sort(key=lambda r: r.seq)
            self.add_pending(members[0])
