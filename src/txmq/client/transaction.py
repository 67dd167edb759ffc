"""Transactional producer: half message, local transaction, END_TRANSACTION, and answers to the broker's check-backs.

``send_message_in_transaction`` sends the message as a half message (``TRAN_MSG=true``, ``PGROUP``, sysFlag
PREPARED), runs the listener's local transaction, then tells the broker COMMIT, ROLLBACK or nothing yet (UNKNOWN)
with a oneway END_TRANSACTION. When the decision never arrives, the broker sends CHECK_TRANSACTION_STATE to some live
producer of the group: the request carries the whole message and its offsets, so any instance of the group answers
for messages another instance sent. Checks run on a bounded executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from txmq.client import several
from txmq.client.callbacks import call_user
from txmq.client.instance import ClientInstance
from txmq.client.local_state import (
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
    coerce_state,
    failed_state,
    run_listener_blocking,
)
from txmq.client.message import DEFAULT_TOPIC, Message, MessageExt, MessageQueue, SendResult, SendStatus
from txmq.client.producer import Producer, check_message
from txmq.client.wire import end_transaction_ext, request_command
from txmq.errors import MQClientError, ProtocolError, RemotingError
from txmq.net import Connection
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.record import Prop, decode_offset_msg_id, decode_record

log = logging.getLogger("txmq.client")

_END_TRANSACTION = int(RequestCode.END_TRANSACTION)

__all__ = [
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "coerce_state",
    "failed_state",
    "run_listener_blocking",
]


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends transactional messages for its group.

    ``check_threads`` bounds how many checks run at once (RocketMQ's default is one thread); at most
    ``check_backlog`` checks wait for a slot, and further ones are dropped with a warning (the broker asks again
    at its next interval). Other options are the :class:`Producer`'s.
    """

    _what = "transaction producer"

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str] | None = None,
        listener: TransactionListener | None = None,
        *,
        check_threads: int = 1,
        check_backlog: int = 2000,
        max_messages_per_transaction: int = 64,
        **options: Any,
    ) -> None:
        super().__init__(group, namesrv_addr, **options)
        if listener is not None:
            _validate_listener(listener)
        if check_threads < 1:
            raise MQClientError("check_threads must be at least 1")
        self.listener = listener
        self.check_threads = check_threads
        self.check_backlog = max(1, check_backlog)
        self.max_messages_per_transaction = max(1, max_messages_per_transaction)
        self._check_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._check_slots: asyncio.Semaphore | None = None
        self._check_tasks: set[asyncio.Task[None]] = set()
        self._checks_waiting = 0
        self.checks_answered = 0  # for observers and tests

    def set_listener(self, listener: TransactionListener) -> None:
        _validate_listener(listener)
        self.listener = listener

    # -- lifecycle (ClientLifecycle) ------------------------------------------------------------------------------

    def _check_startable(self) -> None:
        if self.listener is None:
            raise MQClientError(f"transaction producer {self.group} has no TransactionListener; pass listener=")

    def _attach(self, instance: ClientInstance) -> None:
        super()._attach(instance)
        self._check_executor = concurrent.futures.ThreadPoolExecutor(
            self.check_threads, thread_name_prefix=f"txmq-check-{self.group}"
        )
        self._check_slots = asyncio.Semaphore(self.check_threads)
        instance.register_request_handler(RequestCode.CHECK_TRANSACTION_STATE, _check_handler(instance))

    async def _on_started(self) -> None:
        # A producer that has sent nothing yet knows no broker, so none would know to check with it. Like Java's
        # producer, follow the auto-create template's route (every broker that accepts new topics) from the start.
        try:
            await self.instance.update_route(DEFAULT_TOPIC)
        except (RemotingError, MQClientError) as exc:
            log.info(
                "transaction producer %s: no route for %s (%s); brokers learn of it once it sends",
                self.group,
                DEFAULT_TOPIC,
                exc,
            )
        await super()._on_started()  # the heartbeat, now to every broker of that route

    def published_topics(self) -> set[str]:
        return super().published_topics() | {DEFAULT_TOPIC}

    async def _detach(self, instance: ClientInstance) -> None:
        tasks = list(self._check_tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await super()._detach(instance)
        if self._check_executor is not None:
            self._check_executor.shutdown(wait=False, cancel_futures=True)
            self._check_executor = None

    # -- sending ------------------------------------------------------------------------------------------------

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None, timeout: float | None = None
    ) -> TransactionSendResult:
        """Send ``message`` as a half message, run the local transaction, then commit or roll it back.

        A failed half send raises (the local transaction does not run). An exception from the listener means
        UNKNOWN: the broker checks the message later.
        """
        result = await self.send_half(message, timeout)
        if result.status is SendStatus.SEND_OK:
            listener = self.listener
            assert listener is not None
            state, error = await self._call_listener(
                listener.execute_local_transaction, (message, arg), "execute_local_transaction", message, None
            )
        else:
            state, error = LocalTransactionState.ROLLBACK, None  # not safely stored: do not run the transaction
        if self._end_on_open_connection(result, state, error):
            return TransactionSendResult.of(result, state, result.msg_id)
        return await self.end_transaction(message, result, state, error)

    def transaction(self, arg: Any = None, timeout: float | None = None) -> several.Transaction:
        """Several messages in one transaction, all visible on COMMIT or none ever::

            async with producer.transaction(order) as tx:
                await tx.send(Message("Orders", b"created"))
                await tx.send(Message("Stock", b"reserved"))

        When the block ends without an exception, the listener's ``execute_local_transaction(tx, arg)`` runs with
        the whole :class:`Transaction`, and its answer decides every message with one END_TRANSACTION, which the
        broker acknowledges (``tx.result``). An exception in the block rolls back what was sent and propagates.
        The messages go to one broker (topics with queues there), at most ``max_messages_per_transaction``.
        """
        return several.Transaction(self, arg, timeout)

    async def send_half(
        self, message: Message, timeout: float | None = None, *, queue: MessageQueue | None = None
    ) -> SendResult:
        """Step 1: store ``message`` as a half message (consumers cannot see it yet)."""
        if self.listener is None:
            raise MQClientError(f"transaction producer {self.group} has no TransactionListener")
        check_message(message, self.max_message_size)
        message.properties.pop(Prop.DELAY, None)  # RocketMQ drops the delay level of transactional messages
        message.properties[Prop.TRAN_MSG] = "true"
        message.properties[Prop.PGROUP] = self.group  # the group the broker asks when the decision never comes
        result = await self._send(message, timeout, queue=queue, oneway=False)  # send() less its second check
        assert result is not None
        message.properties[Prop.TRANSACTION_ID] = message.properties.get(Prop.TX_ID) or result.msg_id
        return result

    async def end_transaction(
        self,
        message: Message,
        result: SendResult,
        state: LocalTransactionState,
        error: BaseException | None = None,
    ) -> TransactionSendResult:
        """Step 3: send END_TRANSACTION (oneway) to the broker holding the half message; failures are logged only."""
        out = TransactionSendResult.of(result, state, result.msg_id)
        if not self._end_on_open_connection(result, state, error):
            try:
                addr, cmd = self._end_command(result, state, error, oneway=True)
                await self.instance.invoke_oneway(addr, cmd)
            except (ProtocolError, RemotingError, MQClientError) as exc:
                _end_failed(result, state, exc)
        return out

    def _end_on_open_connection(
        self, result: SendResult, state: LocalTransactionState, error: BaseException | None
    ) -> bool:
        """END_TRANSACTION written at once when the broker's connection is open (the common case: the half message
        just went on it), which spares a coroutine per transaction. False: nothing written, ``end_transaction``
        connects first. A failure to write is logged and counts as done, as in ``end_transaction``."""
        try:
            addr, cmd = self._end_command(result, state, error, oneway=True)
            instance = self.instance
            conn = instance.open_connection(addr)
            if conn is None:
                return False
            conn.send_oneway(instance.sign(cmd))
        except (ProtocolError, RemotingError, MQClientError) as exc:
            _end_failed(result, state, exc)
        return True

    def _end_command(
        self,
        result: SendResult,
        state: LocalTransactionState,
        error: BaseException | None,
        *,
        oneway: bool,
        messages: int | None = None,
    ) -> tuple[str, RemotingCommand]:
        """END_TRANSACTION about the half message of ``result``, and the broker address it goes to."""
        (host, port), commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        # The address the half message was sent to; the store host in its offsetMsgId is the fallback.
        addr = self.instance.find_broker_addr(result.message_queue.broker_name) or f"{host}:{port}"
        ext = end_transaction_ext(
            self.group,
            result.queue_offset,  # the half message's queue offset in the half topic
            commit_log_offset,
            state.commit_or_rollback,
            False,
            result.msg_id,
            result.transaction_id or result.msg_id,
            messages,
        )
        cmd = request_command(_END_TRANSACTION, ext, b"", oneway)
        if error is not None:
            cmd.remark = f"executeLocalTransactionBranch exception: {error!r}"[:512]
        return addr, cmd

    # -- checks -------------------------------------------------------------------------------------------------

    async def _call_listener(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        what: str,
        msg: Message,
        executor: concurrent.futures.Executor | None,
    ) -> tuple[LocalTransactionState, BaseException | None]:
        try:
            return coerce_state(await call_user(fn, *args, executor=executor), what), None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return failed_state(exc, what, msg), exc

    def _schedule_check(self, conn: Connection, header: CheckTransactionStateRequestHeader, msg: MessageExt) -> None:
        if self._checks_waiting >= self.check_backlog:
            log.warning(
                "transaction check of %s dropped: %d checks already wait (check_backlog); the broker will ask again",
                header.msgId,
                self._checks_waiting,
            )
            return
        self._checks_waiting += 1
        task = asyncio.ensure_future(self._check(conn, header, msg))
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

    async def _check(self, conn: Connection, header: CheckTransactionStateRequestHeader, msg: MessageExt) -> None:
        slots = self._check_slots
        assert slots is not None and self.listener is not None
        waiting = True
        try:
            async with slots:
                self._checks_waiting -= 1
                waiting = False
                state, error = await self._call_listener(
                    self.listener.check_local_transaction,
                    (msg,),
                    "check_local_transaction",
                    msg,
                    self._check_executor,
                )
        finally:
            if waiting:
                self._checks_waiting -= 1
        uniq_key = msg.properties.get(Prop.UNIQ_KEY) or header.msgId or msg.offset_msg_id
        ext = end_transaction_ext(
            self.group,
            header.tranStateTableOffset,
            header.commitLogOffset,
            state.commit_or_rollback,
            True,
            uniq_key,
            header.transactionId or uniq_key,
            None,
        )
        cmd = request_command(_END_TRANSACTION, ext, b"", True)
        if error is not None:
            cmd.remark = f"checkLocalTransactionState exception: {error!r}"[:512]
        instance = self._instance
        if instance is None:
            return
        try:
            instance.send_oneway_on(conn, cmd)
        except RemotingError:
            host, port = conn.peer
            try:
                await instance.invoke_oneway(f"{host}:{port}", cmd)
            except (RemotingError, MQClientError) as exc:
                log.warning("answering the transaction check of %s failed: %s", uniq_key, exc)
                return
        self.checks_answered += 1
        log.debug("answered transaction check of %s: %s", uniq_key, state.name)


def _end_failed(result: SendResult, state: LocalTransactionState, exc: BaseException) -> None:
    log.warning(
        "local transaction of %s ended %s, but telling the broker failed (%s); the broker will check it",
        result.msg_id,
        state.name,
        exc,
    )


def _validate_listener(listener: Any) -> None:
    missing = [
        name
        for name in ("execute_local_transaction", "check_local_transaction")
        if not callable(getattr(listener, name, None))
    ]
    if missing:
        raise MQClientError(f"a TransactionListener needs {' and '.join(missing)}; {listener!r} lacks it")


def _check_handler(instance: ClientInstance) -> Callable[[Connection, RemotingCommand], None]:
    """CHECK_TRANSACTION_STATE for every transactional producer group of ``instance`` (chosen by the PGROUP)."""

    def serve(conn: Connection, cmd: RemotingCommand) -> None:
        try:
            header = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
            record = decode_record(cmd.body, check_crc=False)
        except ProtocolError as exc:
            log.warning("malformed CHECK_TRANSACTION_STATE from %s:%d ignored: %s", *conn.peer, exc)
            return None
        msg = MessageExt.from_record(record)
        transaction_id = header.transactionId or msg.properties.get(Prop.UNIQ_KEY)
        if transaction_id:
            msg.properties[Prop.TRANSACTION_ID] = transaction_id
        group = msg.properties.get(Prop.PGROUP)
        producer = instance.producers.get(group or "")
        if not isinstance(producer, TransactionProducer) or not producer._started:
            log.warning(
                "CHECK_TRANSACTION_STATE for %s names producer group %r, which has no transaction producer here",
                header.msgId,
                group,
            )
            return None
        producer._schedule_check(conn, header, msg)
        return None

    return serve
