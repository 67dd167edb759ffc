"""How the transaction driver reaches producers for checks, whichever door they came through.

Producers of a group are in the broker's :class:`~txmq.broker.clients.ClientRegistry`. A door whose connections
carry checks themselves gives them a ``send_transaction_check(check)`` method (:class:`CheckChannel`; the gRPC door
writes a ``recover_orphaned_transaction_command`` to the producer's Telemetry stream); a 4.x remoting connection is
sent a oneway CHECK_TRANSACTION_STATE. A check counts only when it was written to a live connection.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.record import encode_record
from txmq.txn.records import CheckRequest

log = logging.getLogger("txmq.broker.transactions")


@runtime_checkable
class CheckChannel(Protocol):
    """A producer connection that carries transaction checks itself. Raises when the check cannot be written."""

    def send_transaction_check(self, check: CheckRequest) -> None: ...


class ProducerChecks:
    """Sends a check to one live producer of the group, round-robin (``clients``: the ClientRegistry)."""

    def __init__(self, clients: Any) -> None:
        self.clients = clients

    def send(self, check: CheckRequest) -> str | None:
        """The client id the check was written to, or None when no live producer of the group took it."""
        channel = self.clients.pick_producer(check.group, lambda c: not getattr(c, "closed", False))
        if channel is None:
            return None
        conn = channel.connection
        try:
            if isinstance(conn, CheckChannel):
                conn.send_transaction_check(check)
            else:
                conn.send_oneway(remoting_check(check))
        except Exception as exc:
            log.info("transaction check of %s to %s not sent: %s", check.msg_id, channel.client_id, exc)
            return None
        return str(channel.client_id)


def remoting_check(check: CheckRequest) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE (oneway) for the 4.x door: the header names the half message, the body is the
    message as the producer sent it."""
    header = CheckTransactionStateRequestHeader(
        tranStateTableOffset=check.half_queue_offset,
        commitLogOffset=check.half_phys,
        msgId=check.msg_id,
        transactionId=check.transaction_id,
        offsetMsgId=check.offset_msg_id,
    )
    body = bytes(encode_record(check.message))
    return RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(), body, oneway=True)
