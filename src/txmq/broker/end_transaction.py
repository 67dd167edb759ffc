"""END_TRANSACTION (37), the 4.x door's decision: the header becomes a
:class:`~txmq.txn.effects.DecisionRequest` for the transaction driver.

The decision is validated at once; only its store write is waited for. Oneway requests, as real clients send them,
get no answer: their decision is stored with nobody waiting, and a failure to store it is logged. A check's answer
(``fromTransactionCheck``) is noted in the transaction's history, UNKNOWN included.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from txmq.errors import ProtocolError
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader
from txmq.protocol.record import TransactionType
from txmq.txn.effects import DecisionRequest
from txmq.txn.model import By, Decision

if TYPE_CHECKING:
    from txmq.broker.txn import TransactionService

log = logging.getLogger("txmq.broker.transactions")

_DECISIONS = {int(TransactionType.COMMIT): Decision.COMMIT, int(TransactionType.ROLLBACK): Decision.ROLLBACK}
UNKNOWN_ANSWER = "UNKNOWN"


class EndTransactionProcessor:
    def __init__(self, transactions: TransactionService) -> None:
        self.transactions = transactions

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand] | None:
        oneway = cmd.is_oneway
        peer = getattr(conn, "peer", None)
        try:
            header = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            log.warning("END_TRANSACTION from %s is malformed: %s", peer, exc)
            return None if oneway else cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        decision = _DECISIONS.get(header.commitOrRollback)
        if header.fromTransactionCheck:
            self.transactions.note_answer(header.commitLogOffset, header.producerGroup, decision or UNKNOWN_ANSWER)
        if decision is None:
            if header.commitOrRollback != 0:
                log.warning(
                    "END_TRANSACTION from %s for %s with commitOrRollback=%d ignored",
                    peer,
                    header.msgId,
                    header.commitOrRollback,
                )
            if oneway:
                return None
            return cmd.response(ResponseCode.SUCCESS, "transaction state unknown; the broker will check it later")
        req = DecisionRequest(
            header.commitLogOffset,
            decision,
            By.CHECK if header.fromTransactionCheck else By.PRODUCER,
            header.producerGroup,
            header.tranStateTableOffset,
            header.msgId,
            header.transactionId,
            peer,
            header.txmqMessages,
        )
        if oneway:
            self.transactions.decide_oneway(req)
            return None
        outcome = self.transactions.decide(req)
        if isinstance(outcome, tuple):
            return cmd.response(*outcome)
        return _answer(cmd, outcome)


async def _answer(cmd: RemotingCommand, outcome: Awaitable[tuple[int, str | None]]) -> RemotingCommand:
    code, remark = await outcome
    return cmd.response(code, remark)
