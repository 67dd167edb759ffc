"""One decision about one half message, from its request to its queued store write: the table's verdict, the half
message read back when the table no longer holds it, a COMMIT's copy (redirected to the schedule topic when
delayed), and the decision queued for the :class:`~txmq.broker.txn.writer.DecisionWriter`. It runs once per
transaction with nothing to wait for, so it is compiled (setup.py); :class:`~txmq.broker.txn.TransactionService`
keeps what waits (a turn held by another decision) and whether the driver runs at all."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from txmq.broker.txn.ops import StoreOps
from txmq.broker.txn.writer import Answer, DecisionWriter, Queued, Turns
from txmq.protocol.codes import ResponseCode
from txmq.txn.effects import DecisionRequest, Reply, StoreDecision
from txmq.txn.model import By, Decision
from txmq.txn.table import TransactionTable

if TYPE_CHECKING:
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")


class Decider:
    def __init__(
        self,
        table: TransactionTable,
        store: MessageStore,
        lookups: Any,
        ops: StoreOps,
        writer: DecisionWriter,
        turns: Turns,
        clock: Clock,
    ) -> None:
        self.table = table
        self.store = store
        self.lookups = lookups
        self.ops = ops
        self.writer = writer
        self.turns = turns
        self.clock = clock

    def submit(self, req: DecisionRequest, answer: asyncio.Future[Answer] | None) -> Answer | asyncio.Future[Answer]:
        """Decide ``req``, whose turn the caller holds; the stored decision (or the answer given at once) ends the
        turn."""
        try:
            queued = self.decide(req)
            if isinstance(queued, Queued):
                queued.answer, queued.holds_turn = answer, self.turns
                self.writer.queue(queued)
            elif isinstance(queued, Reply):
                self.turns.release(req.phys)
                return queued.code, queued.remark
            else:  # several messages: one append; the first one's settling answers and ends the turn
                queued[0].answer, queued[0].holds_turn = answer, self.turns
                self.writer.queue_together(queued)
        except BaseException:
            self.turns.release(req.phys)
            raise
        return answer if answer is not None else (ResponseCode.SUCCESS, None)

    def decide(self, req: DecisionRequest) -> Reply | Queued | list[Queued]:
        """The table's verdict, with the half message read when the table no longer holds it, as decisions to store;
        a COMMIT's copy is built here: nothing is decided when that fails."""
        table = self.table
        phys = req.phys
        half = table.fresh.get(phys)
        if half is None:
            try:
                half = self.store.read_message(phys)
            except Exception as exc:
                log.warning("END_TRANSACTION %s at commit-log offset %d: record unreadable: %s", req.msg_id, phys, exc)
        effect = table.decide(req, half, self.lookups, self.clock.now_ms())
        if isinstance(effect, Reply):
            if effect.warning:
                log.warning("%s", effect.warning)
            return effect
        if req.by is By.OPERATOR:
            log.warning("transaction %s of group %s: %s by an operator", req.msg_id, req.group, req.decision)
        if not isinstance(effect, StoreDecision):
            return self._with_copies(effect)
        if effect.decision != Decision.COMMIT:
            return Queued(effect, None, None, None)
        half_record = effect.half or self.ops.read_half(effect.phys)
        if half_record is None:
            return Reply(ResponseCode.SYSTEM_ERROR, f"[TXMQ] no half message at commit-log offset {effect.phys}")
        copy = self.ops.commit_copy(half_record)
        return copy if isinstance(copy, Reply) else Queued(effect, copy, None, None)

    def _with_copies(self, several: list[StoreDecision]) -> Reply | list[Queued]:
        """The decisions about the messages of one transaction, each with its committed copy (read back from the
        store): when one copy cannot be built, nothing is decided."""
        if several[0].decision != Decision.COMMIT:
            return [Queued(d, None, None, None) for d in several]
        out: list[Queued] = []
        for d in several:
            half = d.half or self.ops.read_half(d.phys)
            copy = (
                Reply(ResponseCode.SYSTEM_ERROR, f"[TXMQ] no half message at commit-log offset {d.phys}")
                if half is None
                else self.ops.commit_copy(half)
            )
            if isinstance(copy, Reply):
                return copy
            out.append(Queued(d, copy, None, None))
        return out
