"""Several messages in one transaction (``TransactionProducer.transaction``): all visible on COMMIT, none otherwise.

On the wire each message is a half message, as for one, carrying ``TXMQ_TX_ID`` (the transaction id: the first
message's UNIQ_KEY) and ``TXMQ_TX_SEQ`` (its place); all go to one broker. One END_TRANSACTION, about the first
message and saying how many there are (``txmqMessages``), decides them all, and the broker acknowledges it; the
broker stores every committed copy and the op marker in one append. A check is about the first message, carries
``TXMQ_TX_MESSAGES``, and its answer decides them all. See docs/transactions.md, "Several messages in one
transaction".
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from txmq.client.local_state import LocalTransactionState, TransactionSendResult
from txmq.client.message import Message, SendResult, SendStatus
from txmq.errors import MQClientError
from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import Prop

if TYPE_CHECKING:
    from txmq.client.transaction import TransactionProducer

DEFAULT_MAX_MESSAGES = 64  # the broker's transactionMaxMessages default
log = logging.getLogger("txmq.client")


def roll_back_quietly(tx: Transaction, exc: BaseException, run: Callable[[Awaitable[Any]], Any]) -> None:
    """Roll ``tx`` back after ``exc`` left its block (blocking, through ``run``); a failure is logged only."""
    try:
        run(tx.end(LocalTransactionState.ROLLBACK, exc))
    except Exception as failure:
        log.warning("rolling back transaction %s failed (%s); the broker will check it", tx.transaction_id, failure)


class Transaction:
    """The messages of one transaction, sent with :meth:`send`; ended when its ``async with`` block ends."""

    def __init__(self, producer: TransactionProducer, arg: Any, timeout: float | None) -> None:
        self.producer = producer
        self.arg = arg
        self.timeout = timeout
        self.transaction_id: str | None = None
        self.messages: list[Message] = []
        self.results: list[SendResult] = []
        self.result: TransactionSendResult | None = None  # once ended: the first message's, with the state
        self._broker: str | None = None
        self._random = random.Random()

    @property
    def state(self) -> LocalTransactionState | None:
        return None if self.result is None else self.result.local_transaction_state

    def __len__(self) -> int:
        return len(self.messages)

    async def send(self, message: Message) -> SendResult:
        """Store ``message`` as a half message of this transaction (consumers cannot see it yet). Raises before
        anything is stored when the transaction is full or the topic has no queue on its broker."""
        producer = self.producer
        if self.result is not None:
            raise MQClientError(f"transaction {self.transaction_id} has ended; nothing more can be sent in it")
        limit = producer.max_messages_per_transaction
        if len(self.messages) >= limit:
            raise MQClientError(
                f"transaction {self.transaction_id} already holds {limit} messages, the most one transaction may "
                "hold (max_messages_per_transaction; the broker's transactionMaxMessages)"
            )
        queues = await producer.fetch_publish_queues(message.topic)
        if self._broker is not None:
            queues = [q for q in queues if q.broker_name == self._broker]
        if not queues:
            raise MQClientError(
                f"topic {message.topic} has no writable queue on broker {self._broker}, which holds transaction "
                f"{self.transaction_id}: the messages of one transaction go to one broker"
                if self._broker is not None
                else f"topic {message.topic} has no writable queue"
            )
        queue = self._random.choice(queues)
        uniq = producer._ensure_uniq_key(message)
        if self.transaction_id is None:
            self.transaction_id = uniq
        message.properties[Prop.TX_ID] = self.transaction_id
        message.properties[Prop.TX_SEQ] = str(len(self.messages))
        result = await producer.send_half(message, self.timeout, queue=queue)
        if result.status is not SendStatus.SEND_OK:
            # Stored, but not as safely as asked (a flush or replica timeout): the transaction is not run on it.
            self.messages.append(message)
            self.results.append(result)
            raise MQClientError(
                f"message {len(self.messages) - 1} of transaction {self.transaction_id} was stored with "
                f"{result.status.value}; the transaction is rolled back"
            )
        self._broker = result.message_queue.broker_name
        self.messages.append(message)
        self.results.append(result)
        return result

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.results:
            return
        if exc is not None:
            try:
                await self.end(LocalTransactionState.ROLLBACK, exc)
            except Exception as failure:  # the block's own exception is the one that matters
                log.warning("rolling back transaction %s failed (%s); it will be checked", self.transaction_id, failure)
            return
        listener = self.producer.listener
        assert listener is not None
        state, error = await self.producer._call_listener(
            listener.execute_local_transaction, (self, self.arg), "execute_local_transaction", self.messages[0], None
        )
        await self.end(state, error)

    async def end(self, state: LocalTransactionState, error: BaseException | None = None) -> TransactionSendResult:
        """Decide every message with one END_TRANSACTION and wait for the broker to acknowledge it. Raises when
        the broker refuses it or cannot be reached: the transaction then stays in doubt and checks decide it."""
        producer = self.producer
        first = self.results[0]
        addr, cmd = producer._end_command(first, state, error, oneway=False, messages=len(self.results))
        timeout = producer.send_msg_timeout if self.timeout is None else self.timeout
        response = await producer.instance.invoke(addr, cmd, timeout)
        self.result = TransactionSendResult.of(first, state, self.transaction_id)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(
                f"END_TRANSACTION {state.name} of transaction {self.transaction_id} refused by the broker: "
                f"code {response.code}, {response.remark}"
            )
        return self.result
