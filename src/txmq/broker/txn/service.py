"""The transaction driver: it feeds the :class:`~txmq.txn.table.TransactionTable` its inputs and carries out the
effects it returns, with the store, the check journal and the producers' connections.

* **prepare**: the half message is stored; once stored, the table holds it as fresh.
* **decide**: the table validates a COMMIT or ROLLBACK (from any door, or an operator) against the half message,
  which the driver reads when the table no longer holds it; the decision is stored by the :class:`DecisionWriter`
  (one append per event-loop turn), one decision at a time per half message (:class:`Turns`).
* **checks**: a loop asks the table what is due each tick, sends checks through :class:`ProducerChecks` (any
  live producer of the group, whichever door), and discards what reached ``transactionCheckMax``.
* **start**: the store's half and op queues and the journal are read (:class:`StoreLookups`, :class:`JournalFile`),
  the table is loaded, and commits whose marker was lost in a crash are repaired.

The on-disk model, the crash-safety argument and the history are in ``docs/transactions.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.txn.checker import Checker
from txmq.broker.txn.decide import Decider
from txmq.broker.txn.journal_file import JournalFile
from txmq.broker.txn.lookups import StoreLookups
from txmq.broker.txn.ops import StoreOps
from txmq.broker.txn.producers import ProducerChecks
from txmq.broker.txn.writer import Answer, DecisionWriter, Turns, marker_stored
from txmq.protocol.codes import ResponseCode
from txmq.protocol.op_marker import PROP_BY, RESUME_TAG
from txmq.protocol.record import MessageRecord, Prop, encode_offset_msg_id
from txmq.protocol.topics import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
)
from txmq.txn import records
from txmq.txn.effects import DecisionRequest
from txmq.txn.history import TransactionRecord
from txmq.txn.model import By, Decision, TxState
from txmq.txn.table import (
    DEFAULT_DECIDED_MAX,
    DEFAULT_HISTORY_MAX,
    DEFAULT_MAX_MESSAGES,
    TransactionTable,
    TxSettings,
)

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.schedule import ScheduleService
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")

NOT_RUNNING = "[TXMQ] the transaction service is not running"
MAX_MESSAGES_LIMIT = 1_000  # transactionMaxMessages at most: one op marker holds every decision of a transaction


def settings_of(config: BrokerConfig) -> TxSettings:
    extra = getattr(config, "extra", None) or {}

    def number(key: str, default: int) -> int:
        raw = extra.get(key)
        if raw is None:
            return default
        try:
            return max(0, int(str(raw).strip()))
        except ValueError:
            log.error("broker.conf %s=%r is not an integer; using %d", key, raw, default)
            return default

    return TxSettings(
        timeout_ms=config.transaction_time_out,
        check_interval_ms=config.transaction_check_interval,
        check_max=config.transaction_check_max,
        reserved_ms=config.file_reserved_time * 3_600_000,
        history_max=number("transactionHistoryMax", DEFAULT_HISTORY_MAX),
        decided_max=number("transactionDecidedMax", DEFAULT_DECIDED_MAX),
        resolution_window=number("transactionResolutionWindow", 1_000),
        max_messages=max(1, min(number("transactionMaxMessages", DEFAULT_MAX_MESSAGES), MAX_MESSAGES_LIMIT)),
    )


class TransactionService:
    """The broker's transactional-message driver; ``broker.transactions``."""

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
        self.table = TransactionTable(settings_of(config), store_host)
        self.lookups = StoreLookups(store, self.table)
        self._topics = topics
        self.journal = JournalFile(Path(config.store_path_root_dir) / "config")
        self.producers = ProducerChecks(clients)
        self.turns = Turns()
        self.ops = StoreOps(
            store=store,
            clock=clock,
            store_host=store_host,
            topics=topics,
            schedule=schedule,
            topic_changed=topic_changed,
        )
        self.writer = DecisionWriter(store, self.table, clock.now_ms, store_host, self.ops.op_topic_ready)
        self.decider = Decider(self.table, store, self.lookups, self.ops, self.writer, self.turns, clock)
        self.checker = Checker(
            table=self.table,
            ops=self.ops,
            clock=clock,
            producers=self.producers,
            journal=self.journal,
            rewrite_journal=self._rewrite_journal,
            offsets=offsets,
        )
        self._task: asyncio.Task[None] | None = None
        self._waiting: set[asyncio.Future[Answer]] = set()  # oneway decisions waiting for their turn
        self._ready = False

    # -- life cycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.rebuild()
        self.store.add_retention_guard(self.table.retention_guard)
        self._ready = True
        self._task = asyncio.create_task(self._check_loop(), name="broker-transaction-checks")

    async def close(self) -> None:
        self._ready = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.journal.flush()

    @property
    def busy(self) -> bool:
        """A decision is being stored, or waits for the next append."""
        return bool(len(self.turns)) or not self.writer.idle

    def retention_guard(self) -> int:
        return self.table.retention_guard()

    @property
    def pending(self) -> dict[int, TransactionRecord]:
        """Every in-doubt transaction, by half commit-log offset (fresh ones get their record)."""
        return self.table.pending()

    def pending_transactions(self) -> list[dict[str, Any]]:
        now = self.clock.now_ms()
        return [p.status(now) for p in sorted(self.pending.values(), key=lambda p: p.phys)]

    def counter_values(self) -> dict[str, int]:
        """The ``tx.*`` counters (GET_BROKER_RUNTIME_INFO and TXMQ_TRANSACTION_COUNTERS)."""
        return self.table.counter_values()

    def find(self, ident: str) -> TransactionRecord | None:
        return self.lookups.find(ident)

    def members(self, rec: TransactionRecord) -> list[TransactionRecord]:
        """Every message of ``rec``'s transaction this broker can show, in order (``[rec]`` for one message)."""
        if not rec.tx_id:
            return [rec]
        held = self.table.history.members(rec.tx_id)
        return held if held else [rec]

    def list_in_doubt(self, **filters: Any) -> tuple[int, list[TransactionRecord]]:
        """Transactions by state (PREPARED and DISCARDED unless ``states`` says otherwise), group, topic and age;
        a resolved one decided while fresh has no record in memory, and is rebuilt from its half message."""
        states = filters.get("states")
        light = [] if states is None else [self.lookups.record_at(phys) for phys in self.table.light_in(states)]
        return self.table.list_in_doubt(self.clock.now_ms(), also=[r for r in light if r is not None], **filters)

    # -- start -----------------------------------------------------------------------------------------------------

    async def rebuild(self) -> None:
        """Load the table from the half and op queues plus the journal, then repair half-done commits."""
        journal = await asyncio.to_thread(self.journal.load)
        loaded, decided = await asyncio.to_thread(self.lookups.scan)
        table = self.table
        table.load(loaded, decided, journal)
        repaired = 0
        for entry in list(table.pending_records.values()):
            if table.lead_of(entry) is not entry:
                continue  # a later message of a transaction of several: repaired with its first
            try:
                repaired += await self._roll_forward(table.members_of(entry))
            except Exception:
                log.exception("checking half message at %d for a committed copy failed", entry.phys)
        if repaired:
            log.warning("%d committed transaction(s) lacked their op marker (crash after commit): written", repaired)
        await self._rewrite_journal()
        log.info(
            "transactions: %d pending, %d decided, %d in history",
            len(table.pending_records),
            len(table.decided),
            len(table.history),
        )

    async def _roll_forward(self, members: list[TransactionRecord]) -> int:
        """When any message of a transaction has a committed copy (a crash after its COMMIT's copies, before its
        marker), the COMMIT is finished: the missing copies, then the marker. Returns 1 when it was."""
        found = {m.phys: self.lookups.find_committed_copy(m) for m in members}
        if all(phys is None for phys in found.values()):
            return 0
        missing = [m for m in members if found[m.phys] is None]
        copies = []
        for m in missing:
            half = self.ops.read_half(m.phys, m.size)
            copy = None if half is None else self.ops.commit_copy(half)
            if not isinstance(copy, MessageRecord):
                raise ValueError(f"the committed copy of the half message at {m.phys} cannot be made: {copy}")
            copies.append(copy)
        if copies:
            results = await self.store.put_many(copies)
            if not all(r.ok for r in results):
                raise OSError(f"storing the missing committed copies failed: {results}")
            found.update((m.phys, r.physical_offset) for m, r in zip(missing, results, strict=True))
        ids = {phys: encode_offset_msg_id(self.store_host, copy) for phys, copy in found.items() if copy is not None}
        await self.ops.write_op(
            [(m.queue_offset, m.phys, Decision.COMMIT, By.RECOVERY, ids[m.phys], m.uniq_key) for m in members]
        )
        now = self.clock.now_ms()
        for m in members:
            self.table.recovered(m, ids[m.phys], now)
        return 1

    async def _rewrite_journal(self) -> None:
        await self.journal.rewrite((rec.phys, rec.check_log) for rec in self.table.history)

    # -- prepare ---------------------------------------------------------------------------------------------------

    def prepare(self, record: MessageRecord) -> asyncio.Future[Any]:
        """Store ``record`` (a prepare with its producer group) as a half message: a future of the store's put
        result; once stored, the transaction is in doubt. Raises :class:`BrokerRefusal`. (The 4.x door calls
        :meth:`admit` and :meth:`half_stored` itself, to answer in the same callback.)"""
        half = self.admit(record)
        stored = self.store.put_future(half)

        def prepared(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None and done.result().ok:
                self.half_stored(half, done.result())

        stored.add_done_callback(prepared)  # before the door's own callback: the answer comes after this
        return stored

    def admit(self, record: MessageRecord) -> MessageRecord:
        """``record`` (a prepare with its producer group) made the half message to store, or
        :class:`BrokerRefusal`; once the store has it, :meth:`half_stored`."""
        if not self._ready:
            raise BrokerRefusal(ResponseCode.SYSTEM_BUSY, NOT_RUNNING)
        limit = self.config.max_pending_transactions
        table = self.table
        in_doubt = len(table.pending_records) + len(table.fresh)
        if in_doubt >= limit:
            raise BrokerRefusal(
                ResponseCode.SYSTEM_BUSY,
                f"[TXMQ] too many in-doubt transactions on broker {self.config.broker_name}: "
                f"{in_doubt} pending, limit maxPendingTransactions={limit}; "
                "commit or roll back pending transactions, or retry later",
            )
        if Prop.TX_ID in record.properties:  # a message of a transaction of several
            refusal = table.may_join(record)
            if refusal is not None:
                raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, refusal)
        half = records.make_half(record)
        if TRANS_HALF_TOPIC not in self._topics.topics:
            self.ops.ensure(TRANS_HALF_TOPIC)
        return half

    def half_stored(self, half: MessageRecord, result: Any) -> None:
        """The store has ``half`` (``result`` is a stored one): the transaction is in doubt."""
        self.table.half_stored(half, result)

    # -- decisions -------------------------------------------------------------------------------------------------

    def decide(self, req: DecisionRequest) -> Answer | asyncio.Future[Answer]:
        """Apply a COMMIT or ROLLBACK: (code, remark) when settled at once, else a future of it (the store write; no
        task, when no other decision about the same half message is in progress)."""
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, NOT_RUNNING
        if not self.turns.take(req.phys):
            return asyncio.ensure_future(self._in_turn(req))
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        return self.decider.submit(req, answer)

    def decide_oneway(self, req: DecisionRequest) -> None:
        """Apply a decision nobody waits for (a oneway END_TRANSACTION, as real clients send it): a failure to store
        it is logged."""
        if not self._ready:
            log.warning("END_TRANSACTION %s dropped: %s", req.msg_id, NOT_RUNNING)
            return
        if not self.turns.take(req.phys):
            task = asyncio.ensure_future(self._in_turn(req))
            self._waiting.add(task)
            task.add_done_callback(self._waited)
            return
        self.decider.submit(req, None)

    def _waited(self, task: asyncio.Future[Answer]) -> None:
        self._waiting.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a oneway END_TRANSACTION failed", exc_info=exc)

    async def _in_turn(self, req: DecisionRequest) -> Answer:
        await self.turns.wait_and_take(req.phys)
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        outcome = self.decider.submit(req, answer)
        return outcome if isinstance(outcome, tuple) else await outcome

    def note_answer(self, phys: int, group: str, answer: str) -> None:
        """A producer's answer to a check (COMMIT, ROLLBACK or UNKNOWN), for the transaction's history."""
        line = self.table.note_answer(phys, group, answer, self.clock.now_ms())
        if line is not None:
            self.journal.add(line.line)

    # -- operator control ------------------------------------------------------------------------------------------

    async def operator_resolve(self, rec: TransactionRecord, decision: str) -> Answer:
        """Commit or roll back ``rec`` by hand: the END_TRANSACTION path, refused once anything decided it."""
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, NOT_RUNNING
        rec = self.table.lead_of(rec)  # a transaction of several messages is decided through its first
        req = DecisionRequest(
            rec.phys,
            Decision(decision),
            By.OPERATOR,
            rec.group,
            rec.queue_offset,
            rec.uniq_key or rec.half_msg_id,
            origin="operator",
        )
        await self.turns.wait_and_take(rec.phys)
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        outcome = self.decider.submit(req, answer)
        return outcome if isinstance(outcome, tuple) else await outcome

    async def resume(self, rec: TransactionRecord) -> Answer:
        """Put a DISCARDED transaction back in the pending table; its checks start again from zero."""
        if not self._ready:
            return ResponseCode.SYSTEM_BUSY, NOT_RUNNING
        await self.turns.wait_and_take(rec.phys)
        try:
            return await self._resume(rec.phys)
        finally:
            self.turns.release(rec.phys)

    async def _resume(self, phys: int) -> Answer:
        rec = self.lookups.record_at(phys)
        if rec is None:
            return ResponseCode.TRANSACTION_FAILED, (
                f"[TXMQ] transaction {phys} is unknown; only a DISCARDED transaction can be resumed"
            )
        refusal = self.table.may_resume(rec)
        if refusal is not None:
            return refusal.code, refusal.remark
        members = [rec]
        if rec.tx_id:  # a transaction of several messages is resumed whole
            members = [m for m in self.table.history.members(rec.tx_id) if m.state is TxState.DISCARDED] or [rec]
        for m in members:
            if self.ops.read_half(m.phys, m.size) is None:
                return ResponseCode.SYSTEM_ERROR, (
                    f"[TXMQ] the half message of transaction {m.name} at commit-log offset {m.phys} is no longer "
                    f"stored (retention); its copy stays in {TRANS_CHECK_MAX_TIME_TOPIC} as {m.discarded_msg_id}"
                )
        self.ops.op_topic_ready()
        now = self.clock.now_ms()
        marks = [
            records.note_marker(
                m.phys, m.queue_offset, m.uniq_key, RESUME_TAG, {PROP_BY: By.OPERATOR}, now, self.store_host
            )
            for m in members
        ]
        results = await self.store.put_many(marks)
        if not all(marker_stored(r, RESUME_TAG, "", m.phys) for r, m in zip(results, members, strict=True)):
            return ResponseCode.SYSTEM_ERROR, "[TXMQ] storing the resume record failed; nothing changed"
        self.table.resumed(members, self.clock.now_ms())
        log.warning("transaction %s of group %s resumed by an operator; checks start again", rec.name, rec.group)
        return ResponseCode.SUCCESS, None

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
        return await self.checker.round(self.turns)
