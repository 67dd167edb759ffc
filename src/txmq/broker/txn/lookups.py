"""What the transaction driver reads from the store: the start-up scan of the half and op queues, a transaction's
op marker and committed copy, and the record of a transaction that left memory. It implements the table's
:class:`~txmq.txn.table.Disk`: the table asks only when memory does not know."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txmq.errors import RecordDecodeError
from txmq.protocol.op_marker import OP_TAG, RESUME_TAG, parse_marker
from txmq.protocol.record import MessageRecord, Prop, TransactionType, decode_offset_msg_id, encode_offset_msg_id
from txmq.protocol.topics import SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from txmq.txn.history import UNKNOWN, Outcome, TransactionRecord, apply_history, record_from_half
from txmq.txn.model import Decision, TxState
from txmq.txn.rebuild import RESUME as REPLAY_RESUME
from txmq.txn.rebuild import Folded, OpEvent, fold
from txmq.txn.table import TransactionTable

if TYPE_CHECKING:
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")

SCAN_CHUNK = 1024
TAIL_SCAN = 1024  # real-queue entries searched for a committed copy when the half message has no UNIQ_KEY
OP_SCAN_LIMIT = 200_000  # op-queue entries searched backwards for an old marker that the key index cannot find
MARKER_DECISIONS = 128  # decisions one op marker holds at most (its properties stay far below 32 KiB)


@dataclass(slots=True)
class _Target:
    """A half message whose marker is looked for."""

    phys: int
    queue_offset: int
    uniq_key: str | None
    topic: str | None  # REAL_TOPIC


class StoreLookups:
    def __init__(self, store: MessageStore, table: TransactionTable) -> None:
        self.store = store
        self.table = table
        self.op_scan_limit = OP_SCAN_LIMIT

    # -- start-up scan -----------------------------------------------------------------------------------------------

    def scan(self) -> tuple[list[TransactionRecord], dict[int, str]]:
        """The records to hold (pending, discarded, the latest resolved) and the decisions in force, from the half
        and op queues; each half message's op records are folded in log order (:mod:`txmq.txn.rebuild`, as the
        Spark audit does)."""
        store = self.store
        half_entries: dict[int, tuple[int, int]] = {}  # half queue offset -> (phys, size)
        for offset, (phys, size) in enumerate(self._queue(TRANS_HALF_TOPIC), store.min_offset(TRANS_HALF_TOPIC, 0)):
            half_entries[offset] = (phys, size)
        folds: dict[int, tuple[int | None, Folded]] = {}  # half queue offset -> (half phys, its fold)
        for seq, (phys, size) in enumerate(self._queue(TRANS_OP_HALF_TOPIC), store.min_offset(TRANS_OP_HALF_TOPIC, 0)):
            try:
                op = store.read_message(phys, size)
            except Exception as exc:
                log.error("unreadable transaction op record at %d: %s", phys, exc)
                continue
            if op is None or op.tags not in (OP_TAG, RESUME_TAG):
                continue
            try:
                marked = parse_marker(op.body, op.properties)
            except ValueError:
                log.error("transaction op record at %d has a malformed body %r", phys, op.body[:40])
                continue
            resume = op.tags == RESUME_TAG
            for m in marked:
                half_offset, half_phys = m.half_queue_offset, m.half_phys
                known = folds.get(half_offset)
                if known is None or known[0] is None:
                    if half_phys is None and half_offset in half_entries:
                        half_phys = half_entries[half_offset][0]
                    known = folds[half_offset] = (half_phys, known[1] if known else Folded())
                action = REPLAY_RESUME if resume else m.decision
                fold(known[1], OpEvent(seq, action, op.born_timestamp, m.by, m.copy_msg_id))
        decided: dict[int, str] = {}
        outcomes: dict[int, Outcome] = {}  # half phys -> the decision in force, in op order
        discards: dict[int, Outcome] = {}  # half phys -> its last DISCARD
        resumes: dict[int, list[int]] = {}
        removed: set[int] = set()  # half queue offsets no longer pending
        in_force: list[tuple[int, int, OpEvent]] = []
        for half_offset, (half_phys, folded) in folds.items():
            if folded.decision is not None:
                removed.add(half_offset)
            if half_phys is None:
                continue
            if folded.decision is not None:
                in_force.append((folded.decision.seq, half_phys, folded.decision))
            if folded.discard is not None:
                d = folded.discard
                discards[half_phys] = Outcome(d.action, d.at, d.by, d.copy_msg_id)
            if folded.resumes:
                resumes[half_phys] = folded.resumes
        for _seq, half_phys, e in sorted(in_force):
            decided[half_phys] = e.action
            outcomes[half_phys] = Outcome(e.action, e.at, e.by, e.copy_msg_id)
        sizes = {phys: size for phys, size in half_entries.values()}
        records: list[TransactionRecord] = []
        for half_offset, (phys, size) in half_entries.items():
            if half_offset in removed:
                continue
            rec = self.read_record(phys, size)
            if rec is None:
                continue
            apply_history(rec, None, discards.get(phys), resumes.get(phys))
            records.append(rec)
        # Discarded transactions (all of them: they await a late decision or a resume), then the latest resolved.
        resolved: list[tuple[int, Outcome]] = []
        for phys in reversed(outcomes):
            if len(resolved) >= self.table.settings.history_max:
                break
            if outcomes[phys].decision != Decision.DISCARD:
                resolved.append((phys, outcomes[phys]))
        for phys, outcome in [(p, o) for p, o in outcomes.items() if o.decision == Decision.DISCARD] + resolved[::-1]:
            rec = self.read_record(phys, sizes.get(phys))
            if rec is not None:
                self._fill(rec, outcome, discards.get(phys), resumes.get(phys))
                records.append(rec)
        return records, decided

    def _queue(self, topic: str) -> Iterator[tuple[int, int]]:
        """(phys, size) of every entry of ``topic``'s queue 0, from its minimum offset."""
        store = self.store
        offset = store.min_offset(topic, 0)
        while entries := store.read_consume_queue(topic, 0, offset, SCAN_CHUNK):
            offset += len(entries)
            for phys, size, _code in entries:
                yield phys, size

    def _fill(
        self,
        rec: TransactionRecord,
        outcome: Outcome | None,
        discard: Outcome | None = None,
        resumes: list[int] | None = None,
    ) -> None:
        apply_history(rec, outcome, discard, resumes, lambda: self.find_committed_copy(rec) is not None)

    def read_record(self, phys: int, size: int | None) -> TransactionRecord | None:
        """The PREPARED record of the half message at ``phys`` (None when there is none, or it is unreadable)."""
        try:
            half = self.store.read_message(phys, size)
        except Exception as exc:
            log.error("unreadable half message at %d: %s; skipped", phys, exc)
            return None
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return None
        rec = record_from_half(half, self.table.settings.timeout_ms)
        if rec is None:
            log.error("half message at %d has no REAL_TOPIC/REAL_QID/PGROUP; skipped", phys)
        return rec

    # -- committed copies --------------------------------------------------------------------------------------------

    def find_committed_copy(self, entry: TransactionRecord) -> int | None:
        """The commit-log offset of a committed copy of ``entry``'s half message, if one was stored."""
        store = self.store
        record = store.read_message(entry.phys, entry.size)
        if record is None:
            return None
        if entry.uniq_key:
            candidates = self._copies_by_key(entry.topic, entry.uniq_key)
        else:
            qid = int(record.properties.get(Prop.REAL_QID, "0"))
            end = store.max_offset(entry.topic, qid)
            start = max(store.min_offset(entry.topic, qid), end - TAIL_SCAN)
            candidates = {p for p, _s, _c in store.read_consume_queue(entry.topic, qid, start, end - start)}
        return next((phys for phys, _copy in self._committed_copies(entry.phys, candidates)), None)

    def _copies_by_key(self, topic: str, uniq_key: str) -> set[int]:
        """Where the key index has ``uniq_key`` in ``topic`` or in the schedule topic: a delayed message's committed
        copy waits there, right after the decision, and reaches ``topic`` only when it is due."""
        store = self.store
        return {*store.query_by_key(topic, uniq_key, 64), *store.query_by_key(SCHEDULE_TOPIC, uniq_key, 64)}

    def _committed_copies(self, half_phys: int, candidates: Iterable[int]) -> Iterator[tuple[int, MessageRecord]]:
        store = self.store
        for phys in sorted(candidates):
            if phys <= half_phys:
                continue
            copy = store.read_message(phys)
            if (
                copy is not None
                and copy.prepared_transaction_offset == half_phys
                and copy.transaction_type == TransactionType.COMMIT
            ):
                yield phys, copy

    # -- markers -----------------------------------------------------------------------------------------------------

    def decision_on_disk(self, phys: int, half: MessageRecord) -> str | None:
        """The decision of a half message decided before the in-memory window (None when undecided)."""
        props = half.properties
        target = _Target(phys, half.queue_offset, props.get(Prop.UNIQ_KEY), props.get(Prop.REAL_TOPIC))
        outcome = self._find_outcome(target, None)
        return outcome.decision if outcome is not None else None

    def _find_outcome(self, rec: TransactionRecord | _Target, decision: str | None) -> Outcome | None:
        """The op marker of ``rec`` that holds ``decision``, or any but DISCARD when None: via the key index (txmq
        markers carry the half message's UNIQ_KEY in KEYS), else by reading the op queue backwards."""
        store = self.store

        def match(op: MessageRecord | None) -> Outcome | None:
            if op is None or op.tags != OP_TAG:
                return None
            try:
                marked = parse_marker(op.body, op.properties)
            except ValueError:
                return None
            for m in marked:
                if m.decision != decision and (decision is not None or m.decision == Decision.DISCARD):
                    continue
                if m.half_phys != rec.phys if m.half_phys is not None else m.half_queue_offset != rec.queue_offset:
                    continue
                return Outcome(m.decision, op.born_timestamp, m.by, m.copy_msg_id)
            return None

        if rec.uniq_key:
            for phys in store.query_by_key(TRANS_OP_HALF_TOPIC, rec.uniq_key, 16):
                found = match(store.read_message(phys))
                if found is not None:
                    return found
            if decision is None or decision == Decision.COMMIT:
                with contextlib.suppress(Exception):
                    found = match(self._marker_after_copy(rec.phys, rec.topic, rec.uniq_key))
                    if found is not None:
                        return found
        end = store.max_offset(TRANS_OP_HALF_TOPIC, 0)
        low = max(store.min_offset(TRANS_OP_HALF_TOPIC, 0), end - self.op_scan_limit)
        while end > low:
            start = max(low, end - SCAN_CHUNK)
            entries = store.read_consume_queue(TRANS_OP_HALF_TOPIC, 0, start, end - start)
            for phys, size, _code in reversed(entries):
                with contextlib.suppress(Exception):
                    found = match(store.read_message(phys, size))
                    if found is not None:
                        return found
            end = start
        return None

    def _marker_after_copy(self, half_phys: int, topic: str | None, uniq_key: str) -> MessageRecord | None:
        """The op record stored in the same append as the committed copy of the half message at ``half_phys``: a
        COMMIT's marker lists no KEYS (the copy, which the key index finds by UNIQ_KEY, leads to it), and the copies
        of one append come right before their marker."""
        store = self.store
        if not topic:
            return None
        first = next(self._committed_copies(half_phys, self._copies_by_key(topic, uniq_key)), None)
        if first is None:
            return None
        pos = first[0] + first[1].store_size
        for _ in range(MARKER_DECISIONS):
            after = store.read_message(pos)
            if after is None or after.store_size <= 0:
                return None
            if after.topic == TRANS_OP_HALF_TOPIC:
                return after
            pos += after.store_size
        return None

    # -- records that left memory ------------------------------------------------------------------------------------

    def record_at(self, half_phys: int) -> TransactionRecord | None:
        """The record of the half message at ``half_phys``: from memory, or rebuilt from its op marker."""
        table = self.table
        rec = table.history.get(half_phys)
        if rec is not None:
            return rec
        light = table.history.light.get(half_phys)
        if light is not None:  # decided while fresh: no check was ever sent, so its history is complete
            rec = self.read_record(half_phys, None)
            if rec is not None:
                copy_phys = light.copy_phys
                copy_msg_id = None if copy_phys is None else encode_offset_msg_id(table.store_host, copy_phys)
                self._fill(rec, Outcome(light.decision, light.at, light.by, copy_msg_id))
                return rec
        decision = table.decided.get(half_phys)
        if decision is None and half_phys > table.decided.evicted_max:
            return None  # not a transaction this broker tracks (a malformed half message)
        rec = self.read_record(half_phys, None)
        if rec is None:
            return None
        outcome = self._find_outcome(rec, decision)
        if outcome is None and decision is None:
            return None  # decided long ago, but its marker is gone
        self._fill(rec, outcome or Outcome(decision or UNKNOWN, 0, None, None))
        rec.history_complete = False
        return rec

    def find(self, ident: str) -> TransactionRecord | None:
        """The transaction known by ``ident``: a transaction id, a UNIQ_KEY, the offsetMsgId of its half message, of
        its delivered message, or of its TRANS_CHECK_MAX_TIME_TOPIC copy. Old resolved ones are rebuilt from disk."""
        ident = ident.strip()
        if not ident:
            return None
        self.table.materialize_all()
        rec = self.table.history.by_transaction_id(ident)
        if rec is not None:
            return rec
        if len(ident) in (32, 56):
            with contextlib.suppress(RecordDecodeError):
                _host, offset = decode_offset_msg_id(ident)
                rec = self._find_by_offset(offset, ident.upper())
                if rec is not None:
                    return rec
        return self._latest_by_key(ident)

    def _latest_by_key(self, uniq_key: str) -> TransactionRecord | None:
        try:
            hits = self.store.query_by_key(TRANS_HALF_TOPIC, uniq_key, 16)
        except Exception as exc:
            log.warning("looking up transaction %s in the key index failed: %s", uniq_key, exc)
            return None
        for phys in sorted(hits, reverse=True):  # a re-sent prepare stores a second half message: the latest wins
            rec = self.record_at(phys)
            if rec is not None:
                return rec
        return None

    def _find_by_offset(self, offset: int, msg_id: str) -> TransactionRecord | None:
        rec = self.table.history.get(offset)
        if rec is not None and rec.half_msg_id == msg_id:
            return rec
        try:
            record = self.store.read_message(offset)
        except Exception:
            return None
        if record is None or encode_offset_msg_id(record.store_host, record.physical_offset) != msg_id:
            return None
        if record.topic == TRANS_HALF_TOPIC:
            return self.record_at(offset)
        if record.transaction_type == TransactionType.COMMIT and record.prepared_transaction_offset >= 0:
            rec = self.record_at(record.prepared_transaction_offset)
            return rec if rec is not None and rec.state is TxState.COMMITTED else None
        if record.topic == TRANS_CHECK_MAX_TIME_TOPIC and record.properties.get(Prop.UNIQ_KEY):
            return self._latest_by_key(record.properties[Prop.UNIQ_KEY])
        return None
