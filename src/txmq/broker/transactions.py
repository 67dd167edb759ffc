"""Transactional messages, broker side: prepare, END_TRANSACTION, and the check service.

On disk this is RocketMQ's model (wire reference §4): a prepare is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with
``REAL_TOPIC``/``REAL_QID`` added and the sysFlag transaction bits cleared; decisions write an op marker to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (same queue id, tag ``d``, body = the decimal half queue offsets of the decisions it
holds, comma-separated as RocketMQ 5 batches them, no UNIQ_KEY of its own, born and store host = the broker). A COMMIT
first re-puts the message to its real topic and queue (sysFlag COMMIT, PREPARED TX OFFSET = half commit-log offset,
``REAL_TOPIC``/``REAL_QID``/``TRAN_MSG`` removed). txmq's op markers also carry, per decision, ``TXMQ_DECISION``
(COMMIT, ROLLBACK or DISCARD) and ``TXMQ_HALF_PHYS`` (the half commit-log offset) (:mod:`txmq.protocol.op_marker`); a
RocketMQ reader ignores them, and markers without them (written by RocketMQ) still remove their half messages.

In memory (rebuilt at start by scanning the half and op queues from their minimum offsets):

* the **pending table**, half commit-log offset -> :class:`PendingTransaction`, for half messages with no op marker;
* the **decided map**, half commit-log offset -> decision, for the newest ``transactionDecidedMax`` decisions
  (:class:`DecisionWindow`; an older one is read from its op marker). The first decision wins: a repeated COMMIT or
  ROLLBACK is answered with success and does nothing (a COMMIT is never delivered twice); a conflicting one is refused
  with SYSTEM_ERROR and logged. DISCARD (the check limit was reached) is not a decision: a later COMMIT or ROLLBACK from
  the producer is still applied. Concurrent END_TRANSACTIONs for one half message are serialised.

Checks, unlike RocketMQ, do **not** re-append the half message: a heap orders pending transactions by their next check
time, so a round costs O(due) and the half topic does not grow per check. Counts live in memory and are persisted
compactly (``<store>/config/transactionChecks.json``: half offset -> [checks, last check ms], written atomically after
each round that changed something and at close), so a restart resumes the schedule. A check counts only when
CHECK_TRANSACTION_STATE was actually written to a live producer connection of the half message's ``PGROUP``; with no
producer online the message waits (and its status says so) and is never discarded for that reason. A message first
becomes due ``transactionTimeOut`` ms after its born time (or ``CHECK_IMMUNITY_TIME_IN_SECONDS`` when the property is
set and not -1), then every ``transactionCheckInterval`` ms; once it has had ``transactionCheckMax`` checks it is
copied, properties kept, to ``TRANS_CHECK_MAX_TIME_TOPIC`` at its next due time and a DISCARD marker is written. A
record that fails to read or check is logged and rescheduled one interval later; it never stalls the round.

Crash safety of COMMIT: the decisions of one event-loop turn are one append, the real-topic copies first and then one
op marker that holds every decision (the writer fills each copy's offset into the marker's ``TXMQ_COPY_MSG_ID``
list), so a torn tail can lose the marker but never keep it without the copies.
If the broker dies in between (or the marker alone is lost), the start-up
rebuild finds the half message pending and, before scheduling any check, looks for an existing committed copy: via the
store's key index (``query_by_key(REAL_TOPIC, UNIQ_KEY)``; without a UNIQ_KEY, by scanning the tail of the real queue)
for a COMMIT-type record whose PREPARED TX OFFSET is the half commit-log offset. When found, the missing COMMIT marker
is written and the transaction is recorded as committed, so it is neither checked nor delivered again.

Segments that hold pending half messages are protected from retention by a guard (lowest pending half offset).

**History** (what ``txmq admin tx`` shows; the design and on-disk layout are in ``docs/transactions.md``): every
transaction the broker knows has a :class:`TransactionRecord` whose state is a :class:`TxState` (PREPARED, COMMITTED,
ROLLED_BACK, DISCARDED) with checked transitions (:data:`TX_TRANSITIONS`). Records of pending and discarded
transactions stay in memory; resolved ones are kept for the last ``transactionHistoryMax`` resolutions (a
``broker.conf`` key, default 10 000) and older ones are rebuilt on demand from the half message and its op marker.
Op markers written by txmq also carry ``TXMQ_BY`` (who decided), ``TXMQ_COPY_MSG_ID`` (offsetMsgId of the delivered
message, or of the TRANS_CHECK_MAX_TIME_TOPIC copy) and ``KEYS`` = the half message's UNIQ_KEY (so the key index finds
them), except a COMMIT stored in one append with its copy: the copy, found by UNIQ_KEY in the real topic (or in the
schedule topic, for a delayed message), comes right before its marker. An operator's resume writes an op-topic
record with tag ``txmq_resume`` that puts a DISCARDED transaction back in the pending table. Each check sent and each
answer received is appended to a compact journal (``<store>/config/transactionJournal.log``, one line per event,
rewritten without stale lines at start and when it grows); the half topic never grows per check.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.stored import answer_when_stored, put_status_code
from txmq.broker.topics import (
    PERM_READ,
    PERM_WRITE,
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from txmq.errors import ProtocolError, RecordDecodeError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.op_marker import (
    OP_TAG,
    PROP_BY,
    PROP_COPY_MSG_ID,
    PROP_DECISION,
    PROP_HALF_PHYS,
    RESUME_TAG,
    marker_fields,
    parse_marker,
)
from txmq.protocol.record import (
    TRANSACTION_MASK,
    MessageRecord,
    Prop,
    TransactionType,
    decode_offset_msg_id,
    encode_offset_msg_id,
    encode_record,
    with_transaction_type,
)
from txmq.protocol.topics import SYS_TRANS_GROUP
from txmq.txn.journal import (
    JOURNAL_NAME,
    LEGACY_CHECKS_NAME,
    CheckAttempt,
    answer_line,
    check_line,
    journal_lines,
    parse_journal,
    parse_legacy_checks,
)
from txmq.txn.machine import TX_TRANSITIONS, Verdict, next_state, rule
from txmq.txn.model import (
    DECISION_OF_STATE,
    RESOLVED,
    STATE_OF_DECISION,
    By,
    Decision,
    Input,
    TxState,
    state_after,
)
from txmq.txn.rebuild import RESUME as REPLAY_RESUME
from txmq.txn.rebuild import Folded, OpEvent, fold
from txmq.util import atomic_write_bytes

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.schedule import ScheduleService
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")

COMMIT = Decision.COMMIT
ROLLBACK = Decision.ROLLBACK
DISCARD = Decision.DISCARD
UNKNOWN = "UNKNOWN"  # an op marker without a recorded decision (written by RocketMQ); also a check's UNKNOWN answer
BY_PRODUCER = By.PRODUCER
BY_CHECK = By.CHECK
BY_OPERATOR = By.OPERATOR
BY_BROKER = By.BROKER
BY_RECOVERY = By.RECOVERY
_INPUT_OF_DECISION = {COMMIT: Input.COMMIT, ROLLBACK: Input.ROLLBACK}
_DECISIONS = {int(TransactionType.COMMIT): COMMIT, int(TransactionType.ROLLBACK): ROLLBACK}
_DONE: tuple[int, None] = (ResponseCode.SUCCESS, None)
_COMMIT_TYPE = int(TransactionType.COMMIT)
_COUNTER_OF_DECISION = {COMMIT: "commits", ROLLBACK: "rollbacks", DISCARD: "discards"}
_SCAN_CHUNK = 1024
_TAIL_SCAN = 1024  # real-queue entries searched for a committed copy when the half message has no UNIQ_KEY
_OP_SCAN_LIMIT = 200_000  # op-queue entries searched backwards for an old marker that the key index cannot find
_NO_GUARD = 2**63 - 1
_HEAP_SLACK = 4096  # stale check-schedule entries allowed beyond twice the pending ones
_MARKER_DECISIONS = 128  # decisions one op marker holds at most (its properties stay far below 32 KiB)
# Fresh half messages (prepared, no record built yet) are kept as stored, so END_TRANSACTION need not read them back:
# at most this many, holding at most this many bytes of bodies (a 4 MiB body is allowed; 8192 of them must not be).
# Past either bound, and once one is older than _FRESH_MS, the oldest get their record (and leave their body).
_FRESH_MAX = 8192
_FRESH_MAX_BYTES = 64 << 20
_FRESH_MS = 1_000
DEFAULT_HISTORY_MAX = 10_000
DEFAULT_DECIDED_MAX = 200_000
DEFAULT_RESOLUTION_WINDOW = 1_000
_JOURNAL_SLACK = 10_000  # journal lines allowed beyond twice the live ones before it is rewritten


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

    @property
    def half_msg_id(self) -> str:
        """The offsetMsgId of the half message (made when asked: most transactions are never shown)."""
        return encode_offset_msg_id(self.store_host, self.phys)

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
            "transactionId": self.transaction_id or self.uniq_key or self.half_msg_id,
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


PendingTransaction = TransactionRecord  # the pending table's entries are the PREPARED records


class TxCounters:
    """Counters since the broker started, and a window of recent times to resolution."""

    NAMES = (
        "halfMessages",
        "commits",
        "rollbacks",
        "checksSent",
        "checkAnswers",
        "discards",
        "resumes",
        "operatorResolutions",
        "refusedDecisions",
    )

    def __init__(self, window: int) -> None:
        self.values = dict.fromkeys(self.NAMES, 0)
        self.resolution_ms: collections.deque[int] = collections.deque(maxlen=max(1, window))

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def resolved(self, decision: str, by: str, waited_ms: int) -> None:
        """Count a decision (COMMIT, ROLLBACK or DISCARD); ``waited_ms``: from the prepare to the decision."""
        values = self.values
        values[_COUNTER_OF_DECISION[decision]] += 1
        if by == BY_OPERATOR:
            values["operatorResolutions"] += 1
        if decision != DISCARD:
            self.resolution_ms.append(max(0, waited_ms))

    def snapshot(self, in_doubt: int, discarded: int) -> dict[str, int]:
        out = dict(self.values)
        out["inDoubt"] = in_doubt
        out["discardedNow"] = discarded
        samples = sorted(self.resolution_ms)
        out["resolutionSamples"] = len(samples)
        out["resolutionP50Ms"] = _percentile(samples, 50)
        out["resolutionP99Ms"] = _percentile(samples, 99)
        out["resolutionMaxMs"] = samples[-1] if samples else 0
        return out


def _percentile(ordered: list[int], pct: int) -> int:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not ordered:
        return 0
    rank = max(1, -(-pct * len(ordered) // 100))
    return ordered[rank - 1]


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


def _extra_int(config: Any, key: str, default: int) -> int:
    raw = (getattr(config, "extra", None) or {}).get(key)
    if raw is None:
        return default
    try:
        return max(0, int(str(raw).strip()))
    except ValueError:
        log.error("broker.conf %s=%r is not an integer; using %d", key, raw, default)
        return default


@dataclass(slots=True)
class _Outcome:
    """The op marker in force for one half message (rebuild scratch)."""

    decision: str
    at: int
    by: str | None
    copy_msg_id: str | None


class TransactionService:
    """The broker's transactional-message service; ``broker.transactions``."""

    tick_seconds = 1.0

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store_host: tuple[str, int],
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        clients: ClientRegistry,
        schedule: ScheduleService,
        topic_changed: Callable[[], None],
    ) -> None:
        self.config = config
        self.clock = clock
        self.store_host = store_host
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.schedule = schedule
        self.topic_changed = topic_changed
        # In-doubt transactions with a record (checked on schedule, listed, shown). A half message just prepared has
        # none yet: it waits in _fresh, and most are decided within milliseconds, so their record is never built.
        self._pending: dict[int, TransactionRecord] = {}
        self.decided = DecisionWindow(_extra_int(config, "transactionDecidedMax", DEFAULT_DECIDED_MAX))
        # Every transaction held in memory (pending, discarded, the last resolved ones), by half commit-log offset.
        self.records: dict[int, TransactionRecord] = {}
        self._resolved_order: collections.deque[int] = collections.deque()  # resolved records, oldest first
        self._alt_ids: dict[str, int] = {}  # transaction ids that differ from the UNIQ_KEY
        self.discarded_now = 0
        self.history_max = _extra_int(config, "transactionHistoryMax", DEFAULT_HISTORY_MAX)
        self.counters = TxCounters(_extra_int(config, "transactionResolutionWindow", DEFAULT_RESOLUTION_WINDOW))
        self._heap: list[tuple[int, int, int]] = []  # (due_ms, seq, half phys)
        self._seq = itertools.count()
        self._inflight: dict[int, list[asyncio.Future[None]]] = {}  # half phys -> waiters for its decision
        # Half messages just prepared, as stored, so END_TRANSACTION need not read and decode them back (bounded).
        # The transactions they open are in doubt, and get a record once anything looks at them (see pending).
        self._fresh: dict[int, MessageRecord] = {}  # prepared, no record yet, as stored (oldest first)
        self._fresh_bytes = 0  # body bytes held in _fresh
        # Resolutions of fresh half messages, by half offset: (decision, by, resolved at, commit-log offset of the
        # committed copy or None). They take the place of a record in the history window; a record is rebuilt from
        # the half message when asked for.
        self._light: dict[int, tuple[str, str, int, int | None]] = {}
        self._placeholder: str | None = None  # offsetMsgId of offset 0 on this broker (see _store_batch)
        self._decisions: list[_Decision] = []  # decided in this event-loop turn, not yet handed to the store
        config_dir = Path(config.store_path_root_dir) / "config"
        self._journal_path = config_dir / JOURNAL_NAME
        self._legacy_checks_path = config_dir / LEGACY_CHECKS_NAME
        self._journal_buf: list[str] = []
        self._journal_lines = 0  # lines in the journal file now
        self._journal_live = 0  # lines it had when last rewritten
        self._task: asyncio.Task[None] | None = None
        self._ready = False

    # -- life cycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        store = self.store
        await self.rebuild()
        store.add_retention_guard(self.retention_guard)
        self._ready = True
        self._task = asyncio.create_task(self._check_loop(), name="broker-transaction-checks")

    async def close(self) -> None:
        self._ready = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._flush_journal()

    def retention_guard(self) -> int:
        """The lowest half commit-log offset still pending (retention keeps its segment)."""
        return min(min(self._pending, default=_NO_GUARD), min(self._fresh, default=_NO_GUARD))

    @property
    def pending(self) -> dict[int, TransactionRecord]:
        """The pending table: every in-doubt transaction, by half commit-log offset (fresh ones get their record)."""
        self._materialize_all()
        return self._pending

    def pending_transactions(self) -> list[dict[str, Any]]:
        now = self.clock.now_ms()
        return [p.status(now) for p in sorted(self.pending.values(), key=lambda p: p.phys)]

    def counter_values(self) -> dict[str, int]:
        """The ``tx.*`` counters (GET_BROKER_RUNTIME_INFO and TXMQ_TRANSACTION_COUNTERS)."""
        return self.counters.snapshot(len(self._pending) + len(self._fresh), self.discarded_now)

    # -- fresh half messages -----------------------------------------------------------------------------------------

    def _add_fresh(self, record: MessageRecord) -> None:
        phys = record.physical_offset
        fresh = self._fresh
        fresh[phys] = record
        self._fresh_bytes += len(record.body)
        while fresh and (len(fresh) > _FRESH_MAX or self._fresh_bytes > _FRESH_MAX_BYTES):
            self._materialize(next(iter(fresh)))

    def _materialize(self, phys: int) -> TransactionRecord | None:
        """Build the record of the fresh half message at ``phys``: it enters the pending table and the check
        schedule, and its body leaves memory."""
        half = self._fresh.pop(phys)
        self._fresh_bytes -= len(half.body)
        rec = self._pending_from(half)
        if rec is None:
            log.warning("half message at %d has no producer group; it cannot be checked", phys)
            return None
        rec.due_ms = rec.first_due_ms
        self._add_pending(rec)
        self._remember(rec)
        return rec

    def _materialize_all(self) -> None:
        for phys in list(self._fresh):
            self._materialize(phys)

    def _materialize_older(self, now: int) -> None:
        """Records for the fresh half messages stored before ``now - _FRESH_MS`` (the oldest come first)."""
        fresh = self._fresh
        cutoff = now - _FRESH_MS
        while fresh:
            phys = next(iter(fresh))
            if fresh[phys].store_timestamp > cutoff:
                break
            self._materialize(phys)

    # -- history ---------------------------------------------------------------------------------------------------

    def _remember(self, rec: TransactionRecord) -> None:
        """Hold ``rec`` in memory; resolved records are kept for the last ``history_max`` resolutions."""
        phys = rec.phys
        self.records[phys] = rec
        if rec.transaction_id and rec.transaction_id != rec.uniq_key:
            self._alt_ids[rec.transaction_id] = phys
        if rec.state in RESOLVED:  # terminal: a record enters the order once
            order = self._resolved_order
            order.append(phys)
            self._trim_history()

    def _trim_history(self) -> None:
        order = self._resolved_order
        while len(order) > self.history_max:
            old = order.popleft()
            if self._light.pop(old, None) is not None:
                continue
            gone = self.records.get(old)
            if gone is not None and gone.state in RESOLVED:
                del self.records[old]
                if gone.transaction_id:
                    self._alt_ids.pop(gone.transaction_id, None)

    def _journal(self, line: str) -> None:
        self._journal_buf.append(line)

    def _flush_journal(self) -> None:
        """Append the buffered journal lines now (blocking)."""
        lines, self._journal_buf = self._journal_buf, []
        self._append_journal(lines)

    def _append_journal(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self._journal_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._journal_path, "a", encoding="ascii") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
            self._journal_lines += len(lines)
        except OSError as exc:
            log.error("appending to the transaction journal %s failed: %s", self._journal_path, exc)

    def _journal_snapshot(self) -> tuple[bytes, int]:
        """The journal rewritten from memory: the check history of every record held (built on the loop)."""
        out = journal_lines((rec.phys, rec.check_log) for rec in list(self.records.values()))
        self._journal_buf.clear()  # everything buffered is in memory, so in the snapshot
        return "".join(out).encode("ascii"), len(out)

    async def _compact_journal(self) -> None:
        data, lines = self._journal_snapshot()
        try:
            await asyncio.to_thread(atomic_write_bytes, self._journal_path, data)
            self._journal_lines = self._journal_live = lines
            with contextlib.suppress(FileNotFoundError):
                self._legacy_checks_path.unlink()
        except OSError as exc:
            log.error("rewriting the transaction journal %s failed: %s", self._journal_path, exc)

    def _load_journal(self) -> dict[int, list[CheckAttempt]]:
        try:
            journal = parse_journal(self._journal_path.read_bytes())
        except FileNotFoundError:
            journal = parse_journal(b"")
        except OSError as exc:
            log.error(
                "the transaction journal %s is unreadable (%s); check history starts over", self._journal_path, exc
            )
            journal = parse_journal(b"")
        if journal.bad:
            log.error("%d malformed line(s) in the transaction journal %s skipped", journal.bad, self._journal_path)
        self._journal_lines = journal.lines
        attempts = journal.attempts
        # The format before the journal: half offset -> [checks, last check ms]. Honoured once, then removed.
        try:
            for phys, legacy in parse_legacy_checks(self._legacy_checks_path.read_bytes()).items():
                attempts.setdefault(phys, legacy)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error("legacy check counts %s are unreadable (%s); ignored", self._legacy_checks_path, exc)
        return attempts

    # -- rebuild ---------------------------------------------------------------------------------------------------

    async def rebuild(self) -> None:
        """Rebuild the pending table, the decided map and the history from the half and op queues plus the journal,
        then repair half-done commits."""
        journal = await asyncio.to_thread(self._load_journal)
        records, decided = await asyncio.to_thread(self._scan)
        self._pending.clear()
        self._fresh.clear()
        self._fresh_bytes = 0
        self._light.clear()
        self.records.clear()
        self._resolved_order.clear()
        self._alt_ids.clear()
        self.decided = DecisionWindow(self.decided.limit, decided.items())
        self._heap.clear()
        self.discarded_now = sum(1 for rec in records if rec.state is TxState.DISCARDED)
        interval = self.config.transaction_check_interval
        for rec in records:
            rec.check_log = journal.get(rec.phys, [])
            since = rec.resumed_at[-1] if rec.resumed_at else 0
            counted = [a.sent_ms for a in rec.check_log if a.sent_ms >= since]
            # Counted on from the producer's TRANSACTION_CHECK_TIMES, unless an operator's resume restarted the count.
            rec.checks = (0 if rec.resumed_at else rec.checks) + len(counted)
            rec.last_check_ms = max(counted, default=0)
            if rec.state is TxState.PREPARED:
                rec.due_ms = rec.last_check_ms + interval if counted else max(rec.first_due_ms, since)
                self._add_pending(rec)
            self._remember(rec)
        repaired = 0
        for entry in list(self._pending.values()):
            try:
                copy_phys = self._find_committed_copy(entry)
                if copy_phys is not None:
                    copy_id = encode_offset_msg_id(self.store_host, copy_phys)
                    await self._write_op(self._op_record(entry, COMMIT, BY_RECOVERY, copy_id))
                    self.decided[entry.phys] = COMMIT
                    self._pending.pop(entry.phys, None)
                    self._resolve_record(entry, COMMIT, BY_RECOVERY, copy_id, count=False)
                    repaired += 1
            except Exception:
                log.exception("checking half message at %d for a committed copy failed", entry.phys)
        if repaired:
            log.warning("%d committed transaction(s) lacked their op marker (crash after commit): written", repaired)
        await self._compact_journal()
        log.info(
            "transactions: %d pending, %d decided, %d in history",
            len(self._pending),
            len(self.decided),
            len(self.records),
        )

    def _scan(self) -> tuple[list[TransactionRecord], dict[int, str]]:
        store = self.store
        half_entries: dict[int, tuple[int, int]] = {}  # half queue offset -> (phys, size)
        offset = store.min_offset(TRANS_HALF_TOPIC, 0)
        while True:
            entries = store.read_consume_queue(TRANS_HALF_TOPIC, 0, offset, _SCAN_CHUNK)
            if not entries:
                break
            for phys, size, _code in entries:
                half_entries[offset] = (phys, size)
                offset += 1
        # Each half message's op records, folded in log order (txmq.txn.rebuild, as the Spark audit does).
        folds: dict[int, tuple[int | None, Folded]] = {}  # half queue offset -> (half phys, its fold)
        offset = store.min_offset(TRANS_OP_HALF_TOPIC, 0)
        while True:
            entries = store.read_consume_queue(TRANS_OP_HALF_TOPIC, 0, offset, _SCAN_CHUNK)
            if not entries:
                break
            for phys, size, _code in entries:
                seq = offset
                offset += 1
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
        outcomes: dict[int, _Outcome] = {}  # half phys -> the decision in force, in op order
        discards: dict[int, _Outcome] = {}  # half phys -> its last DISCARD
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
                discards[half_phys] = _Outcome(d.action, d.at, d.by, d.copy_msg_id)
            if folded.resumes:
                resumes[half_phys] = folded.resumes
        for _seq, half_phys, e in sorted(in_force):
            decided[half_phys] = e.action
            outcomes[half_phys] = _Outcome(e.action, e.at, e.by, e.copy_msg_id)
        sizes = {phys: size for phys, size in half_entries.values()}
        records: list[TransactionRecord] = []
        for half_offset, (phys, size) in half_entries.items():
            if half_offset in removed:
                continue
            rec = self._read_record(phys, size)
            if rec is None:
                continue
            self._apply_history(rec, None, discards.get(phys), resumes.get(phys))
            records.append(rec)
        # Discarded transactions (all of them: they await a late decision or a resume), then the latest resolved.
        resolved: list[tuple[int, _Outcome]] = []
        for phys in reversed(outcomes):
            if len(resolved) >= self.history_max:
                break
            if outcomes[phys].decision != DISCARD:
                resolved.append((phys, outcomes[phys]))
        for phys, outcome in [(p, o) for p, o in outcomes.items() if o.decision == DISCARD] + resolved[::-1]:
            rec = self._read_record(phys, sizes.get(phys))
            if rec is not None:
                self._apply_history(rec, outcome, discards.get(phys), resumes.get(phys))
                records.append(rec)
        return records, decided

    def _read_record(self, phys: int, size: int | None) -> TransactionRecord | None:
        store = self.store
        try:
            half = store.read_message(phys, size)
        except Exception as exc:
            log.error("unreadable half message at %d: %s; skipped", phys, exc)
            return None
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return None
        rec = self._pending_from(half)
        if rec is None:
            log.error("half message at %d has no REAL_TOPIC/REAL_QID/PGROUP; skipped", phys)
        return rec

    def _apply_history(
        self,
        rec: TransactionRecord,
        outcome: _Outcome | None,
        discard: _Outcome | None,
        resumes: list[int] | None,
    ) -> None:
        """Fill a record rebuilt from its half message with what its op markers say."""
        if discard is not None:
            rec.discarded_at = discard.at
            rec.discarded_msg_id = discard.copy_msg_id
        rec.resumed_at = list(resumes or [])
        if outcome is None:
            return
        decision = outcome.decision
        if decision == UNKNOWN:  # a marker written by RocketMQ: committed when a committed copy exists
            decision = COMMIT if self._find_committed_copy(rec) is not None else ROLLBACK
        rec.state = STATE_OF_DECISION.get(decision, TxState.ROLLED_BACK)
        if rec.state in RESOLVED:
            rec.resolved_at = outcome.at
            rec.resolved_by = outcome.by or ("rocketmq" if outcome.decision == UNKNOWN else None)
            if rec.state is TxState.COMMITTED:
                rec.delivered_msg_id = outcome.copy_msg_id

    def _pending_from(self, record: MessageRecord) -> TransactionRecord | None:
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
        base = stored if stored and born > stored else born  # a producer clock ahead of ours: checks not postponed
        immunity = self.config.transaction_time_out
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
        return TransactionRecord(  # positional: one per half message, and keywords cost a third more
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

    def _find_committed_copy(self, entry: TransactionRecord) -> int | None:
        store = self.store
        record = store.read_message(entry.phys, entry.size)
        if record is None:
            return None
        if entry.uniq_key:
            candidates = self._copies_by_key(entry.topic, entry.uniq_key)
        else:
            qid = int(record.properties.get(Prop.REAL_QID, "0"))
            end = store.max_offset(entry.topic, qid)
            start = max(store.min_offset(entry.topic, qid), end - _TAIL_SCAN)
            candidates = {p for p, _s, _c in store.read_consume_queue(entry.topic, qid, start, end - start)}
        return next((phys for phys, _copy in self._committed_copies(entry.phys, candidates)), None)

    def _copies_by_key(self, topic: str, uniq_key: str) -> set[int]:
        """Where the key index has ``uniq_key`` in ``topic`` or in the schedule topic: a delayed message's committed
        copy waits there, right after the decision, and reaches ``topic`` only when it is due."""
        store = self.store
        return {*store.query_by_key(topic, uniq_key, 64), *store.query_by_key(SCHEDULE_TOPIC, uniq_key, 64)}

    def _committed_copies(self, half_phys: int, candidates: Iterable[int]) -> Iterator[tuple[int, MessageRecord]]:
        """The committed copies of the half message at ``half_phys`` among the records at ``candidates``, oldest
        first."""
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

    # -- pending table ---------------------------------------------------------------------------------------------

    def _add_pending(self, entry: TransactionRecord) -> None:
        pending = self._pending
        pending[entry.phys] = entry
        heap = self._heap
        if len(heap) > 2 * len(pending) + _HEAP_SLACK:
            # Decided transactions leave their entries behind (a heap cannot drop them); when they are most of it,
            # rebuild it from the pending table, so it stays near the pending size and check rounds pop no backlog.
            seq = self._seq
            heap[:] = [(p.due_ms, next(seq), phys) for phys, p in pending.items()]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (entry.due_ms, next(self._seq), entry.phys))

    def _reschedule(self, entry: TransactionRecord, due_ms: int) -> None:
        entry.due_ms = due_ms
        heapq.heappush(self._heap, (due_ms, next(self._seq), entry.phys))

    def _resolve_record(
        self, rec: TransactionRecord, decision: str, by: str, copy_msg_id: str | None, *, count: bool = True
    ) -> None:
        """Move ``rec`` to the state of ``decision`` (already applied on disk), and count it."""
        now = self.clock.now_ms()
        old = rec.state
        new = STATE_OF_DECISION[decision]
        if new not in TX_TRANSITIONS[old]:  # the decided map already refused anything illegal
            log.error(
                "transaction %s: a %s transaction cannot become %s", rec.uniq_key or rec.phys, old.value, new.value
            )
            return
        rec.state = new
        if old is TxState.DISCARDED:
            self.discarded_now -= 1
        if decision == DISCARD:
            self.discarded_now += 1
            rec.discarded_at = now
            rec.discarded_msg_id = copy_msg_id
        else:
            rec.resolved_at = now
            rec.resolved_by = by
            if decision == COMMIT:
                rec.delivered_msg_id = copy_msg_id
        if count:
            self.counters.resolved(decision, by, now - rec.prepared_at)
        self._remember(rec)

    def _note_answer(self, phys: int, group: str, answer: str) -> None:
        """Record a producer's answer to the latest unanswered check of the half message at ``phys``."""
        rec = self.records.get(phys)
        if rec is None or rec.group != group:
            return
        for attempt in reversed(rec.check_log):
            if attempt.answer is None:
                now = self.clock.now_ms()
                attempt.answer, attempt.answered_ms = answer, now
                self._journal(answer_line(phys, now, answer))
                self.counters.add("checkAnswers")
                return

    # -- operator control ------------------------------------------------------------------------------------------

    def find(self, ident: str) -> TransactionRecord | None:
        """The transaction known by ``ident``: a transaction id, a UNIQ_KEY, the offsetMsgId of its half message, of
        its delivered message, or of its TRANS_CHECK_MAX_TIME_TOPIC copy. Old resolved ones are rebuilt from disk."""
        ident = ident.strip()
        if not ident:
            return None
        self._materialize_all()
        phys = self._alt_ids.get(ident)
        if phys is not None and phys in self.records:
            return self.records[phys]
        store = self.store
        if len(ident) in (32, 56):
            with contextlib.suppress(RecordDecodeError):
                _host, offset = decode_offset_msg_id(ident)
                rec = self._find_by_offset(offset, ident.upper())
                if rec is not None:
                    return rec
        try:
            hits = store.query_by_key(TRANS_HALF_TOPIC, ident, 16)
        except Exception as exc:
            log.warning("looking up transaction %s in the key index failed: %s", ident, exc)
            hits = []
        for phys in sorted(hits, reverse=True):  # a re-sent prepare stores a second half message: the latest wins
            rec = self._record_at(phys)
            if rec is not None:
                return rec
        return None

    def _find_by_offset(self, offset: int, msg_id: str) -> TransactionRecord | None:
        rec = self.records.get(offset)
        if rec is not None and rec.half_msg_id == msg_id:
            return rec
        store = self.store
        try:
            record = store.read_message(offset)
        except Exception:
            return None
        if record is None or encode_offset_msg_id(record.store_host, record.physical_offset) != msg_id:
            return None
        if record.topic == TRANS_HALF_TOPIC:
            return self._record_at(offset)
        if record.transaction_type == TransactionType.COMMIT and record.prepared_transaction_offset >= 0:
            rec = self._record_at(record.prepared_transaction_offset)
            return rec if rec is not None and rec.state is TxState.COMMITTED else None
        if record.topic == TRANS_CHECK_MAX_TIME_TOPIC and record.properties.get(Prop.UNIQ_KEY):
            for phys in sorted(
                store.query_by_key(TRANS_HALF_TOPIC, record.properties[Prop.UNIQ_KEY], 16), reverse=True
            ):
                rec = self._record_at(phys)
                if rec is not None:
                    return rec
        return None

    def _record_at(self, half_phys: int) -> TransactionRecord | None:
        """The record of the half message at ``half_phys``: from memory, or rebuilt from its op marker."""
        rec = self.records.get(half_phys)
        if rec is not None:
            return rec
        light = self._light.get(half_phys)
        if light is not None:  # decided while fresh: no check was ever sent, so its history is complete
            rec = self._read_record(half_phys, None)
            if rec is not None:
                decision, by, at, copy_phys = light
                copy_msg_id = None if copy_phys is None else encode_offset_msg_id(self.store_host, copy_phys)
                self._apply_history(rec, _Outcome(decision, at, by, copy_msg_id), None, None)
                return rec
        decision = self.decided.get(half_phys)
        if decision is None and half_phys > self.decided.evicted_max:
            return None  # not a transaction this broker tracks (a malformed half message)
        rec = self._read_record(half_phys, None)
        if rec is None:
            return None
        outcome = self._find_outcome(rec, decision)
        if outcome is None and decision is None:
            return None  # decided long ago, but its marker is gone
        self._apply_history(rec, outcome or _Outcome(decision or UNKNOWN, 0, None, None), None, None)
        rec.history_complete = False
        return rec

    def _find_outcome(self, rec: Any, decision: str | None) -> _Outcome | None:
        """The op marker of ``rec`` (``phys``, ``queue_offset``, ``uniq_key``) that holds ``decision``, or any but
        DISCARD when None: via the key index (txmq markers carry the half message's UNIQ_KEY in KEYS), else by
        reading the op queue backwards."""
        store = self.store

        def match(op: MessageRecord | None) -> _Outcome | None:
            if op is None or op.tags != OP_TAG:
                return None
            try:
                marked = parse_marker(op.body, op.properties)
            except ValueError:
                return None
            for m in marked:
                if m.decision != decision and (decision is not None or m.decision == DISCARD):
                    continue
                if m.half_phys != rec.phys if m.half_phys is not None else m.half_queue_offset != rec.queue_offset:
                    continue
                return _Outcome(m.decision, op.born_timestamp, m.by, m.copy_msg_id)
            return None

        if rec.uniq_key:
            for phys in store.query_by_key(TRANS_OP_HALF_TOPIC, rec.uniq_key, 16):
                found = match(store.read_message(phys))
                if found is not None:
                    return found
            if decision is None or decision == COMMIT:
                with contextlib.suppress(Exception):
                    found = match(self._marker_after_copy(rec.phys, rec.topic, rec.uniq_key))
                    if found is not None:
                        return found
        end = store.max_offset(TRANS_OP_HALF_TOPIC, 0)
        low = max(store.min_offset(TRANS_OP_HALF_TOPIC, 0), end - _OP_SCAN_LIMIT)
        while end > low:
            start = max(low, end - _SCAN_CHUNK)
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
        for _ in range(_MARKER_DECISIONS):
            after = store.read_message(pos)
            if after is None or after.store_size <= 0:
                return None
            if after.topic == TRANS_OP_HALF_TOPIC:
                return after
            pos += after.store_size
        return None

    def list_in_doubt(
        self,
        *,
        group: str | None = None,
        topic: str | None = None,
        older_than_ms: int | None = None,
        states: frozenset[TxState] = frozenset({TxState.PREPARED, TxState.DISCARDED}),
        limit: int = 100,
    ) -> tuple[int, list[TransactionRecord]]:
        """(how many match, the oldest ``limit`` of them) among pending and discarded transactions."""
        self._materialize_all()
        now = self.clock.now_ms()
        matched = [
            r
            for r in list(self.records.values())
            if r.state in states
            and (group is None or r.group == group)
            and (topic is None or r.topic == topic)
            and (older_than_ms is None or now - r.prepared_at >= older_than_ms)
        ]
        matched.sort(key=lambda r: (r.prepared_at, r.phys))
        return len(matched), matched[: max(0, limit)]

    async def operator_resolve(self, rec: TransactionRecord, decision: str) -> tuple[int, str | None]:
        """Commit or roll back ``rec`` by hand: the END_TRANSACTION path, refused once anything decided it."""
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running"
        return await self._serialised(
            rec.phys,
            lambda: self._decide(
                rec.phys,
                decision,
                group=rec.group,
                queue_offset=rec.queue_offset,
                msg_id=rec.uniq_key or rec.half_msg_id,
                by=BY_OPERATOR,
                peer="operator",
            ),
        )

    async def resume(self, rec: TransactionRecord) -> tuple[int, str | None]:
        """Put a DISCARDED transaction back in the pending table; its checks start again from zero."""
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running"
        return await self._serialised(rec.phys, lambda: self._resume(rec.phys))

    async def _resume(self, phys: int) -> tuple[int, str | None]:
        rec = self.records.get(phys) or self._record_at(phys)
        if rec is None:
            return ResponseCode.TRANSACTION_FAILED, (
                f"[TXMQ] transaction {phys} is unknown; only a DISCARDED transaction can be resumed"
            )
        verdict = rule(rec.state, Input.RESUME, BY_OPERATOR)
        if verdict.verdict is not Verdict.APPLY or self.records.get(phys) is not rec:  # only a record held in memory
            return ResponseCode.TRANSACTION_FAILED, (
                f"[TXMQ] transaction {_name(rec)} is {rec.state.value}; only a DISCARDED transaction can be resumed"
            )
        store = self.store
        try:
            half = store.read_message(rec.phys, rec.size)
        except Exception:
            half = None
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return ResponseCode.SYSTEM_ERROR, (
                f"[TXMQ] the half message of transaction {_name(rec)} at commit-log offset {rec.phys} is no longer "
                f"stored (retention); its copy stays in {TRANS_CHECK_MAX_TIME_TOPIC} as {rec.discarded_msg_id}"
            )
        if not await self._write_marker(rec, RESUME_TAG, {PROP_BY: BY_OPERATOR}):
            return ResponseCode.SYSTEM_ERROR, "[TXMQ] storing the resume record failed; nothing changed"
        now = self.clock.now_ms()
        rec.move_to(TxState.PREPARED)
        self.discarded_now -= 1
        self.decided.pop(phys, None)
        rec.resumed_at.append(now)
        rec.checks = 0
        rec.last_check_ms = 0
        rec.waiting_for_producer = False
        rec.due_ms = now
        self._add_pending(rec)
        self.counters.add("resumes")
        log.warning("transaction %s of group %s resumed by an operator; checks start again", _name(rec), rec.group)
        return ResponseCode.SUCCESS, None

    # -- prepare ---------------------------------------------------------------------------------------------------

    def prepare(
        self, cmd: RemotingCommand, record: MessageRecord, queue_id: int
    ) -> RemotingCommand | asyncio.Future[RemotingCommand]:
        """Store a half message; the response at once on refusal, else a future of it (no task per message)."""
        if self.config.reject_transaction_message:
            return cmd.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self.config.broker_name}] sending transaction message is forbidden "
                "(rejectTransactionMessage=true)",
            )
        if not self._ready:
            return cmd.response(ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running")
        limit = self.config.max_pending_transactions
        in_doubt = len(self._pending) + len(self._fresh)
        if in_doubt >= limit:
            return cmd.response(
                ResponseCode.SYSTEM_BUSY,
                f"[TXMQ] too many in-doubt transactions on broker {self.config.broker_name}: "
                f"{in_doubt} pending, limit maxPendingTransactions={limit}; "
                "commit or roll back pending transactions, or retry later",
            )
        props = record.properties
        if not props.get(Prop.PGROUP):
            with contextlib.suppress(ProtocolError):
                group = SendMessageRequestHeader.from_ext(cmd.ext_fields).producerGroup
                if group:
                    props[Prop.PGROUP] = group
        props[Prop.REAL_TOPIC] = record.topic
        props[Prop.REAL_QID] = str(record.queue_id)
        record.topic = TRANS_HALF_TOPIC
        record.queue_id = 0
        record.sys_flag &= ~TRANSACTION_MASK  # TransactionType.NOT_TYPE
        if TRANS_HALF_TOPIC not in self.topics.topics:
            self.topics.ensure(TRANS_HALF_TOPIC, 1, PERM_READ | PERM_WRITE)
            self.topic_changed()
        return answer_when_stored(
            cmd,
            self.store.put_future(record),
            queue_id,
            self.config,
            self.store_host,
            functools.partial(self._prepared, record),
        )

    def _prepared(self, record: MessageRecord, result: Any) -> None:
        """A half message is stored: it is in doubt, fresh (its record is built if it is still undecided a second
        later, or when anyone looks at the pending table)."""
        record.physical_offset = result.physical_offset
        record.queue_offset = result.queue_offset
        record.store_timestamp = result.store_timestamp
        record.store_size = result.size
        self.counters.values["halfMessages"] += 1
        self._add_fresh(record)

    # -- END_TRANSACTION -------------------------------------------------------------------------------------------

    def end_transaction(
        self, conn: Any, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        """The decision is validated at once; only its store write is waited for (a future, no task, when no other
        decision about the same half message is in progress). Oneway requests, as real clients send them, get no
        answer: their decision is queued with nothing to wait for, and a failure to store it is logged."""
        oneway = cmd.is_oneway
        outcome = self._end_transaction(conn, cmd, oneway)
        if outcome is None:
            return None
        if isinstance(outcome, tuple):
            return None if oneway else cmd.response(*outcome)
        if oneway:
            return _drop_answer(outcome)
        return _answer(cmd, outcome)

    def _end_transaction(self, conn: Any, cmd: RemotingCommand, oneway: bool) -> _Decided | None:
        peer = getattr(conn, "peer", None)
        try:
            header = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            log.warning("END_TRANSACTION from %s is malformed: %s", peer, exc)
            return ResponseCode.SYSTEM_ERROR, str(exc)
        decision = _DECISIONS.get(header.commitOrRollback)
        if header.fromTransactionCheck:
            self._note_answer(header.commitLogOffset, header.producerGroup, decision or UNKNOWN)
        if decision is None:
            if header.commitOrRollback != 0:
                log.warning(
                    "END_TRANSACTION from %s for %s with commitOrRollback=%d ignored",
                    peer,
                    header.msgId,
                    header.commitOrRollback,
                )
            return ResponseCode.SUCCESS, "transaction state unknown; the broker will check it later"
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running"
        phys = header.commitLogOffset
        by = BY_CHECK if header.fromTransactionCheck else BY_PRODUCER
        group, queue_offset, msg_id, transaction_id = (
            header.producerGroup,
            header.tranStateTableOffset,
            header.msgId,
            header.transactionId,
        )
        if phys in self._inflight:
            return self._serialised(
                phys, lambda: self._decide(phys, decision, group, queue_offset, msg_id, by, peer, transaction_id)
            )
        # The common case: nothing else decides about this half message now. The queued decision releases it.
        self._inflight[phys] = []
        try:  # positional: once per transaction; answer unless oneway, release when stored
            outcome = self._decide(
                phys, decision, group, queue_offset, msg_id, by, peer, transaction_id, not oneway, True
            )
        except BaseException:
            self._release(phys)
            raise
        if isinstance(outcome, tuple):
            self._release(phys)
        return outcome

    async def _serialised(self, phys: int, action: Callable[[], _Decided]) -> tuple[int, str | None]:
        """Run ``action()`` with no other decision or resume of the half message at ``phys`` in progress."""
        inflight = self._inflight
        while (waiters := inflight.get(phys)) is not None:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters.append(turn)
            await turn
        inflight[phys] = []
        try:
            outcome = action()
            return outcome if isinstance(outcome, tuple) else await outcome
        finally:
            self._release(phys)

    def _release(self, phys: int) -> None:
        waiters = self._inflight.pop(phys, None)
        if waiters:
            for turn in waiters:
                if not turn.done():
                    turn.set_result(None)

    def _decide(
        self,
        phys: int,
        decision: str,
        group: str,
        queue_offset: int,
        msg_id: str,
        by: str,
        peer: Any,
        transaction_id: str | None = None,
        answer: bool = True,
        release: bool = False,
    ) -> _Decided | None:
        """Validate and apply a decision: (code, remark) when settled at once, else a future of it (the store
        write), or None when nobody waits for it (``answer=False``). ``release``: the stored decision ends this
        half message's turn in ``_inflight``. The first decision wins."""
        half = self._fresh.get(phys)
        fresh = half is not None
        if half is None:
            store = self.store
            try:
                half = store.read_message(phys)
            except Exception as exc:
                log.warning("END_TRANSACTION %s at commit-log offset %d: record unreadable: %s", msg_id, phys, exc)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            log.warning("END_TRANSACTION %s from %s: no prepared message at commit-log offset %d", msg_id, peer, phys)
            return ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
        problem = None
        if half.properties.get(Prop.PGROUP) != group:
            problem = "The producer group wrong"
        elif half.queue_offset != queue_offset:
            problem = "The transaction state table offset wrong"
        elif half.physical_offset != phys:
            problem = "The commit log offset wrong"
        if problem is not None:
            log.warning(
                "END_TRANSACTION %s from %s refused: %s (group %s, tranStateTableOffset %d, commitLogOffset %d)",
                msg_id,
                peer,
                problem,
                group,
                queue_offset,
                phys,
            )
            return ResponseCode.SYSTEM_ERROR, problem
        earlier = self.decided.get(phys)
        if earlier is None and phys <= self.decided.evicted_max and phys not in self._pending and not fresh:
            earlier = self._decision_on_disk(phys, half)
        if earlier == UNKNOWN:
            # A marker written by RocketMQ ended it without saying how: refused as a conflicting decision would be.
            earlier_state = state_after(ROLLBACK if decision == COMMIT else COMMIT)
        else:
            earlier_state = state_after(earlier)
        verdict = rule(earlier_state, _INPUT_OF_DECISION[decision], by)
        if verdict.verdict is Verdict.REPEAT:
            log.info("END_TRANSACTION %s: repeated %s ignored (already applied)", msg_id, decision)
            done = "committed" if decision == COMMIT else "rolled back"
            return ResponseCode.SUCCESS, f"[TXMQ] transaction {msg_id} already {done}; nothing done"
        if verdict.verdict is Verdict.REFUSE:
            self.counters.add("refusedDecisions")
            when = ""
            if verdict.code == ResponseCode.TRANSACTION_FAILED:  # an operator: say who ended it
                rec = self.records.get(phys) or self._record_at(phys)
                when = f" by {rec.resolved_by}" if rec is not None and rec.resolved_by else ""
            else:
                log.warning(
                    "END_TRANSACTION %s from %s: %s refused, the transaction was already decided as %s",
                    msg_id,
                    peer,
                    decision,
                    earlier,
                )
            return (
                verdict.code,
                f"[TXMQ] transaction {msg_id} was already decided as {earlier}{when}; {decision} refused",
            )
        rec = self.records.get(phys)
        if rec is None:
            if not fresh:
                rec = self._pending_from(half)  # the record of a transaction that left the history window
            elif transaction_id and transaction_id != half.properties.get(Prop.UNIQ_KEY):
                rec = self._materialize(phys)  # a record keeps the other id, for find()
                fresh = False
        if rec is not None and transaction_id and transaction_id != rec.uniq_key:
            rec.transaction_id = transaction_id
        outcome: asyncio.Future[tuple[int, str | None]] | None = (
            asyncio.get_running_loop().create_future() if answer else None
        )
        copy: MessageRecord | None = None
        if decision == COMMIT:
            made = self._commit_copy(half)
            if isinstance(made, tuple):
                return made  # nothing stored, nothing decided
            copy = made
        else:  # ROLLBACK: decided as soon as it is accepted; the marker only records it.
            self._applied(phys, rec, decision, by, None, msg_id, group)
        uniq_key = rec.uniq_key if rec is not None else half.properties.get(Prop.UNIQ_KEY)
        self._queue_decision(
            _Decision(phys, half.queue_offset, uniq_key, decision, by, copy, outcome, release, rec, msg_id, group)
        )
        return outcome

    def _queue_decision(self, d: _Decision) -> None:
        """Decisions are stored once per event-loop turn, up to _MARKER_DECISIONS together (see _store_decisions)."""
        batch = self._decisions
        batch.append(d)
        if len(batch) == 1:
            asyncio.get_running_loop().call_soon(self._store_decisions)
        elif len(batch) >= _MARKER_DECISIONS:
            self._store_decisions()

    def _store_decisions(self) -> None:
        """One append for the decisions of this turn: their committed copies, then one op marker that holds them all
        (RocketMQ 5 batches op messages the same way). The writer fills each copy's offset into the marker's
        ``TXMQ_COPY_MSG_ID`` list. The copies come first: a torn tail can only lose the marker, which the rebuild
        repairs (a COMMIT from its copy; a ROLLBACK is checked again)."""
        batch, self._decisions = self._decisions, []
        if batch:
            self._store_batch(batch)

    def _store_batch(self, batch: list[_Decision]) -> None:
        try:
            self._append_batch(batch)
        except Exception as exc:  # every outcome must settle, or its half message would stay locked in _inflight
            log.exception("storing %d transaction decision(s) failed", len(batch))
            for d in batch:
                self._settle_decision(d, exc)

    def _append_batch(self, batch: list[_Decision]) -> None:
        """The marker lists the UNIQ_KEYs (KEYS, for the key index) of its ROLLBACK decisions only: a COMMIT's
        marker is found from its copy (see _marker_after_copy), which spares the index one entry per commit."""
        store = self.store
        placeholder = self._placeholder
        if placeholder is None:
            placeholder = self._placeholder = encode_offset_msg_id(self.store_host, 0)
        copies = [d.copy for d in batch if d.copy is not None]
        marker = self._op_marker(
            *marker_fields(
                [
                    (d.queue_offset, d.phys, d.decision, d.by, placeholder, None)
                    if d.copy is not None
                    else (d.queue_offset, d.phys, d.decision, d.by, None, d.uniq_key)
                    for d in batch
                ]
            )
        )
        stored = store.put_many_future([*copies, marker], link=PROP_COPY_MSG_ID if copies else None)
        stored.add_done_callback(lambda done: self._batch_stored(batch, done))

    def _batch_stored(self, batch: list[_Decision], done: asyncio.Future[list[Any]]) -> None:
        if done.cancelled() or done.exception() is not None:
            failure = asyncio.CancelledError() if done.cancelled() else done.exception()
            assert failure is not None
            for d in batch:
                self._settle_decision(d, failure)
            return
        results = done.result()
        marked = results[-1]  # an append is stored whole or refused whole
        code = put_status_code(marked)
        if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
            if len(batch) > 1 and code == ResponseCode.MESSAGE_ILLEGAL:
                for d in batch:  # one record the store refuses must not fail the others: each on its own
                    self._store_batch([d])
                return
            for d in batch:
                if d.copy is not None:
                    log.error("committing half message at %d failed: %s", d.phys, marked)
                    self._settle_decision(d, (code, f"storing the committed message failed: {marked.status.value}"))
                else:
                    self._marker_stored(marked, OP_TAG, d.decision, d.phys)
                    self._settle_decision(d, _DONE)
            return
        copy_results = iter(results)
        for d in batch:
            try:
                if d.copy is not None:
                    self._applied(d.phys, d.rec, COMMIT, d.by, next(copy_results).physical_offset, d.msg_id, d.group)
            except Exception as exc:
                log.exception("recording the decision about half message %d failed", d.phys)
                self._settle_decision(d, exc)
            else:
                self._settle_decision(d, _DONE)

    def _settle_decision(self, d: _Decision, result: tuple[int, str | None] | BaseException) -> None:
        """Tell whoever waits for ``d`` (a oneway END_TRANSACTION has nobody: a failure is logged), and end the
        half message's turn when ``d`` holds it."""
        outcome = d.outcome
        if outcome is None:
            if result is _DONE:
                pass
            elif isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("a oneway END_TRANSACTION about half message %d failed", d.phys, exc_info=result)
        elif outcome.done():
            pass
        elif isinstance(result, asyncio.CancelledError):
            outcome.cancel()
        elif isinstance(result, BaseException):
            outcome.set_exception(result)
        else:
            outcome.set_result(result)
        if d.release:
            self._release(d.phys)

    def _decision_on_disk(self, phys: int, half: MessageRecord) -> str | None:
        """The decision of a half message decided before the in-memory window (None when undecided)."""
        rec = self.records.get(phys)
        if rec is not None:
            return DECISION_OF_STATE.get(rec.state)  # None while PREPARED
        light = self._light.get(phys)
        if light is not None:
            return light[0]
        props = half.properties
        outcome = self._find_outcome(
            _Target(phys, half.queue_offset, props.get(Prop.UNIQ_KEY), props.get(Prop.REAL_TOPIC)), None
        )
        return outcome.decision if outcome is not None else None

    def _applied(
        self,
        phys: int,
        rec: TransactionRecord | None,
        decision: str,
        by: str,
        copy_phys: int | None,
        msg_id: str,
        group: str,
    ) -> None:
        """``decision`` about the half message at ``phys`` is stored (``copy_phys``: where its committed copy is)."""
        self.decided[phys] = decision
        half = self._fresh.pop(phys, None)
        if half is not None:  # decided while fresh: counted, and remembered without a record
            self._fresh_bytes -= len(half.body)
            now = self.clock.now_ms()
            self.counters.resolved(decision, by, now - half.store_timestamp)
            self._light[phys] = (decision, by, now, copy_phys)
            self._resolved_order.append(phys)
            if len(self._resolved_order) > self.history_max:
                self._trim_history()
        else:
            self._pending.pop(phys, None)
            if rec is None:
                rec = self.records.get(phys)  # built while the decision was being stored
            if rec is not None:
                copy_msg_id = None if copy_phys is None else encode_offset_msg_id(self.store_host, copy_phys)
                self._resolve_record(rec, decision, by, copy_msg_id)
        if by == BY_OPERATOR:
            log.warning("transaction %s of group %s: %s by an operator", msg_id, group, decision)

    def _commit_record(self, half: MessageRecord) -> MessageRecord:
        props = half.properties.copy()
        pop = props.pop
        topic = pop(Prop.REAL_TOPIC)
        queue_id = int(pop(Prop.REAL_QID))
        pop(Prop.TRAN_MSG, None)
        return MessageRecord(  # positional (once per commit): topic, body, queue id, flag, queue offset, phys, ...
            topic,
            half.body,
            queue_id,
            half.flag,
            0,
            0,
            (half.sys_flag & ~TRANSACTION_MASK) | _COMMIT_TYPE,
            half.born_timestamp,
            half.born_host,
            0,  # store timestamp: the writer's
            self.store_host,
            half.reconsume_times,
            half.physical_offset,  # PREPARED TX OFFSET
            props,
            half.body_crc,
        )

    def _commit_copy(self, half: MessageRecord) -> MessageRecord | tuple[int, str]:
        """The committed copy to store (redirected to the schedule topic when delayed), or (error code, remark)."""
        try:
            record = self._commit_record(half)
        except (KeyError, ValueError) as exc:
            return ResponseCode.SYSTEM_ERROR, f"the prepared message lacks its real topic/queue: {exc}"
        delay = record.properties.get(Prop.DELAY)
        if delay and delay != "0":
            try:
                record = self.schedule.redirect(record, delay)
            except BrokerRefusal as exc:
                return exc.code, exc.remark
        return record

    def _op_record(
        self,
        rec: TransactionRecord | None,
        decision: str,
        by: str,
        copy_msg_id: str | None,
        *,
        half: MessageRecord | None = None,
    ) -> MessageRecord:
        """The op marker (tag ``d``) of one decision."""
        if rec is None:
            assert half is not None
            queue_offset, phys, uniq_key = half.queue_offset, half.physical_offset, half.properties.get(Prop.UNIQ_KEY)
        else:
            queue_offset, phys, uniq_key = rec.queue_offset, rec.phys, rec.uniq_key
        return self._op_marker(*marker_fields([(queue_offset, phys, decision, by, copy_msg_id, uniq_key)]))

    async def _write_op(self, record: MessageRecord) -> bool:
        """Store an op marker (from :meth:`_op_record`) on its own."""
        result = await self.store.put(record)
        props = record.properties
        return self._marker_stored(result, OP_TAG, props[PROP_DECISION], props[PROP_HALF_PHYS])

    def _marker_record(self, target: Any, tag: str, extra: dict[str, str]) -> MessageRecord:
        """An op-topic record about the half message ``target`` (``phys``, ``queue_offset``, ``uniq_key``)."""
        props = {PROP_HALF_PHYS: str(target.phys), **extra}
        if target.uniq_key:
            props[Prop.KEYS] = target.uniq_key  # the key index then finds a transaction's markers
        return self._op_marker(str(target.queue_offset).encode("ascii"), props, tag)

    def _op_marker(self, body: bytes, props: dict[str, str], tag: str = OP_TAG) -> MessageRecord:
        if self.topics.ensure(TRANS_OP_HALF_TOPIC, 1, PERM_READ | PERM_WRITE)[1]:
            self.topic_changed()
        # No UNIQ_KEY of its own, as in RocketMQ: nobody looks a marker up by it, and the key index need not hold it.
        return MessageRecord(
            topic=TRANS_OP_HALF_TOPIC,
            body=body,
            queue_id=0,
            born_timestamp=self.clock.now_ms(),
            born_host=self.store_host,
            store_host=self.store_host,
            properties={Prop.TAGS: tag, **props},
        )

    async def _write_marker(self, target: Any, tag: str, extra: dict[str, str]) -> bool:
        result = await self.store.put(self._marker_record(target, tag, extra))
        return self._marker_stored(result, tag, extra.get(PROP_DECISION, ""), target.phys)

    @staticmethod
    def _marker_stored(result: Any, tag: str, decision: str, phys: object) -> bool:
        if result.ok:
            return True
        log.error(
            "writing the %s op record (%s) for half message %s failed: %s (a restart re-derives it)",
            tag,
            decision,
            phys,
            result,
        )
        return False

    # -- checks ----------------------------------------------------------------------------------------------------

    async def _check_loop(self) -> None:
        while True:
            await self.clock.sleep(self.tick_seconds)
            try:
                await self.check_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check round failed; retrying next tick")

    async def check_round(self) -> int:
        """Check (or discard) every pending transaction that is due; returns how many checks were sent."""
        now = self.clock.now_ms()
        self._materialize_older(now)  # still undecided after a second: from now on it is checked on schedule
        due: list[PendingTransaction] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due_ms, _seq, phys = heapq.heappop(heap)
            entry = self._pending.get(phys)
            if entry is not None and entry.due_ms == due_ms and phys not in self._inflight:
                due.append(entry)
        sent = 0
        interval = self.config.transaction_check_interval
        for entry in due:
            if self._pending.get(entry.phys) is not entry:
                continue  # decided while this round was running
            try:
                if entry.checks >= self.config.transaction_check_max or self._too_old(entry, now):
                    await self._discard(entry)
                elif self._send_check(entry, now):
                    sent += 1
                    self._reschedule(entry, now + interval)
                else:
                    self._reschedule(entry, now + interval)
            except Exception:
                log.exception("checking transaction at commit-log offset %d failed; retrying later", entry.phys)
                if self._pending.get(entry.phys) is entry:
                    self._reschedule(entry, now + interval)
        if self._journal_lines > 2 * self._journal_live + _JOURNAL_SLACK:
            await self._compact_journal()
        elif self._journal_buf:
            lines, self._journal_buf = self._journal_buf, []
            await asyncio.to_thread(self._append_journal, lines)
        self._commit_progress()
        return sent

    def _too_old(self, entry: PendingTransaction, now: int) -> bool:
        # By store time, as retention counts: a producer's wrong born time must not discard a fresh message.
        return now - (entry.prepared_at or entry.born_ms) > self.config.file_reserved_time * 3_600_000

    def _commit_progress(self) -> None:
        """Record RocketMQ's consumed offsets of the half and op queues for CID_RMQ_SYS_TRANS (for admin tools)."""
        store = self.store
        lowest = min(
            (p.queue_offset for p in [*self._pending.values(), *self._fresh.values()]),
            default=None,
        )
        half_end = store.max_offset(TRANS_HALF_TOPIC, 0)
        if half_end:
            self.offsets.commit(SYS_TRANS_GROUP, TRANS_HALF_TOPIC, 0, half_end if lowest is None else lowest)
        op_end = store.max_offset(TRANS_OP_HALF_TOPIC, 0)
        if op_end:
            self.offsets.commit(SYS_TRANS_GROUP, TRANS_OP_HALF_TOPIC, 0, op_end)

    def _send_check(self, entry: PendingTransaction, now: int) -> bool:
        """Send CHECK_TRANSACTION_STATE to a live producer of the group; True when it went out (and so counts)."""
        store = self.store
        channel = self.clients.pick_producer(entry.group, lambda c: not getattr(c, "closed", False))
        if channel is None:
            if not entry.waiting_for_producer:
                log.info("transaction %s waits: no producer of group %s is online", entry.uniq_key, entry.group)
            entry.waiting_for_producer = True
            return False
        half = store.read_message(entry.phys, entry.size)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            raise ValueError(f"no half message at commit-log offset {entry.phys}")
        real = MessageRecord(
            topic=half.properties[Prop.REAL_TOPIC],
            body=half.body,
            queue_id=int(half.properties[Prop.REAL_QID]),
            flag=half.flag,
            queue_offset=half.queue_offset,
            physical_offset=half.physical_offset,
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_timestamp=half.store_timestamp,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.prepared_transaction_offset,
            properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(entry.checks + 1)},
        )
        offset_msg_id = encode_offset_msg_id(half.store_host, half.physical_offset)
        msg_id = half.properties.get(Prop.UNIQ_KEY) or offset_msg_id
        header = CheckTransactionStateRequestHeader(
            tranStateTableOffset=half.queue_offset,
            commitLogOffset=half.physical_offset,
            msgId=msg_id,
            transactionId=msg_id,
            offsetMsgId=offset_msg_id,
        )
        body = bytes(encode_record(real))
        cmd = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(), body, oneway=True)
        try:
            channel.connection.send_oneway(cmd)
        except Exception as exc:
            log.info("transaction check of %s to %s not sent: %s", entry.uniq_key, channel.client_id, exc)
            entry.waiting_for_producer = True
            return False
        entry.waiting_for_producer = False
        entry.checks += 1
        entry.last_check_ms = now
        entry.check_log.append(CheckAttempt(now))
        self._journal(check_line(entry.phys, now))
        self.counters.add("checksSent")
        log.debug("checked transaction %s (%d) with %s", entry.uniq_key, entry.checks, channel.client_id)
        return True

    async def _discard(self, entry: TransactionRecord) -> None:
        store = self.store
        half = store.read_message(entry.phys, entry.size)
        if half is None:
            raise ValueError(f"no half message at commit-log offset {entry.phys}")
        if self.topics.ensure(TRANS_CHECK_MAX_TIME_TOPIC, 1, PERM_READ | PERM_WRITE)[1]:
            self.topic_changed()
        copy = MessageRecord(
            topic=TRANS_CHECK_MAX_TIME_TOPIC,
            body=half.body,
            queue_id=0,
            flag=half.flag,
            sys_flag=with_transaction_type(half.sys_flag, TransactionType.NOT_TYPE),
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=self.store_host,
            reconsume_times=half.reconsume_times,
            properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(entry.checks)},
        )
        result = await store.put(copy)
        if not result.ok:
            raise OSError(f"copying to {TRANS_CHECK_MAX_TIME_TOPIC} failed: {result}")
        if self._pending.get(entry.phys) is not entry:
            return  # decided while the copy was stored: the decision stands
        copy_msg_id = encode_offset_msg_id(self.store_host, result.physical_offset)
        self._pending.pop(entry.phys, None)
        self.decided[entry.phys] = DISCARD
        await self._write_op(self._op_record(entry, DISCARD, BY_BROKER, copy_msg_id))
        self._resolve_record(entry, DISCARD, BY_BROKER, copy_msg_id)
        log.warning(
            "transaction %s of group %s unresolved after %d checks: moved to %s",
            entry.uniq_key,
            entry.group,
            entry.checks,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )


# A decision's outcome: settled at once as (response code, remark), or a future of that (its store write).
_Decided: TypeAlias = "tuple[int, str | None] | asyncio.Future[tuple[int, str | None]]"


async def _answer(cmd: RemotingCommand, outcome: Awaitable[tuple[int, str | None]]) -> RemotingCommand:
    code, remark = await outcome
    return cmd.response(code, remark)


async def _drop_answer(outcome: Awaitable[tuple[int, str | None]]) -> None:
    await outcome


@dataclass(slots=True)
class _Decision:
    """A decision waiting for its op marker (and, for a COMMIT, its copy) to be stored."""

    phys: int
    queue_offset: int
    uniq_key: str | None
    decision: str
    by: str
    copy: MessageRecord | None  # the committed copy, or None for a ROLLBACK
    outcome: asyncio.Future[tuple[int, str | None]] | None  # None: nobody waits (a oneway END_TRANSACTION)
    release: bool  # settling it ends the half message's turn in _inflight
    rec: TransactionRecord | None
    msg_id: str
    group: str


@dataclass(slots=True)
class _Target:
    phys: int
    queue_offset: int
    uniq_key: str | None
    topic: str | None  # REAL_TOPIC


def _name(rec: TransactionRecord) -> str:
    return rec.transaction_id or rec.uniq_key or rec.half_msg_id
