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
from txmq.protocol.headers import end_transaction_fields
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
            # The header's fields straight into the decision: no header object per transaction.
            group, queue_offset, phys, commit_or_rollback, from_check, msg_id, transaction_id, messages = (
                end_transaction_fields(cmd.ext_fields)
            )
        except ProtocolError as exc:
            log.warning("END_TRANSACTION from %s is malformed: %s", peer, exc)
            return None if oneway else cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        decision = _DECISIONS.get(commit_or_rollback)
        if from_check:
            self.transactions.note_answer(phys, group, decision or UNKNOWN_ANSWER)
        if decision is None:
            if commit_or_rollback != 0:
                log.warning(
                    "END_TRANSACTION from %s for %s with commitOrRollback=%d ignored", peer, msg_id, commit_or_rollback
                )
            if oneway:
                return None
            return cmd.response(ResponseCode.SUCCESS, "transaction state unknown; the broker will check it later")
        req = DecisionRequest(
            phys,
            decision,
            By.CHECK if from_check else By.PRODUCER,
            group,
            queue_offset,
            msg_id,
            transaction_id,
            peer,
            messages,
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
