"""The check rounds: what the table says is due is asked of a live producer of the group, or discarded; the journal
gets the checks sent, and RocketMQ's progress offsets of the half and op queues are kept for admin tools."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Container
from typing import TYPE_CHECKING

from txmq.broker.txn.journal_file import JournalFile
from txmq.broker.txn.ops import StoreOps
from txmq.broker.txn.producers import ProducerChecks
from txmq.protocol.record import encode_offset_msg_id
from txmq.protocol.topics import SYS_TRANS_GROUP, TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from txmq.txn import records
from txmq.txn.effects import Discard
from txmq.txn.history import TransactionRecord
from txmq.txn.model import By, Decision
from txmq.txn.table import TransactionTable

if TYPE_CHECKING:
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.clock import Clock

log = logging.getLogger("txmq.broker.transactions")


class Checker:
    def __init__(
        self,
        *,
        table: TransactionTable,
        ops: StoreOps,
        clock: Clock,
        producers: ProducerChecks,
        journal: JournalFile,
        rewrite_journal: Callable[[], Awaitable[None]],
        offsets: ConsumerOffsetManager,
    ) -> None:
        self.table = table
        self.ops = ops
        self.store = ops.store
        self.clock = clock
        self.producers = producers
        self.journal = journal
        self.rewrite_journal = rewrite_journal
        self.offsets = offsets

    async def round(self, busy: Container[int]) -> int:
        """Check (or discard) every pending transaction that is due and not ``busy``; returns the checks sent."""
        now = self.clock.now_ms()
        table = self.table
        sent = 0
        for due in table.due(now, busy):
            rec = due.rec
            if not table.still_pending(rec):
                continue  # decided while this round was running
            try:
                if isinstance(due, Discard):
                    await self._discard(rec)
                elif self._send_check(rec, now):
                    sent += 1
                else:
                    table.check_not_sent(rec, now)
            except Exception:
                log.exception("checking transaction at commit-log offset %d failed; retrying later", rec.phys)
                if table.still_pending(rec):
                    table.reschedule(rec, now + table.settings.check_interval_ms)
        if self.journal.wants_compaction:
            await self.rewrite_journal()
        else:
            await self.journal.flush_async()
        self._commit_progress()
        return sent

    def _send_check(self, rec: TransactionRecord, now: int) -> bool:
        """Send the check to a live producer of the group; True when it went out (and so counts)."""
        half = self.store.read_message(rec.phys, rec.size)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            raise ValueError(f"no half message at commit-log offset {rec.phys}")
        messages = len(self.table.members_of(rec))
        client = self.producers.send(records.check_request(half, rec.group, rec.checks + 1, messages))
        if client is None:
            if not rec.waiting_for_producer:
                log.info("transaction %s waits: no producer of group %s is online", rec.uniq_key, rec.group)
            return False
        self.journal.add(self.table.check_sent(rec, now).line)
        log.debug("checked transaction %s (%d) with %s", rec.uniq_key, rec.checks, client)
        return True

    async def _discard(self, rec: TransactionRecord) -> None:
        """Copy every message of ``rec``'s transaction to TRANS_CHECK_MAX_TIME_TOPIC, then one DISCARD marker."""
        members = self.table.members_of(rec)
        store_host = self.ops.store_host
        copies = []
        for m in members:
            half = self.store.read_message(m.phys, m.size)
            if half is None:
                raise ValueError(f"no half message at commit-log offset {m.phys}")
            copies.append(records.discard_copy(half, rec.checks, store_host))
        self.ops.ensure(TRANS_CHECK_MAX_TIME_TOPIC)
        results = await self.store.put_many(copies)
        if not all(r.ok for r in results):
            raise OSError(f"copying to {TRANS_CHECK_MAX_TIME_TOPIC} failed: {results}")
        copy_ids = {
            m.phys: encode_offset_msg_id(store_host, r.physical_offset) for m, r in zip(members, results, strict=True)
        }
        discarded = self.table.discarding(rec)
        if not discarded:
            return  # decided while the copies were stored: the decision stands
        await self.ops.write_op(
            [(m.queue_offset, m.phys, Decision.DISCARD, By.BROKER, copy_ids.get(m.phys), m.uniq_key) for m in discarded]
        )
        now = self.clock.now_ms()
        for m in discarded:
            self.table.resolve(m, Decision.DISCARD, By.BROKER, copy_ids.get(m.phys), now)
        log.warning(
            "transaction %s of group %s unresolved after %d checks: moved to %s",
            rec.uniq_key,
            rec.group,
            rec.checks,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )

    def _commit_progress(self) -> None:
        """Record RocketMQ's consumed offsets of the half and op queues for CID_RMQ_SYS_TRANS (for admin tools)."""
        store = self.store
        lowest = self.table.lowest_half_queue_offset()
        half_end = store.max_offset(TRANS_HALF_TOPIC, 0)
        if half_end:
            self.offsets.commit(SYS_TRANS_GROUP, TRANS_HALF_TOPIC, 0, half_end if lowest is None else lowest)
        op_end = store.max_offset(TRANS_OP_HALF_TOPIC, 0)
        if op_end:
            self.offsets.commit(SYS_TRANS_GROUP, TRANS_OP_HALF_TOPIC, 0, op_end)
