"""Transactional messages, broker side: prepare, END_TRANSACTION, and the check service.

On disk this is RocketMQ's model (wire reference §4): a prepare is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with
``REAL_TOPIC``/``REAL_QID`` added and the sysFlag transaction bits cleared; a decision writes an op marker to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (same queue id, tag ``d``, body = decimal half queue offset, new UNIQ_KEY, born and
store host = the broker). A COMMIT first re-puts the message to its real topic and queue (sysFlag COMMIT, PREPARED TX
OFFSET = half commit-log offset, ``REAL_TOPIC``/``REAL_QID``/``TRAN_MSG`` removed). txmq's op markers also carry two
extra properties, ``TXMQ_DECISION`` (COMMIT, ROLLBACK or DISCARD) and ``TXMQ_HALF_PHYS`` (the half commit-log offset);
a RocketMQ reader ignores them, and markers without them (written by RocketMQ) still remove their half message.

In memory (rebuilt at start by scanning the half and op queues from their minimum offsets):

* the **pending table**, half commit-log offset -> :class:`PendingTransaction`, for half messages with no op marker;
* the **decided map**, half commit-log offset -> decision. The first decision wins: a repeated COMMIT or ROLLBACK is
  answered with success and does nothing (a COMMIT is never delivered twice); a conflicting one is refused with
  SYSTEM_ERROR and logged. DISCARD (the check limit was reached) is not a decision: a later COMMIT or ROLLBACK from the
  producer is still applied. Concurrent END_TRANSACTIONs for one half message are serialised.

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

Crash safety of COMMIT: the real-topic copy is stored before the op marker. If the broker dies in between, the start-up
rebuild finds the half message pending and, before scheduling any check, looks for an existing committed copy: via the
store's key index (``query_by_key(REAL_TOPIC, UNIQ_KEY)``; without a UNIQ_KEY, by scanning the tail of the real queue)
for a COMMIT-type record whose PREPARED TX OFFSET is the half commit-log offset. When found, the missing COMMIT marker
is written and the transaction is recorded as committed, so it is neither checked nor delivered again.

Segments that hold pending half messages are protected from retention by a guard (lowest pending half offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.topics import (
    PERM_READ,
    PERM_WRITE,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from txmq.errors import ProtocolError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.record import (
    MessageRecord,
    Prop,
    TransactionType,
    UniqKeyGenerator,
    encode_offset_msg_id,
    encode_record,
    with_transaction_type,
)
from txmq.util import atomic_write_json

if TYPE_CHECKING:
    from txmq.broker.broker import Broker

log = logging.getLogger("txmq.broker.transactions")

OP_TAG = "d"
SYS_TRANS_GROUP = "CID_RMQ_SYS_TRANS"
PROP_DECISION = "TXMQ_DECISION"
PROP_HALF_PHYS = "TXMQ_HALF_PHYS"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
DISCARD = "DISCARD"
UNKNOWN = "UNKNOWN"  # an op marker without a recorded decision (written by RocketMQ)
_DECISIONS = {int(TransactionType.COMMIT): COMMIT, int(TransactionType.ROLLBACK): ROLLBACK}
_SCAN_CHUNK = 1024
_TAIL_SCAN = 1024  # real-queue entries searched for a committed copy when the half message has no UNIQ_KEY
_NO_GUARD = 2**63 - 1


@dataclass(slots=True)
class PendingTransaction:
    """One in-doubt transaction: a half message with no op marker."""

    phys: int  # half commit-log offset
    size: int
    queue_offset: int  # half queue offset (tranStateTableOffset)
    group: str
    topic: str  # REAL_TOPIC
    uniq_key: str | None
    born_ms: int
    first_due_ms: int
    checks: int = 0
    last_check_ms: int = 0
    due_ms: int = 0
    waiting_for_producer: bool = False

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


class TransactionService:
    """The broker's transactional-message service; ``broker.transactions``."""

    tick_seconds = 1.0

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.clock = broker.clock
        self.pending: dict[int, PendingTransaction] = {}
        self.decided: dict[int, str] = {}
        self._heap: list[tuple[int, int, int]] = []  # (due_ms, seq, half phys)
        self._seq = itertools.count()
        self._inflight: dict[int, asyncio.Future[None]] = {}
        self._uniq = UniqKeyGenerator(broker.config.advertised_ip)
        self._checks_path = Path(broker.config.store_path_root_dir) / "config" / "transactionChecks.json"
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._ready = False
        self.rounds = 0  # completed check rounds (for observers and tests)
        self.idle = asyncio.Event()  # set while the check loop sleeps between rounds

    # -- life cycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        store = self.broker.store
        assert store is not None
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
        self._persist_checks(force=True)

    def retention_guard(self) -> int:
        """The lowest half commit-log offset still pending (retention keeps its segment)."""
        return min(list(self.pending), default=_NO_GUARD)

    def pending_transactions(self) -> list[dict[str, Any]]:
        now = self.clock.now_ms()
        return [p.status(now) for p in sorted(self.pending.values(), key=lambda p: p.phys)]

    # -- rebuild ---------------------------------------------------------------------------------------------------

    async def rebuild(self) -> None:
        """Rebuild the pending table and the decided map from the half and op queues, then repair half-done commits."""
        saved = self._load_checks()
        scanned = await asyncio.to_thread(self._scan)
        pending, decided = scanned
        self.pending.clear()
        self.decided = decided
        self._heap.clear()
        for entry in pending:
            state = saved.get(entry.phys)
            if state is not None:
                entry.checks, entry.last_check_ms = state
            entry.due_ms = (
                entry.last_check_ms + self.config.transaction_check_interval if entry.checks else entry.first_due_ms
            )
            self._add_pending(entry)
        repaired = 0
        for entry in list(self.pending.values()):
            try:
                if self._find_committed_copy(entry) is not None:
                    await self._write_op(entry.phys, entry.queue_offset, COMMIT)
                    self.decided[entry.phys] = COMMIT
                    self.pending.pop(entry.phys, None)
                    repaired += 1
            except Exception:
                log.exception("checking half message at %d for a committed copy failed", entry.phys)
        if repaired:
            log.warning("%d committed transaction(s) lacked their op marker (crash after commit): written", repaired)
        log.info("transactions: %d pending, %d decided", len(self.pending), len(self.decided))

    def _scan(self) -> tuple[list[PendingTransaction], dict[int, str]]:
        store = self.broker.store
        assert store is not None
        half_entries: dict[int, tuple[int, int]] = {}  # half queue offset -> (phys, size)
        offset = store.min_offset(TRANS_HALF_TOPIC, 0)
        while True:
            entries = store.read_consume_queue(TRANS_HALF_TOPIC, 0, offset, _SCAN_CHUNK)
            if not entries:
                break
            for phys, size, _code in entries:
                half_entries[offset] = (phys, size)
                offset += 1
        removed: dict[int, str] = {}  # half queue offset -> decision
        decided: dict[int, str] = {}
        offset = store.min_offset(TRANS_OP_HALF_TOPIC, 0)
        while True:
            entries = store.read_consume_queue(TRANS_OP_HALF_TOPIC, 0, offset, _SCAN_CHUNK)
            if not entries:
                break
            for phys, size, _code in entries:
                offset += 1
                try:
                    op = store.read_message(phys, size)
                except Exception as exc:
                    log.error("unreadable transaction op record at %d: %s", phys, exc)
                    continue
                if op is None or op.tags != OP_TAG:
                    continue
                try:
                    half_offset = int(op.body.decode("ascii"))
                except (UnicodeDecodeError, ValueError):
                    log.error("transaction op record at %d has a malformed body %r", phys, op.body[:40])
                    continue
                decision = op.properties.get(PROP_DECISION, UNKNOWN)
                half_phys_text = op.properties.get(PROP_HALF_PHYS)
                half_phys = int(half_phys_text) if half_phys_text and half_phys_text.isdigit() else None
                if half_phys is None and half_offset in half_entries:
                    half_phys = half_entries[half_offset][0]
                previous = removed.get(half_offset)
                if previous is None or previous == DISCARD:
                    removed[half_offset] = decision
                    if half_phys is not None:
                        decided[half_phys] = decision
        pending: list[PendingTransaction] = []
        for half_offset, (phys, size) in half_entries.items():
            if half_offset in removed:
                continue
            try:
                record = store.read_message(phys, size)
            except Exception as exc:
                log.error("unreadable half message at %d (queue offset %d): %s; skipped", phys, half_offset, exc)
                continue
            if record is None:
                continue
            entry = self._pending_from(record)
            if entry is None:
                log.error("half message at %d has no REAL_TOPIC/REAL_QID/PGROUP; skipped", phys)
                continue
            pending.append(entry)
        return pending, decided

    def _pending_from(self, record: MessageRecord) -> PendingTransaction | None:
        props = record.properties
        group = props.get(Prop.PGROUP)
        topic = props.get(Prop.REAL_TOPIC)
        if not group or not topic or not props.get(Prop.REAL_QID, "").lstrip("-").isdigit():
            return None
        base = record.born_timestamp
        if record.store_timestamp and base > record.store_timestamp:
            base = record.store_timestamp  # a producer clock ahead of ours: do not postpone its checks
        immunity = self.config.transaction_time_out
        raw = props.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS)
        if raw:
            try:
                seconds = int(raw)
            except ValueError:
                seconds = -1
            if seconds >= 0:
                immunity = seconds * 1000
        return PendingTransaction(
            phys=record.physical_offset,
            size=record.store_size,
            queue_offset=record.queue_offset,
            group=group,
            topic=topic,
            uniq_key=props.get(Prop.UNIQ_KEY),
            born_ms=record.born_timestamp,
            first_due_ms=base + immunity,
        )

    def _find_committed_copy(self, entry: PendingTransaction) -> int | None:
        store = self.broker.store
        assert store is not None
        record = store.read_message(entry.phys, entry.size)
        if record is None:
            return None
        candidates: list[int] = []
        if entry.uniq_key:
            candidates = store.query_by_key(entry.topic, entry.uniq_key, 64)
        else:
            qid = int(record.properties.get(Prop.REAL_QID, "0"))
            end = store.max_offset(entry.topic, qid)
            start = max(store.min_offset(entry.topic, qid), end - _TAIL_SCAN)
            candidates = [p for p, _s, _c in store.read_consume_queue(entry.topic, qid, start, end - start)]
        for phys in candidates:
            if phys <= entry.phys:
                continue
            copy = store.read_message(phys)
            if (
                copy is not None
                and copy.prepared_transaction_offset == entry.phys
                and copy.transaction_type == TransactionType.COMMIT
            ):
                return phys
        return None

    # -- pending table ---------------------------------------------------------------------------------------------

    def _add_pending(self, entry: PendingTransaction) -> None:
        self.pending[entry.phys] = entry
        heapq.heappush(self._heap, (entry.due_ms, next(self._seq), entry.phys))

    def _reschedule(self, entry: PendingTransaction, due_ms: int) -> None:
        entry.due_ms = due_ms
        heapq.heappush(self._heap, (due_ms, next(self._seq), entry.phys))

    def _load_checks(self) -> dict[int, tuple[int, int]]:
        try:
            raw = orjson.loads(self._checks_path.read_bytes())
            return {int(k): (int(v[0]), int(v[1])) for k, v in raw.get("checks", {}).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError, IndexError) as exc:
            log.error("transaction check counts %s are unreadable (%s); checks start over", self._checks_path, exc)
            return {}

    def _checks_snapshot(self) -> dict[str, Any]:
        return {"checks": {str(p.phys): [p.checks, p.last_check_ms] for p in list(self.pending.values()) if p.checks}}

    def _persist_checks(self, *, force: bool = False) -> None:
        if not (self._dirty or force):
            return
        try:
            atomic_write_json(self._checks_path, self._checks_snapshot())
            self._dirty = False
        except OSError as exc:
            log.error("persisting transaction check counts failed: %s", exc)

    # -- prepare ---------------------------------------------------------------------------------------------------

    async def prepare(self, cmd: RemotingCommand, record: MessageRecord, queue_id: int) -> RemotingCommand:
        broker = self.broker
        if self.config.reject_transaction_message:
            return cmd.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self.config.broker_name}] sending transaction message is forbidden "
                "(rejectTransactionMessage=true)",
            )
        if not self._ready:
            return cmd.response(ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running")
        limit = self.config.max_pending_transactions
        if len(self.pending) >= limit:
            return cmd.response(
                ResponseCode.SYSTEM_BUSY,
                f"[TXMQ] too many in-doubt transactions on broker {self.config.broker_name}: "
                f"{len(self.pending)} pending, limit maxPendingTransactions={limit}; "
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
        record.sys_flag = with_transaction_type(record.sys_flag, TransactionType.NOT_TYPE)
        if broker.topics.ensure(TRANS_HALF_TOPIC, 1, PERM_READ | PERM_WRITE)[1]:
            broker.topic_changed()
        assert broker.store is not None
        result = await broker.store.put(record)
        if result.ok:
            record.physical_offset = result.physical_offset
            record.queue_offset = result.queue_offset
            record.store_timestamp = result.store_timestamp
            record.store_size = result.size
            entry = self._pending_from(record)
            if entry is not None:
                entry.due_ms = entry.first_due_ms
                self._add_pending(entry)
            else:
                log.warning("half message at %d has no producer group; it cannot be checked", result.physical_offset)
        return broker.send_processor._response(cmd, result, queue_id)

    # -- END_TRANSACTION -------------------------------------------------------------------------------------------

    async def end_transaction(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
        response = await self._end_transaction(conn, cmd)
        if cmd.is_oneway:
            return None
        return response

    async def _end_transaction(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        peer = getattr(conn, "peer", None)
        try:
            header = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            log.warning("END_TRANSACTION from %s is malformed: %s", peer, exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        decision = _DECISIONS.get(header.commitOrRollback)
        if decision is None:
            if header.commitOrRollback != 0:
                log.warning(
                    "END_TRANSACTION from %s for %s with commitOrRollback=%d ignored",
                    peer,
                    header.msgId,
                    header.commitOrRollback,
                )
            return cmd.response(ResponseCode.SUCCESS, "transaction state unknown; the broker will check it later")
        if not self._ready:
            return cmd.response(ResponseCode.SYSTEM_BUSY, "[TXMQ] the transaction service is not running")
        phys = header.commitLogOffset
        while (busy := self._inflight.get(phys)) is not None:
            await asyncio.shield(busy)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[phys] = done
        try:
            return await self._decide(cmd, header, decision, peer)
        finally:
            self._inflight.pop(phys, None)
            done.set_result(None)

    async def _decide(
        self, cmd: RemotingCommand, header: EndTransactionRequestHeader, decision: str, peer: Any
    ) -> RemotingCommand:
        store = self.broker.store
        assert store is not None
        phys = header.commitLogOffset
        try:
            half = store.read_message(phys)
        except Exception as exc:
            log.warning("END_TRANSACTION %s at commit-log offset %d: record unreadable: %s", header.msgId, phys, exc)
            half = None
        if half is None or half.topic != TRANS_HALF_TOPIC:
            log.warning(
                "END_TRANSACTION %s from %s: no prepared message at commit-log offset %d", header.msgId, peer, phys
            )
            return cmd.response(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        problem = None
        if half.properties.get(Prop.PGROUP) != header.producerGroup:
            problem = "The producer group wrong"
        elif half.queue_offset != header.tranStateTableOffset:
            problem = "The transaction state table offset wrong"
        elif half.physical_offset != phys:
            problem = "The commit log offset wrong"
        if problem is not None:
            log.warning(
                "END_TRANSACTION %s from %s refused: %s (group %s, tranStateTableOffset %d, commitLogOffset %d)",
                header.msgId,
                peer,
                problem,
                header.producerGroup,
                header.tranStateTableOffset,
                phys,
            )
            return cmd.response(ResponseCode.SYSTEM_ERROR, problem)
        earlier = self.decided.get(phys)
        if earlier == decision:
            log.info("END_TRANSACTION %s: repeated %s ignored (already applied)", header.msgId, decision)
            return cmd.response(ResponseCode.SUCCESS, f"[TXMQ] transaction already {decision.lower()}ed; nothing done")
        if earlier is not None and earlier != DISCARD:
            log.warning(
                "END_TRANSACTION %s from %s: %s refused, the transaction was already decided as %s",
                header.msgId,
                peer,
                decision,
                earlier,
            )
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"[TXMQ] transaction {header.msgId} was already decided as {earlier}; {decision} refused",
            )
        if decision == COMMIT:
            error = await self._put_commit(half, cmd)
            if error is not None:
                return error
        self.decided[phys] = decision
        self.pending.pop(phys, None)
        self._dirty = True
        await self._write_op(phys, half.queue_offset, decision)
        return cmd.response(ResponseCode.SUCCESS)

    def _commit_record(self, half: MessageRecord) -> MessageRecord:
        props = dict(half.properties)
        topic = props.pop(Prop.REAL_TOPIC)
        queue_id = int(props.pop(Prop.REAL_QID))
        props.pop(Prop.TRAN_MSG, None)
        return MessageRecord(
            topic=topic,
            body=half.body,
            queue_id=queue_id,
            flag=half.flag,
            sys_flag=with_transaction_type(half.sys_flag, TransactionType.COMMIT),
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=self.broker.store_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.physical_offset,
            properties=props,
        )

    async def _put_commit(self, half: MessageRecord, cmd: RemotingCommand) -> RemotingCommand | None:
        """Store the committed copy; returns an error response, or None when it is stored."""
        from txmq.broker.send import SendError

        try:
            record = self._commit_record(half)
        except (KeyError, ValueError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the prepared message lacks its real topic/queue: {exc}")
        delay = record.properties.get(Prop.DELAY)
        if delay and delay != "0":
            try:
                record = self.broker.schedule.redirect(record, delay)
            except SendError as exc:
                return cmd.response(exc.code, exc.remark)
        assert self.broker.store is not None
        result = await self.broker.store.put(record)
        code = self.broker.put_status_code(result)
        if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
            log.error("committing half message at %d failed: %s", half.physical_offset, result)
            return cmd.response(code, f"storing the committed message failed: {result.status.value}")
        return None

    async def _write_op(self, half_phys: int, half_queue_offset: int, decision: str) -> bool:
        broker = self.broker
        assert broker.store is not None
        if broker.topics.ensure(TRANS_OP_HALF_TOPIC, 1, PERM_READ | PERM_WRITE)[1]:
            broker.topic_changed()
        now = self.clock.now_ms()
        record = MessageRecord(
            topic=TRANS_OP_HALF_TOPIC,
            body=str(half_queue_offset).encode("ascii"),
            queue_id=0,
            born_timestamp=now,
            born_host=broker.store_host,
            store_host=broker.store_host,
            properties={
                Prop.TAGS: OP_TAG,
                Prop.UNIQ_KEY: self._uniq.next(now),
                PROP_DECISION: decision,
                PROP_HALF_PHYS: str(half_phys),
            },
        )
        result = await broker.store.put(record)
        if not result.ok:
            log.error(
                "writing the %s op marker for half message %d failed: %s (a restart re-derives it)",
                decision,
                half_phys,
                result,
            )
            return False
        return True

    # -- checks ----------------------------------------------------------------------------------------------------

    async def _check_loop(self) -> None:
        while True:
            self.idle.set()
            await self.clock.sleep(self.tick_seconds)
            self.idle.clear()
            try:
                await self.check_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check round failed; retrying next tick")

    async def check_round(self) -> int:
        """Check (or discard) every pending transaction that is due; returns how many checks were sent."""
        now = self.clock.now_ms()
        due: list[PendingTransaction] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due_ms, _seq, phys = heapq.heappop(heap)
            entry = self.pending.get(phys)
            if entry is not None and entry.due_ms == due_ms and phys not in self._inflight:
                due.append(entry)
        sent = 0
        interval = self.config.transaction_check_interval
        for entry in due:
            if self.pending.get(entry.phys) is not entry:
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
                if self.pending.get(entry.phys) is entry:
                    self._reschedule(entry, now + interval)
        if self._dirty:
            snapshot = self._checks_snapshot()
            try:
                await asyncio.to_thread(atomic_write_json, self._checks_path, snapshot)
                self._dirty = False
            except OSError as exc:
                log.error("persisting transaction check counts failed: %s", exc)
        self._commit_progress()
        self.rounds += 1
        return sent

    def _too_old(self, entry: PendingTransaction, now: int) -> bool:
        return now - entry.born_ms > self.config.file_reserved_time * 3_600_000

    def _commit_progress(self) -> None:
        """Record RocketMQ's consumed offsets of the half and op queues for CID_RMQ_SYS_TRANS (for admin tools)."""
        store = self.broker.store
        if store is None:
            return
        lowest = min((p.queue_offset for p in list(self.pending.values())), default=None)
        half_end = store.max_offset(TRANS_HALF_TOPIC, 0)
        if half_end:
            self.broker.offsets.commit(SYS_TRANS_GROUP, TRANS_HALF_TOPIC, 0, half_end if lowest is None else lowest)
        op_end = store.max_offset(TRANS_OP_HALF_TOPIC, 0)
        if op_end:
            self.broker.offsets.commit(SYS_TRANS_GROUP, TRANS_OP_HALF_TOPIC, 0, op_end)

    def _send_check(self, entry: PendingTransaction, now: int) -> bool:
        """Send CHECK_TRANSACTION_STATE to a live producer of the group; True when it went out (and so counts)."""
        store = self.broker.store
        assert store is not None
        channel = self.broker.clients.pick_producer(entry.group, lambda c: not getattr(c, "closed", False))
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
        self._dirty = True
        log.debug("checked transaction %s (%d) with %s", entry.uniq_key, entry.checks, channel.client_id)
        return True

    async def _discard(self, entry: PendingTransaction) -> None:
        broker = self.broker
        store = broker.store
        assert store is not None
        half = store.read_message(entry.phys, entry.size)
        if half is None:
            raise ValueError(f"no half message at commit-log offset {entry.phys}")
        if broker.topics.ensure(TRANS_CHECK_MAX_TIME_TOPIC, 1, PERM_READ | PERM_WRITE)[1]:
            broker.topic_changed()
        copy = MessageRecord(
            topic=TRANS_CHECK_MAX_TIME_TOPIC,
            body=half.body,
            queue_id=0,
            flag=half.flag,
            sys_flag=with_transaction_type(half.sys_flag, TransactionType.NOT_TYPE),
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=broker.store_host,
            reconsume_times=half.reconsume_times,
            properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(entry.checks)},
        )
        result = await store.put(copy)
        if not result.ok:
            raise OSError(f"copying to {TRANS_CHECK_MAX_TIME_TOPIC} failed: {result}")
        if self.pending.get(entry.phys) is not entry:
            return  # decided while the copy was stored: the decision stands
        self.pending.pop(entry.phys, None)
        self.decided[entry.phys] = DISCARD
        self._dirty = True
        await self._write_op(entry.phys, entry.queue_offset, DISCARD)
        log.warning(
            "transaction %s of group %s unresolved after %d checks: moved to %s",
            entry.uniq_key,
            entry.group,
            entry.checks,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )
