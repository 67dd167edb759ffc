"""The asyncio :class:`Producer`: sync-style, fire-and-forget (task/callback), oneway, orderly and batch sends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from txmq.client.instance import ClientInstance
from txmq.client.lifecycle import ClientLifecycle
from txmq.client.message import (
    DEFAULT_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    compress_body,
)
from txmq.client.request_reply import ReplyWaiters, is_reply, mark_request
from txmq.client.selection import RETRYABLE_SEND_CODES, QueueRoundRobin, QueueSelector, select_by_hash
from txmq.client.wire import SendTemplate, request_command, send_result, send_v2_ext
from txmq.errors import MQBrokerError, MQClientError, RemotingError, RequestTimeoutError
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import BatchEntry, Prop, SysFlag, UniqKeyGenerator, encode_batch, encode_properties
from txmq.protocol.topics import NOT_ALLOWED_SEND_TOPICS

_COMPRESSED = int(SysFlag.COMPRESSED)  # plain ints: an int | IntFlag goes through enum's slow __ror__
_TRANSACTION_PREPARED = int(SysFlag.TRANSACTION_PREPARED)
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_REPLY_MESSAGE_V2 = int(RequestCode.SEND_REPLY_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)
log = logging.getLogger("txmq.client")

_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_LENGTH = 127
# Topics the broker refuses to take sends for (wire §2.3 step 2), plus the auto-create template.
_NOT_ALLOWED_SEND_TOPICS = NOT_ALLOWED_SEND_TOPICS | {DEFAULT_TOPIC}
_TEMPLATES_MAX = 1024  # per producer: the topics whose send extFields are kept made

SendCallback = Callable[[SendResult | None, BaseException | None], Any]
"""``callback(result, None)`` after a successful async send, ``callback(None, exc)`` after a failed one."""


def check_group(group: str) -> None:
    if not group or not _TOPIC_RE.match(group) or len(group) > 255:
        raise MQClientError(f"group name {group!r} is empty, too long or has characters outside [%|a-zA-Z0-9_-]")


_VALID_TOPICS: set[str] = set()  # names check_topic passed: the same few topics come with every message
_VALID_TOPICS_MAX = 4096


def check_topic(topic: str) -> None:
    if topic in _VALID_TOPICS:
        return
    if not topic or not topic.strip():
        raise MQClientError("The specified topic is blank")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise MQClientError(f"The specified topic is longer than topic max length {MAX_TOPIC_LENGTH}.")
    if not _TOPIC_RE.match(topic):
        raise MQClientError(
            f"The specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    if len(_VALID_TOPICS) >= _VALID_TOPICS_MAX:
        _VALID_TOPICS.clear()
    _VALID_TOPICS.add(topic)


def check_message(msg: Message, max_size: int) -> None:
    if not isinstance(msg, Message):
        raise MQClientError(f"expected a Message, got {type(msg).__name__}")
    check_topic(msg.topic)
    if msg.topic in _NOT_ALLOWED_SEND_TOPICS:
        raise MQClientError(f"Sending message to topic[{msg.topic}] is forbidden.")
    if not isinstance(msg.flag, int):
        raise MQClientError(f"the message flag must be an int, not {type(msg.flag).__name__}")
    if not msg.body:
        raise MQClientError("the message body length is zero")
    if len(msg.body) > max_size:
        raise MQClientError(f"the message body size over max value, MAX: {max_size}")


class Producer(ClientLifecycle):
    """Sends messages to a producer group's topics.

    ``async with Producer("PG", "127.0.0.1:9876") as p: await p.send(Message("T", b"hi"))``. Client options
    (``instance_name``, ``access_key``/``secret_key``, ``clock``, timer intervals) are passed through to
    :class:`~txmq.client.config.ClientConfig`.
    """

    _what = "producer"

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str] | None = None,
        *,
        send_msg_timeout: float = 3.0,
        retry_times_when_send_failed: int = 2,
        compress_msg_body_over_howmuch: int = 4096,
        compress_level: int = 5,
        max_message_size: int = 4 * 1024 * 1024,
        default_topic_queue_nums: int = 4,
        auto_create_topic: bool = True,
        **options: Any,
    ) -> None:
        check_group(group)
        super().__init__(namesrv_addr, **options)
        self.group = group
        self.send_msg_timeout = send_msg_timeout
        self.retry_times_when_send_failed = max(0, retry_times_when_send_failed)
        self.compress_msg_body_over_howmuch = compress_msg_body_over_howmuch
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.auto_create_topic = auto_create_topic
        self._round_robins: dict[str, QueueRoundRobin] = {}
        self._templates: dict[str, SendTemplate] = {}
        self._templates_made_for = (group, default_topic_queue_nums)
        self._topics: set[str] = set()
        self._uniq: UniqKeyGenerator | None = None
        self._pending: set[asyncio.Task[Any]] = set()

    @classmethod
    def _for_instance(cls, group: str, instance: ClientInstance) -> Producer:
        """A producer living on an existing instance (the instance's inner producer)."""
        producer = cls(group)
        producer.config = instance.config
        producer._lent_instance = instance
        return producer

    # -- lifecycle (ClientLifecycle) ------------------------------------------------------------------------------

    def _attach(self, instance: ClientInstance) -> None:
        instance.register_producer(self)
        self._uniq = UniqKeyGenerator(instance.config.resolved_ip())

    async def _on_started(self) -> None:
        await self.instance.send_heartbeat_to_all()

    async def _detach(self, instance: ClientInstance) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await instance.unregister_producer(self.group)

    def published_topics(self) -> set[str]:
        return set(self._topics)

    # -- public sends -------------------------------------------------------------------------------------------

    async def send(
        self,
        msg: Message,
        timeout: float | None = None,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """Send and wait for the broker's answer.

        Without ``selector`` or ``queue``, a failed attempt (connection error, timeout, or codes 17/14/1/16/204/205)
        is retried on another broker up to ``retry_times_when_send_failed`` times within ``timeout``. With a
        ``selector(queues, msg, arg)`` or an explicit ``queue`` the send is orderly and is not moved elsewhere.
        """
        check_message(msg, self.max_message_size)
        result = await self._send(msg, timeout, selector=selector, arg=arg, queue=queue, oneway=False)
        assert result is not None
        return result

    async def send_orderly(self, msg: Message, sharding_key: Any, timeout: float | None = None) -> SendResult:
        """Send so that every message with the same ``sharding_key`` goes to the same queue (hash selector)."""
        return await self.send(msg, timeout, selector=select_by_hash, arg=sharding_key)

    async def request(
        self,
        msg: Message,
        timeout: float = 3.0,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> MessageExt:
        """Send ``msg`` as a request and wait for its reply (RocketMQ's request-reply): the consumer that gets it
        answers with :func:`txmq.client.request_reply.create_reply`. Raises :class:`RequestTimeoutError` when no
        reply comes within ``timeout`` seconds (sending included)."""
        check_message(msg, self.max_message_size)
        instance = self.instance
        clock = instance.clock
        deadline = clock.monotonic() + timeout
        waiters = ReplyWaiters.of(instance)
        correlation_id = mark_request(msg, instance.client_id, timeout)
        if instance.route(msg.topic) is None:
            # As Java's request(): learn the topic's brokers, then heartbeat them, so that a broker knows this
            # client's connection by the time the reply comes.
            await instance.get_publish_route(msg.topic, self.default_topic_queue_nums, self.auto_create_topic)
            await instance.send_heartbeat_to_all()
        future = waiters.expect(correlation_id)
        try:
            await self.send(msg, max(deadline - clock.monotonic(), 0.001), selector=selector, arg=arg)
        except BaseException:
            waiters.forget(correlation_id)
            raise
        return await waiters.wait(correlation_id, future, deadline - clock.monotonic())

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        timeout: float | None = None,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> asyncio.Task[SendResult]:
        """Start a send without waiting: returns the task; ``callback(result, exc)`` runs when it finishes.

        The message is checked now, so an invalid message raises here rather than in the task.
        """
        check_message(msg, self.max_message_size)
        _ = self.instance
        task = asyncio.ensure_future(self.send(msg, timeout, selector=selector, arg=arg))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if callback is not None:
            task.add_done_callback(lambda t: _run_callback(callback, t))
        return task

    send_nowait = send_async

    async def send_oneway(
        self,
        msg: Message,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
        queue: MessageQueue | None = None,
    ) -> None:
        """Write the message and return without any answer from the broker (no retry, no result)."""
        check_message(msg, self.max_message_size)
        await self._send(msg, None, selector=selector, arg=arg, queue=queue, oneway=True)

    async def send_batch(
        self, msgs: Sequence[Message], timeout: float | None = None, *, queue: MessageQueue | None = None
    ) -> SendResult:
        """Send messages of one topic in one SEND_BATCH_MESSAGE request; they get consecutive queue offsets.

        ``msg_id`` and ``offset_msg_id`` of the result join the per-message ids with commas, as RocketMQ does.
        """
        msgs = list(msgs)
        if not msgs:
            raise MQClientError("a batch needs at least one message")
        topic = msgs[0].topic
        for m in msgs:
            check_message(m, self.max_message_size)
            if m.topic != topic:
                raise MQClientError(f"all messages of a batch must have the same topic ({topic!r} != {m.topic!r})")
            if m.delay_level > 0:
                raise MQClientError("delayed messages cannot be sent in a batch")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise MQClientError("retry-group messages cannot be sent in a batch")
            if m.wait_store_msg_ok != msgs[0].wait_store_msg_ok:
                raise MQClientError("all messages of a batch must agree on wait_store_msg_ok")
        uniq_keys = [self._ensure_uniq_key(m) for m in msgs]
        body = encode_batch([BatchEntry(m.body, m.flag, encode_properties(m.properties)) for m in msgs])
        if len(body) > self.max_message_size:
            raise MQClientError(f"the batch is {len(body)} bytes, over the {self.max_message_size}-byte limit")
        batch_msg = Message(topic, body)
        result = await self._send(
            batch_msg, timeout, queue=queue, oneway=False, batch_body=body, batch_ids=",".join(uniq_keys)
        )
        assert result is not None
        return result

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        check_topic(topic)
        route = await self.instance.get_publish_route(topic, self.default_topic_queue_nums, self.auto_create_topic)
        return route.publish_queues()

    # -- internals ----------------------------------------------------------------------------------------------

    def _ensure_uniq_key(self, msg: Message) -> str:
        # Set once and kept across retries, so a message retried after a lost answer keeps its id.
        key = msg.properties.get(Prop.UNIQ_KEY)
        if not key:
            assert self._uniq is not None
            key = self._uniq.next(self.instance.clock.now_ms())
            msg.properties[Prop.UNIQ_KEY] = key
        return key

    async def _send(
        self,
        msg: Message,
        timeout: float | None,
        *,
        selector: QueueSelector | None = None,
        arg: Any = None,
        queue: MessageQueue | None = None,
        oneway: bool,
        batch_body: bytes | None = None,
        batch_ids: str | None = None,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
    ) -> SendResult | None:
        # Every send runs through here, so the common case stays in this one coroutine: the route, the broker's
        # address and its connection are read from the instance's caches, and only what is missing is awaited.
        instance = self.instance
        clock = instance.clock
        timeout = self.send_msg_timeout if timeout is None else timeout
        deadline = clock.monotonic() + timeout
        topic = msg.topic
        self._topics.add(topic)
        uniq_key = batch_ids if batch_ids is not None else self._ensure_uniq_key(msg)
        fixed = queue is not None or selector is not None
        attempts = 1 if (oneway or fixed) else 1 + self.retry_times_when_send_failed
        avoid: list[str] = []
        last_error: BaseException | None = None
        for attempt in range(attempts):
            remaining = deadline - clock.monotonic() if attempt else timeout
            if remaining <= 0 and not oneway:
                break
            route = instance.route(topic)
            if route is None:
                route = await instance.get_publish_route(topic, self.default_topic_queue_nums, self.auto_create_topic)
            queues = route.publish_queues()
            if not queues:
                # No master in the cached route (one failed over): ask the name server again, as RocketMQ's
                # tryToFindTopicPublishInfo does when the publish info is not ok, instead of waiting for the poll.
                with contextlib.suppress(RemotingError, MQClientError):
                    route = await instance.update_route(topic)
                    queues = route.publish_queues()
            if not queues:
                raise MQClientError(f"topic {topic} has no writable queue on any broker")
            mq = self._choose_queue(msg, queues, selector, arg, queue, avoid)
            addr = instance.find_broker_addr(mq.broker_name)
            if addr is None:
                addr = await instance.find_broker_addr_refreshing(mq.broker_name, topic)
            if addr is None:
                last_error = MQClientError(f"the broker {mq.broker_name} of topic {topic} has no known master")
                avoid.append(mq.broker_name)
                continue
            cmd = self._send_command(mq, msg, batch_body, reconsume_times, max_reconsume_times, oneway)
            try:
                conn = instance.open_connection(addr)
                if conn is None:
                    conn = await instance.connection(addr)
                if oneway:
                    conn.send_oneway(instance.sign(cmd))
                    return None
                response = await conn.request(instance.sign(cmd), max(remaining, 0.001))
                return send_result(response, mq, uniq_key, addr)
            except MQBrokerError as exc:
                if exc.code not in RETRYABLE_SEND_CODES:
                    raise
                last_error = exc
            except RemotingError as exc:
                last_error = exc
            avoid.append(mq.broker_name)
            instance.refresh_route_soon(topic)  # the failure may mean the route changed
            if attempt + 1 < attempts:
                log.info("send of %s to %s failed (%s); retrying on another broker", uniq_key, mq, last_error)
        if last_error is None:
            raise RequestTimeoutError(f"sending to {topic} timed out after {timeout:g}s")
        raise last_error

    def _choose_queue(
        self,
        msg: Message,
        queues: list[MessageQueue],
        selector: QueueSelector | None,
        arg: Any,
        queue: MessageQueue | None,
        avoid: list[str],
    ) -> MessageQueue:
        if queue is not None:
            if queue.topic != msg.topic:
                raise MQClientError(f"queue {queue} does not belong to topic {msg.topic}")
            return queue
        if selector is not None:
            chosen = selector(queues, msg, arg)
            if not isinstance(chosen, MessageQueue):
                raise MQClientError(f"the queue selector returned {chosen!r}, not a MessageQueue")
            return chosen
        rr = self._round_robins.get(msg.topic)
        if rr is None:
            rr = self._round_robins[msg.topic] = QueueRoundRobin()
        return rr.select(queues, avoid)

    def _send_command(
        self,
        mq: MessageQueue,
        msg: Message,
        batch_body: bytes | None,
        reconsume_times: int | None,
        max_reconsume_times: int | None,
        oneway: bool,
    ) -> RemotingCommand:
        """SEND_MESSAGE_V2 (SEND_BATCH_MESSAGE for a batch, SEND_REPLY_MESSAGE_V2 for a reply) of ``msg`` to
        ``mq``."""
        if batch_body is None and not reconsume_times and max_reconsume_times is None:
            # A plain send: the topic's template has the extFields that never change.
            made_for = (self.group, self.default_topic_queue_nums)
            if made_for != self._templates_made_for:  # both are public attributes: a change makes new templates
                self._templates.clear()
                self._templates_made_for = made_for
            template = self._templates.get(msg.topic)
            if template is None:
                if len(self._templates) >= _TEMPLATES_MAX:
                    self._templates.clear()
                template = self._templates[msg.topic] = SendTemplate(
                    self.group, msg.topic, self.default_topic_queue_nums
                )
            return template.command(
                mq.queue_id,
                msg.body,
                msg.properties,
                int(msg.flag),
                self.instance.clock.now_ms(),
                self.compress_msg_body_over_howmuch,
                self.compress_level,
                oneway,
            )
        sys_flag = 0
        if batch_body is not None:
            body = batch_body
            properties: str | None = None  # each entry carries its own; batch-level ones would be appended to all
            code = _SEND_BATCH_MESSAGE
        else:
            body = msg.body
            if len(body) > self.compress_msg_body_over_howmuch:
                packed = compress_body(body, self.compress_level)
                if len(packed) < len(body):
                    body = packed
                    sys_flag |= _COMPRESSED
            props = msg.properties
            properties = encode_properties(props)
            if props.get(Prop.TRAN_MSG) == "true":
                # A half message: brokers route it to the transaction half topic (Java sets this bit the same way).
                sys_flag |= _TRANSACTION_PREPARED
            code = _SEND_REPLY_MESSAGE_V2 if is_reply(msg) else _SEND_MESSAGE_V2
        ext = send_v2_ext(
            self.group,
            msg.topic,
            self.default_topic_queue_nums,
            mq.queue_id,
            sys_flag,
            self.instance.clock.now_ms(),
            int(msg.flag),
            properties,
            reconsume_times or 0,
            max_reconsume_times,
            batch_body is not None,
        )
        return request_command(code, ext, body, oneway)

    async def _send_retry_copy(
        self, msg: Message, reconsume_times: int, max_reconsume_times: int, timeout: float | None = None
    ) -> SendResult:
        """Send a consumer's failed message to its retry topic (the fallback when CONSUMER_SEND_MSG_BACK fails)."""
        result = await self._send(
            msg, timeout, oneway=False, reconsume_times=reconsume_times, max_reconsume_times=max_reconsume_times
        )
        assert result is not None
        return result


def _run_callback(callback: SendCallback, task: asyncio.Task[SendResult]) -> None:
    try:
        if task.cancelled():
            callback(None, asyncio.CancelledError())
        elif (exc := task.exception()) is not None:
            callback(None, exc)
        else:
            callback(task.result(), None)
    except Exception:
        log.exception("send callback %r failed", callback)
