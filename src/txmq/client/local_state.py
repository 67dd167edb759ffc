"""What a local transaction concluded, and the application's side of a transaction (the listener): shared by the
transactional producer and transactions of several messages."""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from txmq.client.callbacks import call_user_blocking
from txmq.client.message import Message, MessageExt, SendResult, SendStatus
from txmq.protocol.record import TransactionType

log = logging.getLogger("txmq.client")


class LocalTransactionState(enum.Enum):
    """What a local transaction (or a check of one) concluded. RocketMQ's names are aliases."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"

    @property
    def commit_or_rollback(self) -> int:
        """END_TRANSACTION's ``commitOrRollback``: 8 commit, 12 rollback, 0 unknown (the broker checks later)."""
        return _WIRE_DECISION[self]


_WIRE_DECISION = {
    LocalTransactionState.COMMIT: int(TransactionType.COMMIT),
    LocalTransactionState.ROLLBACK: int(TransactionType.ROLLBACK),
    LocalTransactionState.UNKNOWN: int(TransactionType.NOT_TYPE),
}


@runtime_checkable
class TransactionListener(Protocol):
    """The application's side of a transaction. Either method may be a plain function or ``async def``.

    Plain functions run in threads (``check_local_transaction`` on the producer's bounded check executor), so they
    must be thread-safe; ``async def`` ones run on the client's event loop. Raising means UNKNOWN.
    """

    def execute_local_transaction(self, message: Message, arg: Any) -> Any: ...

    def check_local_transaction(self, message: MessageExt) -> Any: ...


@dataclass(slots=True)
class TransactionSendResult(SendResult):
    """A :class:`SendResult` for the half message plus the local transaction's outcome.

    ``msg_id`` and ``transaction_id`` are the UNIQ_KEY; ``offset_msg_id`` and ``queue_offset`` locate the half
    message on the broker.
    """

    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOWN

    @property
    def send_status(self) -> SendStatus:
        return self.status

    @classmethod
    def of(cls, half: SendResult, state: LocalTransactionState, transaction_id: str | None) -> TransactionSendResult:
        """The result of a transaction whose (first) half message was sent with ``half``, ended in ``state``."""
        return cls(
            status=half.status,
            msg_id=half.msg_id,
            offset_msg_id=half.offset_msg_id,
            message_queue=half.message_queue,
            queue_offset=half.queue_offset,
            transaction_id=transaction_id,
            region_id=half.region_id,
            trace_on=half.trace_on,
            local_transaction_state=state,
        )


def coerce_state(value: Any, what: str) -> LocalTransactionState:
    """A listener's return value as a state; anything unrecognisable is UNKNOWN (logged)."""
    if isinstance(value, LocalTransactionState):
        return value
    if isinstance(value, str):
        with contextlib.suppress(KeyError):
            return LocalTransactionState[value.upper()]
        with contextlib.suppress(ValueError):
            return LocalTransactionState(value.upper())
    log.warning("%s returned %r, not a LocalTransactionState; treated as UNKNOWN", what, value)
    return LocalTransactionState.UNKNOWN


def failed_state(exc: BaseException, what: str, msg: Message) -> LocalTransactionState:
    log.warning("%s raised for message %s; state UNKNOWN, the broker will check it", what, msg.uniq_key, exc_info=exc)
    return LocalTransactionState.UNKNOWN


def run_listener_blocking(
    fn: Callable[..., Any], args: tuple[Any, ...], what: str, msg: Message, run: Callable[[Awaitable[Any]], Any]
) -> tuple[LocalTransactionState, BaseException | None]:
    """Call ``fn(*args)`` in this thread (``run`` finishes an awaitable it returns); exceptions become UNKNOWN."""
    try:
        return coerce_state(call_user_blocking(fn, *args, run=run), what), None
    except Exception as exc:
        return failed_state(exc, what, msg), exc
