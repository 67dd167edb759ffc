"""Blocking clients for code that does not use asyncio: same classes and method names, no ``await``.

Each class wraps its asyncio twin from :mod:`txmq.client` and runs it on one background event-loop thread
(:mod:`txmq.client._portal`); no behaviour is implemented twice. Plain-function listeners of a
:class:`PushConsumer` run in its thread pool and may call these blocking clients; ``async def`` listeners and send
callbacks run on the loop thread and must not block.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Sequence
from typing import Any

from txmq.client import admin as _admin
from txmq.client import producer as _producer
from txmq.client import pull_consumer as _pull
from txmq.client import push_consumer as _push
from txmq.client._portal import Portal, get_portal
from txmq.client.admin import ClusterInfo, ConsumeStats, TopicOffset
from txmq.client.message import Message, MessageExt, MessageQueue, PullResult, SendResult
from txmq.client.producer import SendCallback, check_message
from txmq.client.push_consumer import Listener
from txmq.client.route import TopicRoute
from txmq.client.selection import QueueSelector, select_by_hash

__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer"]


class _Blocking:
    _portal: Portal

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> None:
        self._portal.run(self._async.start())  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        self._portal.run(self._async.shutdown())  # type: ignore[attr-defined]

    @property
    def client_id(self) -> str:
        return self._async.client_id  # type: ignore[attr-defined, no-any-return]


class Producer(_Blocking):
    """Blocking :class:`txmq.client.Producer`."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        self._portal = get_portal()
        self._async = _producer.Producer(group, namesrv_addr, **options)

    @property
    def group(self) -> str:
        return self._async.group

    @property
    def aio(self) -> _producer.Producer:
        """The asyncio producer underneath (lives on the portal's loop)."""
        return self._async

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
        return self.send(msg, timeout, selector=select_by_hash, arg=sharding_key)

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


class PushConsumer(_Blocking):
    """Blocking :class:`txmq.client.PushConsumer`; ``start`` returns once consuming has begun."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        self._portal = get_portal()
        self._async = _push.PushConsumer(group, namesrv_addr, **options)

    @property
    def group(self) -> str:
        return self._async.group

    @property
    def aio(self) -> _push.PushConsumer:
        return self._async

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._portal.call(self._async.subscribe, topic, expression)

    def unsubscribe(self, topic: str) -> None:
        self._portal.call(self._async.unsubscribe, topic)

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        self._portal.call(self._async.register_listener, listener, orderly=orderly)

    def assigned_queues(self) -> list[MessageQueue]:
        return self._portal.call(self._async.assigned_queues)

    def rebalance(self) -> None:
        self._portal.run(self._async.rebalance())


class PullConsumer(_Blocking):
    """Blocking :class:`txmq.client.PullConsumer`."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        self._portal = get_portal()
        self._async = _pull.PullConsumer(group, namesrv_addr, **options)

    @property
    def group(self) -> str:
        return self._async.group

    @property
    def aio(self) -> _pull.PullConsumer:
        return self._async

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


class Admin(_Blocking):
    """Blocking :class:`txmq.client.Admin`."""

    def __init__(self, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        self._portal = get_portal()
        self._async = _admin.Admin(namesrv_addr, **options)

    @property
    def aio(self) -> _admin.Admin:
        return self._async

    def cluster_info(self) -> ClusterInfo:
        return self._portal.run(self._async.cluster_info())

    def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        return self._portal.run(self._async.broker_runtime_info(broker_addr))

    def cluster_runtime_info(self) -> dict[str, dict[str, str]]:
        return self._portal.run(self._async.cluster_runtime_info())

    def topic_list(self) -> list[str]:
        return self._portal.run(self._async.topic_list())

    def topic_route(self, topic: str) -> TopicRoute:
        return self._portal.run(self._async.topic_route(topic))

    def create_topic(self, topic: str, **kwargs: Any) -> list[str]:
        return self._portal.run(self._async.create_topic(topic, **kwargs))

    def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        return self._portal.run(self._async.topic_stats(topic))

    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        return self._portal.run(self._async.consume_stats(group, topic))

    def consumer_ids(self, group: str) -> list[str]:
        return self._portal.run(self._async.consumer_ids(group))

    def consumer_connections(self, group: str) -> dict[str, Any]:
        return self._portal.run(self._async.consumer_connections(group))

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

    def __getattr__(self, name: str) -> Any:
        """Every other coroutine method of the asyncio Admin (transactions, DLQ, offsets, ACL) runs blocking too."""
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._async, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._portal.run(attr(*args, **kwargs))

        blocking.__name__ = name
        blocking.__doc__ = attr.__doc__
        return blocking


# -- transactions ------------------------------------------------------------------------------------------------

from txmq.client import transaction as _transaction  # noqa: E402
from txmq.client.transaction import (  # noqa: E402
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
    run_listener_blocking,
)

__all__ += ["TransactionProducer"]


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
        self._portal = get_portal()
        self._async = _transaction.TransactionProducer(group, namesrv_addr, listener, **options)

    @property
    def aio(self) -> _transaction.TransactionProducer:  # type: ignore[override]
        return self._async  # type: ignore[return-value]

    @property
    def listener(self) -> TransactionListener | None:
        return self.aio.listener

    def set_listener(self, listener: TransactionListener) -> None:
        self.aio.set_listener(listener)

    def send_message_in_transaction(
        self, message: Message, arg: Any = None, timeout: float | None = None
    ) -> TransactionSendResult:
        producer = self.aio
        result = self._portal.run(producer.send_half(message, timeout))
        error: BaseException | None = None
        if result.status.value == "SEND_OK":
            assert producer.listener is not None
            state, error = run_listener_blocking(
                producer.listener.execute_local_transaction,
                (message, arg),
                "execute_local_transaction",
                message,
                self._portal.run,
            )
        else:
            state = LocalTransactionState.ROLLBACK
        return self._portal.run(producer.end_transaction(message, result, state, error))
