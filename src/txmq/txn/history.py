"""One transaction's history record, and the history the broker holds in memory (what ``txmq admin tx`` shows).

A :class:`TransactionRecord` is a transaction's pending-table entry while PREPARED and its history in every state.
:class:`History` holds the records of pending and discarded transactions, and the last ``history_max`` resolved
ones; a transaction decided while fresh (no record was ever built) leaves a compact :class:`Light` entry instead,
and its record is rebuilt from the half message when asked for. No IO here.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txmq._hotpath import reduce_by_fields
from txmq.protocol.record import MessageRecord, Prop, encode_offset_msg_id
from txmq.txn.journal import CheckAttempt
from txmq.txn.machine import next_state
from txmq.txn.model import DECISION_OF_STATE, RESOLVED, STATE_OF_DECISION, Decision, TxState

UNKNOWN = "UNKNOWN"  # an op marker without a recorded decision (written by RocketMQ)
ROCKETMQ = "rocketmq"  # who ended a transaction whose marker was written by RocketMQ


@dataclass(slots=True)
class TransactionRecord:
    """One transaction: its pending-table entry while PREPARED, and its history in every state."""

    phys: int  # half commit-log offset
    size: int
    queue_offset: int  # half queue offset (tranStateTableOffset)
    group: str
    topic: str  # REAL_TOPIC
    uniq_key: str | None
    born_ms: int
    first_due_ms: int
    queue_id: int  # REAL_QID
    prepared_at: int  # the half message's store time
    store_host: tuple[str, int]  # of the half message (its offsetMsgId is half_msg_id)
    transaction_id: str | None = None  # when it differs from the UNIQ_KEY
    checks: int = 0  # checks counted toward transactionCheckMax (since the last resume)
    last_check_ms: int = 0
    due_ms: int = 0
    waiting_for_producer: bool = False
    state: TxState = TxState.PREPARED
    resolved_at: int = 0
    resolved_by: str | None = None
    delivered_msg_id: str | None = None  # offsetMsgId of the committed copy in the real topic
    discarded_at: int = 0
    discarded_msg_id: str | None = None  # offsetMsgId of the TRANS_CHECK_MAX_TIME_TOPIC copy
    resumed_at: list[int] = field(default_factory=list)
    check_log: list[CheckAttempt] = field(default_factory=list)
    history_complete: bool = True  # False when rebuilt on demand after its check history was dropped
    tx_id: str | None = None  # a transaction of several messages: its id (TXMQ_TX_ID), shared by its messages
    seq: int = 0  # and this message's place in it (TXMQ_TX_SEQ)

    @property
    def half_msg_id(self) -> str:
        """The offsetMsgId of the half message (made when asked: most transactions are never shown)."""
        return encode_offset_msg_id(self.store_host, self.phys)

    @property
    def name(self) -> str:
        """How messages to people name it: its transaction id, else its UNIQ_KEY, else its half message's id."""
        return self.transaction_id or self.uniq_key or self.half_msg_id

    def move_to(self, new: TxState) -> None:
        self.state = next_state(self.state, new)

    def status(self, now_ms: int) -> dict[str, Any]:
        return {
            "commitLogOffset": self.phys,
            "tranStateTableOffset": self.queue_offset,
            "producerGroup": self.group,
            "topic": self.topic,
            "uniqKey": self.uniq_key,
            "ageMs": now_ms - self.born_ms,
            "checks": self.checks,
            "nextCheckMs": self.due_ms,
            "waitingForProducer": self.waiting_for_producer,
        }

    def summary(self, now_ms: int) -> dict[str, Any]:
        """The row ``txmq admin tx list`` shows."""
        prepared = self.state is TxState.PREPARED
        return {
            "transactionId": self.name,
            "uniqKey": self.uniq_key,
            "state": self.state.value,
            "producerGroup": self.group,
            "topic": self.topic,
            "queueId": self.queue_id,
            "halfMsgId": self.half_msg_id,
            "preparedAt": self.prepared_at,
            "ageMs": now_ms - self.prepared_at,
            "checks": len(self.check_log),
            "nextCheckAt": self.due_ms if prepared else None,
            "waitingForProducer": self.waiting_for_producer if prepared else False,
            **({"multiTransactionId": self.tx_id, "seq": self.seq} if self.tx_id else {}),
        }

    def to_json(self, now_ms: int) -> dict[str, Any]:
        """The whole history (``txmq admin tx show``)."""
        out = self.summary(now_ms)
        out.update(
            {
                "commitLogOffset": self.phys,
                "tranStateTableOffset": self.queue_offset,
                "bornTimestamp": self.born_ms,
                "resolvedAt": self.resolved_at or None,
                "resolvedBy": self.resolved_by,
                "deliveredMsgId": self.delivered_msg_id,
                "discardedAt": self.discarded_at or None,
                "discardedMsgId": self.discarded_msg_id,
                "resumedAt": list(self.resumed_at),
                "checksTowardMax": self.checks,
                "checkLog": [a.to_json() for a in self.check_log],
                "historyComplete": self.history_complete,
            }
        )
        return out


def record_from_half(record: MessageRecord, timeout_ms: int) -> TransactionRecord | None:
    """The PREPARED record of a stored half message, or None when it lacks REAL_TOPIC, REAL_QID or PGROUP.

    It is first due ``timeout_ms`` (``transactionTimeOut``) after its born time, or CHECK_IMMUNITY_TIME_IN_SECONDS
    when that is set and not -1; a producer clock ahead of the broker's does not postpone it.
    """
    props = record.properties
    get = props.get
    group = get(Prop.PGROUP)
    topic = get(Prop.REAL_TOPIC)
    if not group or not topic:
        return None
    try:
        queue_id = int(get(Prop.REAL_QID, ""))
    except ValueError:
        return None
    born = record.born_timestamp
    stored = record.store_timestamp
    base = stored if stored and born > stored else born
    immunity = timeout_ms
    raw = get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS)
    if raw:
        try:
            seconds = int(raw)
        except ValueError:
            seconds = -1
        if seconds >= 0:
            immunity = seconds * 1000
    uniq_key = get(Prop.UNIQ_KEY)
    transaction_id = get(Prop.TRANSACTION_ID)
    # A producer may set TRANSACTION_CHECK_TIMES itself: RocketMQ counts on from it (needDiscard), so a half message
    # that says 14 under transactionCheckMax=15 is checked once more, then discarded.
    checks = 0
    raw = get(Prop.TRANSACTION_CHECK_TIMES)
    if raw:
        try:
            checks = max(int(raw), 0)
        except ValueError:
            checks = 0
    rec = TransactionRecord(  # positional: one per half message, and keywords cost a third more
        record.physical_offset,
        record.store_size,
        record.queue_offset,
        group,
        topic,
        uniq_key,
        born,
        base + immunity,  # first_due_ms
        queue_id,
        stored or born,  # prepared_at
        record.store_host,
        transaction_id if transaction_id and transaction_id != uniq_key else None,
        checks,
    )
    tx_id = get(Prop.TX_ID)
    if tx_id:
        try:
            rec.seq = max(0, int(get(Prop.TX_SEQ, "0")))
            rec.tx_id = tx_id
        except ValueError:
            pass  # a malformed place: the message is a transaction of its own
    return rec


@dataclass(slots=True)
class Outcome:
    """The op marker in force for one half message: its decision (or UNKNOWN), when, by whom, and the copy."""

    decision: str
    at: int
    by: str | None
    copy_msg_id: str | None


def apply_history(
    rec: TransactionRecord,
    outcome: Outcome | None,
    discard: Outcome | None = None,
    resumes: list[int] | None = None,
    delivered: Callable[[], bool] = lambda: False,
) -> None:
    """Fill a record rebuilt from its half message with what its op markers say. ``delivered()`` is asked only for
    a marker written by RocketMQ (UNKNOWN): the transaction committed when a committed copy exists."""
    if discard is not None:
        rec.discarded_at = discard.at
        rec.discarded_msg_id = discard.copy_msg_id
    rec.resumed_at = list(resumes or [])
    if outcome is None:
        return
    decision = outcome.decision
    if decision == UNKNOWN:
        decision = Decision.COMMIT if delivered() else Decision.ROLLBACK
    rec.state = STATE_OF_DECISION.get(decision, TxState.ROLLED_BACK)
    if rec.state in RESOLVED:
        rec.resolved_at = outcome.at
        rec.resolved_by = outcome.by or (ROCKETMQ if outcome.decision == UNKNOWN else None)
        if rec.state is TxState.COMMITTED:
            rec.delivered_msg_id = outcome.copy_msg_id


@dataclass(slots=True, init=False)
class Light:
    """How a transaction decided while fresh ended (it never had a record, so no check was ever sent)."""

    decision: str
    by: str
    at: int
    copy_phys: int | None  # commit-log offset of the committed copy

    # Written out so that mypyc compiles it (one per transaction decided while fresh); tests/protocol/
    # test_constructors.py holds it to the fields.
    def __init__(self, decision: str, by: str, at: int, copy_phys: int | None) -> None:
        self.decision = decision
        self.by = by
        self.at = at
        self.copy_phys = copy_phys

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)


class History:
    """The records held in memory, by half commit-log offset: pending and discarded transactions, and the last
    ``history_max`` resolutions (records or :class:`Light` entries), oldest evicted first."""

    def __init__(self, history_max: int) -> None:
        self.history_max = history_max
        self.records: dict[int, TransactionRecord] = {}
        self.light: dict[int, Light] = {}
        self._resolved_order: collections.deque[int] = collections.deque()  # oldest first
        self._alt_ids: dict[str, int] = {}  # transaction ids that differ from the UNIQ_KEY
        self._by_tx: dict[str, list[int]] = {}  # transactions of several messages: id -> their messages

    def clear(self) -> None:
        self.records.clear()
        self.light.clear()
        self._resolved_order.clear()
        self._alt_ids.clear()
        self._by_tx.clear()

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TransactionRecord]:
        return iter(list(self.records.values()))

    def get(self, phys: int) -> TransactionRecord | None:
        return self.records.get(phys)

    def by_transaction_id(self, ident: str) -> TransactionRecord | None:
        phys = self._alt_ids.get(ident)
        return None if phys is None else self.records.get(phys)

    def remember(self, rec: TransactionRecord) -> None:
        """Hold ``rec``; a resolved one enters the eviction order (once: resolved states are terminal)."""
        phys = rec.phys
        self.records[phys] = rec
        if rec.transaction_id and rec.transaction_id != rec.uniq_key:
            self._alt_ids[rec.transaction_id] = phys
        if rec.tx_id:
            held = self._by_tx.setdefault(rec.tx_id, [])
            if phys not in held:
                held.append(phys)
        if rec.state in RESOLVED:
            self._resolved_order.append(phys)
            self._trim()

    def remember_light(self, phys: int, entry: Light) -> None:
        self.light[phys] = entry
        self._resolved_order.append(phys)
        if len(self._resolved_order) > self.history_max:
            self._trim()

    def members(self, tx_id: str) -> list[TransactionRecord]:
        """The messages of the transaction ``tx_id`` held in memory, in their order."""
        found = [self.records[p] for p in self._by_tx.get(tx_id, ()) if p in self.records]
        return sorted(found, key=lambda r: r.seq)

    def matching(
        self,
        now: int,
        *,
        group: str | None = None,
        topic: str | None = None,
        older_than_ms: int | None = None,
        states: frozenset[TxState] = frozenset({TxState.PREPARED, TxState.DISCARDED}),
        limit: int = 100,
        also: Iterable[TransactionRecord] = (),
    ) -> tuple[int, list[TransactionRecord]]:
        """(how many match, the oldest ``limit`` of them) among the records held and ``also`` (the records of
        light entries, rebuilt by the driver: :meth:`light_in`)."""
        matched = [
            r
            for r in [*self.records.values(), *also]
            if r.state in states
            and (group is None or r.group == group)
            and (topic is None or r.topic == topic)
            and (older_than_ms is None or now - r.prepared_at >= older_than_ms)
        ]
        matched.sort(key=lambda r: (r.prepared_at, r.phys))
        return len(matched), matched[: max(0, limit)]

    def light_in(self, states: frozenset[TxState]) -> list[int]:
        """The half offsets of the light entries (transactions decided while fresh, held without a record) whose
        decision leaves them in one of ``states``."""
        return [phys for phys, light in self.light.items() if STATE_OF_DECISION[light.decision] in states]

    def known_decision(self, phys: int) -> tuple[bool, str | None]:
        """(whether memory knows the transaction at ``phys``, its decision or None while PREPARED)."""
        rec = self.records.get(phys)
        if rec is not None:
            return True, DECISION_OF_STATE.get(rec.state)
        light = self.light.get(phys)
        if light is not None:
            return True, light.decision
        return False, None

    def _trim(self) -> None:
        order = self._resolved_order
        while len(order) > self.history_max:
            old = order.popleft()
            if self.light.pop(old, None) is not None:
                continue
            gone = self.records.get(old)
            if gone is not None and gone.state in RESOLVED:
                del self.records[old]
                if gone.transaction_id:
                    self._alt_ids.pop(gone.transaction_id, None)
                if gone.tx_id and (held := self._by_tx.get(gone.tx_id)) is not None:
                    held.remove(old)
                    if not held:
                        del self._by_tx[gone.tx_id]
