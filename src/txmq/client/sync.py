"""Blocking clients for code that does not use asyncio: same classes and method names, no ``await``.

Each class wraps its asyncio twin from :mod:`txmq.client` and runs it on one background event-loop thread
(:mod:`txmq.client._portal`); no behaviour is implemented twice. Plain-function listeners of a
:class:`PushConsumer` run in its thread pool and may call these blocking clients; ``async def`` listeners and send
callbacks run on the loop thread and must not block.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any, Generic, Self, TypeVar

from txmq.client import admin as _admin
from txmq.client import producer as _producer
from txmq.client import pull_consumer as _pull
from txmq.client import push_consumer as _push
from txmq.client import several as _several
from txmq.client import transaction as _transaction
from txmq.client._portal import get_portal
from txmq.client.admin import ClusterInfo, ConsumeStats, TopicOffset
from txmq.client.config import ClientConfig
from txmq.client.lifecycle import ClientLifecycle
from txmq.client.message import Message, MessageExt, MessageQueue, PullResult, SendResult
from txmq.client.producer import SendCallback, check_message
from txmq.client.push_consumer import Listener
from txmq.client.route import TopicRoute
from txmq.client.selection import QueueSelector
from txmq.client.transaction import LocalTransactionState, TransactionListener, TransactionSendResult

__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer", "Transaction", "TransactionProducer"]

C = TypeVar("C", bound=ClientLifecycle)


class _Blocking(Generic[C]):
    """The blocking twin of an asyncio client ``C``: its lifecycle, ``with`` blocks and ``aio``."""

    def __init__(self, client: C) -> None:
        self._portal = get_portal()
        self._async = client

    @property
    def aio(self) -> C:
        """The asyncio client underneath (it lives on the portal's loop)."""
        return self._async

    @property
    def config(self) -> ClientConfig:
        return self._async.config

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def start(self) -> None:
        self._portal.run(self._async.start())

    def shutdown(self) -> None:
        self._portal.run(self._async.shutdown())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


K = TypeVar("K", _push.PushConsumer, _pull.PullConsumer)


class _BlockingConsumer(_Blocking[K]):
    """What both blocking consumers pass through: the group and the calls a client instance makes of a member."""

    @property
    def group(self) -> str:
        return self._async.group

    def subscribed_topics(self) -> set[str]:
        return self._portal.call(self._async.subscribed_topics)

    def consumer_data(self) -> dict[str, Any]:
        return self._portal.call(self._async.consumer_data)

    def rebalance(self) -> None:
        self._portal.run(self._async.rebalance())

    def persist_offsets(self) -> None:
        self._portal.run(self._async.persist_offsets())


class Producer(_Blocking[_producer.Producer]):
    """Blocking :class:`txmq.client.Producer`."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(_producer.Producer(group, namesrv_addr, **options))

    @property
    def group(self) -> str:
        return self._async.group

    def send(
        self,
        msg: Message,
        timeout: float | None = None,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        return self._portal.run(self._async.send(msg, timeout, selector=selector, arg=arg, queue=queue))

    def send_orderly(self, msg: Message, sharding_key: Any, timeout: float | None = None) -> SendResult:
        return self._portal.run(self._async.send_orderly(msg, sharding_key, timeout))

    def request(
        self, msg: Message, timeout: float = 3.0, *, selector: QueueSelector | None = None, arg: Any = None
    ) -> MessageExt:
        """Send ``msg`` as a request and wait for its reply (see :meth:`txmq.client.Producer.request`)."""
        return self._portal.run(self._async.request(msg, timeout, selector=selector, arg=arg))

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        timeout: float | None = None,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Start a send; returns a :class:`concurrent.futures.Future`. ``callback(result, exc)`` runs on the loop."""
        check_message(msg, self._async.max_message_size)
        future = self._portal.submit(self._async.send(msg, timeout, selector=selector, arg=arg))
        if callback is not None:

            def done(f: concurrent.futures.Future[SendResult]) -> None:
                if f.cancelled():
                    callback(None, concurrent.futures.CancelledError())
                elif (exc := f.exception()) is not None:
                    callback(None, exc)
                else:
                    callback(f.result(), None)

            future.add_done_callback(done)
        return future

    send_nowait = send_async

    def send_oneway(
        self, msg: Message, *, selector: QueueSelector | None = None, arg: Any = None, queue: MessageQueue | None = None
    ) -> None:
        self._portal.run(self._async.send_oneway(msg, selector=selector, arg=arg, queue=queue))

    def send_batch(
        self, msgs: Sequence[Message], timeout: float | None = None, *, queue: MessageQueue | None = None
    ) -> SendResult:
        return self._portal.run(self._async.send_batch(msgs, timeout, queue=queue))

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return self._portal.run(self._async.fetch_publish_queues(topic))

    def published_topics(self) -> set[str]:
        return self._portal.call(self._async.published_topics)


class TransactionProducer(Producer):
    """Blocking :class:`txmq.client.TransactionProducer`.

    ``execute_local_transaction`` runs in the thread that calls :meth:`send_message_in_transaction` (as in
    RocketMQ's Java client), so it can use that thread's database connection; ``check_local_transaction`` runs on
    the producer's bounded check executor.
    """

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        listener: TransactionListener | None = None,
        **options: Any,
    ) -> None:
        self._tx = _transaction.TransactionProducer(group, namesrv_addr, listener, **options)
        _Blocking.__init__(self, self._tx)

    @property
    def aio(self) -> _transaction.TransactionProducer:
        return self._tx

    @property
    def listener(self) -> TransactionListener | None:
        return self._tx.listener

    def set_listener(self, listener: TransactionListener) -> None:
        self._tx.set_listener(listener)

    def send_message_in_transaction(
        self, message: Message, arg: Any = None, timeout: float | None = None
    ) -> TransactionSendResult:
        result = self.send_half(message, timeout)
        error: BaseException | None = None
        if result.status.value == "SEND_OK":
            listener = self._tx.listener
            assert listener is not None
            state, error = _transaction.run_listener_blocking(
                listener.execute_local_transaction,
                (message, arg),
                "execute_local_transaction",
                message,
                self._portal.run,
            )
        else:
            state = LocalTransactionState.ROLLBACK
        return self.end_transaction(message, result, state, error)

    def transaction(self, arg: Any = None, timeout: float | None = None) -> Transaction:
        """Several messages in one transaction (see :meth:`txmq.client.TransactionProducer.transaction`)::

            with producer.transaction(order) as tx:
                tx.send(Message("Orders", b"created"))
                tx.send(Message("Stock", b"reserved"))

        ``execute_local_transaction(tx, arg)`` runs in this thread when the block ends.
        """
        return Transaction(self, self._tx.transaction(arg, timeout))

    def send_half(
        self, message: Message, timeout: float | None = None, *, queue: MessageQueue | None = None
    ) -> SendResult:
        return self._portal.run(self._tx.send_half(message, timeout, queue=queue))

    def end_transaction(
        self,
        message: Message,
        result: SendResult,
        state: LocalTransactionState,
        error: BaseException | None = None,
    ) -> TransactionSendResult:
        return self._portal.run(self._tx.end_transaction(message, result, state, error))


class Transaction:
    """Blocking :class:`txmq.client.several.Transaction`: ``send`` in a ``with`` block."""

    def __init__(self, producer: TransactionProducer, tx: _several.Transaction) -> None:
        self._producer = producer
        self.aio = tx

    @property
    def transaction_id(self) -> str | None:
        return self.aio.transaction_id

    @property
    def messages(self) -> list[Message]:
        return self.aio.messages

    @property
    def results(self) -> list[SendResult]:
        return self.aio.results

    @property
    def result(self) -> TransactionSendResult | None:
        return self.aio.result

    @property
    def state(self) -> LocalTransactionState | None:
        return self.aio.state

    @property
    def arg(self) -> Any:
        return self.aio.arg

    def __len__(self) -> int:
        return len(self.aio)

    def send(self, message: Message) -> SendResult:
        return self._producer._portal.run(self.aio.send(message))

    def end(self, state: LocalTransactionState, error: BaseException | None = None) -> TransactionSendResult:
        return self._producer._portal.run(self.aio.end(state, error))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        tx = self.aio
        if not tx.results:
            return
        if exc is not None:
            _several.roll_back_quietly(tx, exc, self._producer._portal.run)
            return
        listener = tx.producer.listener
        assert listener is not None
        state, error = _transaction.run_listener_blocking(
            listener.execute_local_transaction,
            (self, tx.arg),
            "execute_local_transaction",
            tx.messages[0],
            self._producer._portal.run,
        )
        self.end(state, error)


class PushConsumer(_BlockingConsumer[_push.PushConsumer]):
    """Blocking :class:`txmq.client.PushConsumer`; ``start`` returns once consuming has begun."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(_push.PushConsumer(group, namesrv_addr, **options))

    @property
    def clustering(self) -> bool:
        return self._async.clustering

    @property
    def max_reconsume_times(self) -> int:
        return self._async.max_reconsume_times

    @property
    def max_reconsume_times_for_broker(self) -> int:
        return self._async.max_reconsume_times_for_broker

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._portal.call(self._async.subscribe, topic, expression)

    def unsubscribe(self, topic: str) -> None:
        self._portal.call(self._async.unsubscribe, topic)

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        self._portal.call(self._async.register_listener, listener, orderly=orderly)

    def assigned_queues(self) -> list[MessageQueue]:
        return self._portal.call(self._async.assigned_queues)

    def lock_all(self) -> None:
        self._portal.run(self._async.lock_all())

    def reset_offset(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        self._portal.run(self._async.reset_offset(topic, offsets))


class PullConsumer(_BlockingConsumer[_pull.PullConsumer]):
    """Blocking :class:`txmq.client.PullConsumer`."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(_pull.PullConsumer(group, namesrv_addr, **options))

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._portal.run(self._async.fetch_queues(topic))

    def pull(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        timeout: float | None = None,
        *,
        expression_type: str = "TAG",
    ) -> PullResult:
        return self._portal.run(
            self._async.pull(mq, expression, offset, max_nums, timeout, expression_type=expression_type)
        )

    def pull_blocking(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        timeout: float | None = None,
        *,
        expression_type: str = "TAG",
    ) -> PullResult:
        return self._portal.run(
            self._async.pull_blocking(mq, expression, offset, max_nums, timeout, expression_type=expression_type)
        )

    def update_offset(self, mq: MessageQueue, offset: int) -> None:
        self._portal.run(self._async.update_offset(mq, offset))

    def fetch_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        return self._portal.run(self._async.fetch_offset(mq, from_store))

    def persist_offset(self, mq: MessageQueue) -> None:
        self._portal.run(self._async.persist_offset(mq))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._portal.run(self._async.min_offset(mq))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._portal.run(self._async.max_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._portal.run(self._async.search_offset(mq, timestamp_ms))

    def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return self._portal.run(self._async.earliest_msg_store_time(mq))


class Admin(_Blocking[_admin.Admin]):
    """Blocking :class:`txmq.client.Admin`."""

    def __init__(self, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(_admin.Admin(namesrv_addr, **options))

    # -- cluster and topics ---------------------------------------------------------------------------------------

    def cluster_info(self) -> ClusterInfo:
        return self._portal.run(self._async.cluster_info())

    def master_broker_addrs(self, cluster: str | None = None) -> list[str]:
        return self._portal.run(self._async.master_broker_addrs(cluster))

    def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        return self._portal.run(self._async.broker_runtime_info(broker_addr))

    def cluster_runtime_info(self) -> dict[str, dict[str, str]]:
        return self._portal.run(self._async.cluster_runtime_info())

    def topic_list(self) -> list[str]:
        return self._portal.run(self._async.topic_list())

    def topic_route(self, topic: str) -> TopicRoute:
        return self._portal.run(self._async.topic_route(topic))

    def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        order: bool = False,
        topic_filter_type: str = "SINGLE_TAG",
    ) -> list[str]:
        return self._portal.run(
            self._async.create_topic(
                topic,
                cluster=cluster,
                broker_addr=broker_addr,
                read_queue_nums=read_queue_nums,
                write_queue_nums=write_queue_nums,
                perm=perm,
                order=order,
                topic_filter_type=topic_filter_type,
            )
        )

    def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        return self._portal.run(self._async.topic_stats(topic))

    # -- consumers ------------------------------------------------------------------------------------------------

    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        return self._portal.run(self._async.consume_stats(group, topic))

    def consumer_ids(self, group: str) -> list[str]:
        return self._portal.run(self._async.consumer_ids(group))

    def consumer_connections(self, group: str) -> dict[str, Any]:
        return self._portal.run(self._async.consumer_connections(group))

    def reset_offset(self, group: str, topic: str, to: str | int) -> list[dict[str, Any]]:
        return self._portal.run(self._async.reset_offset(group, topic, to))

    def dead_letters(self, group: str, max_num: int = 1000) -> list[dict[str, Any]]:
        return self._portal.run(self._async.dead_letters(group, max_num))

    def resend_dead_letters(
        self, group: str, msg_ids: Sequence[str] | None = None, *, all_messages: bool = False
    ) -> dict[str, list[str]]:
        return self._portal.run(self._async.resend_dead_letters(group, msg_ids, all_messages=all_messages))

    # -- messages -------------------------------------------------------------------------------------------------

    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        return self._portal.run(self._async.view_message(msg_id, topic))

    def query_message_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[MessageExt]:
        return self._portal.run(self._async.query_message_by_key(topic, key, max_num, begin_ms, end_ms))

    def query_message_by_uniq_key(
        self, topic: str, uniq_key: str, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[MessageExt]:
        return self._portal.run(self._async.query_message_by_uniq_key(topic, uniq_key, begin_ms, end_ms))

    # -- transactions ---------------------------------------------------------------------------------------------

    def list_transactions(
        self,
        group: str | None = None,
        topic: str | None = None,
        older_than_ms: int | None = None,
        limit: int = 100,
        states: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        return self._portal.run(self._async.list_transactions(group, topic, older_than_ms, limit, states))

    def transaction(self, ident: str) -> dict[str, Any]:
        return self._portal.run(self._async.transaction(ident))

    def resolve_transaction(self, ident: str, decision: str) -> dict[str, Any]:
        return self._portal.run(self._async.resolve_transaction(ident, decision))

    def resume_transaction(self, ident: str) -> dict[str, Any]:
        return self._portal.run(self._async.resume_transaction(ident))

    def promote_broker(self, broker_addr: str, role: str = "ASYNC_MASTER", *, force: bool = False) -> Any:
        return self._portal.run(self._async.promote_broker(broker_addr, role, force=force))

    def transaction_counters(self) -> dict[str, dict[str, int]]:
        return self._portal.run(self._async.transaction_counters())

    # -- ACL ------------------------------------------------------------------------------------------------------

    def acl_info(self, broker_addr: str) -> dict[str, Any]:
        return self._portal.run(self._async.acl_info(broker_addr))

    def update_acl_account(
        self,
        broker_addr: str,
        access_key: str,
        *,
        secret_key: str | None = None,
        white_remote_address: str | None = None,
        admin: bool | None = None,
        default_topic_perm: str | None = None,
        default_group_perm: str | None = None,
        topic_perms: Sequence[str] | None = None,
        group_perms: Sequence[str] | None = None,
    ) -> str:
        return self._portal.run(
            self._async.update_acl_account(
                broker_addr,
                access_key,
                secret_key=secret_key,
                white_remote_address=white_remote_address,
                admin=admin,
                default_topic_perm=default_topic_perm,
                default_group_perm=default_group_perm,
                topic_perms=topic_perms,
                group_perms=group_perms,
            )
        )

    def delete_acl_account(self, broker_addr: str, access_key: str) -> str:
        return self._portal.run(self._async.delete_acl_account(broker_addr, access_key))

    def update_global_white_addrs(self, broker_addr: str, addresses: Sequence[str], acl_file: str | None = None) -> str:
        return self._portal.run(self._async.update_global_white_addrs(broker_addr, addresses, acl_file))
