"""``apache.rocketmq.v2.MessagingService``: one method per RPC, each a thin adapter over the broker's services.

Every answer carries a ``Status`` with the proxy's codes. A refusal (:class:`Refused`) and any unexpected error
become a status on that one call; nothing a client sends takes the door down.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from txmq.acl import permission as perm
from txmq.broker.ha.master import ReplicaWait
from txmq.broker.pop.service import PopError, PopProblem
from txmq.broker.refusal import BrokerRefusal
from txmq.broker.stored import put_status_code
from txmq.broker.topics import retry_topic, validate_group, validate_topic
from txmq.door_grpc import auth
from txmq.door_grpc.convert import (
    PROP_DELIVER_MS,
    PROP_MESSAGE_GROUP,
    MessageProblem,
    body_of,
    duration_ms,
    message_of,
    parse_host,
    record_properties,
    timestamp_ms,
)
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.door_grpc.peers import ACCEPTED_TYPES, queue_permission
from txmq.door_grpc.telemetry import (
    TelemetryStream,
    parse_transaction_id,
    peer_of,
    producer_heartbeat,
    transaction_id,
)
from txmq.errors import is_disk_full
from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import MessageRecord, Prop, java_string_hash
from txmq.txn.effects import DecisionRequest
from txmq.txn.model import By, Decision

if TYPE_CHECKING:
    from txmq.acl.service import AclService
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.ha.gate import ReplicaGate
    from txmq.broker.pop.service import PopService
    from txmq.broker.schedule import ScheduleService
    from txmq.broker.send import SendProcessor
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfig, TopicConfigManager
    from txmq.broker.txn import TransactionService
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.door_grpc")

MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEFAULT_AUTO_RENEW_INVISIBLE_MS = 60_000
MAX_BATCH = 32
LONG_POLL_MARGIN_S = 0.5  # answer this long before the client's deadline

# 4.x refusal codes as 5.x status codes.
_REFUSAL_CODES = {
    ResponseCode.TOPIC_NOT_EXIST: d.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: d.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: d.BAD_REQUEST,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: d.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SERVICE_NOT_AVAILABLE: d.INTERNAL_SERVER_ERROR,
    ResponseCode.FLUSH_DISK_TIMEOUT: d.MASTER_PERSISTENCE_TIMEOUT,
}
# A SYNC_MASTER's decision the slave did not confirm (stored on the master), as RocketMQ's proxy maps them.
_REPLICA_CODES = {
    ResponseCode.FLUSH_SLAVE_TIMEOUT: d.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: d.HA_NOT_AVAILABLE,
}
_RESOLUTIONS = {d.COMMIT: Decision.COMMIT, d.ROLLBACK: Decision.ROLLBACK}
# The core refuses a decision with SYSTEM_ERROR, as RocketMQ does: only these say the broker itself is in trouble.
_SERVER_TROUBLE = frozenset({ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE})
_POP_CODES = {
    PopProblem.BAD_REQUEST: d.BAD_REQUEST,
    PopProblem.INVALID_HANDLE: d.INVALID_RECEIPT_HANDLE,
    PopProblem.NOT_FOUND: d.TOPIC_NOT_FOUND,
    PopProblem.FORBIDDEN: d.FORBIDDEN,
    PopProblem.INTERNAL: d.INTERNAL_SERVER_ERROR,
}


class Malformed:
    """A request whose bytes are not the RPC's protobuf message (what the tolerant parser hands over)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


class Refused(Exception):
    """Answer this call with ``code`` and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int = d.OK, message: str = "OK") -> d.Status:
    return d.Status(code=code, message=message)  # type: ignore[arg-type]


R = TypeVar("R")


def answering(response_type: type[R]) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """A unary method whose :class:`Refused` (or any other error) becomes ``response_type(status=...)``."""

    def wrap(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(method)
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
            try:
                if isinstance(request, Malformed):
                    raise Refused(d.BAD_REQUEST, request.problem)
                return await method(self, request, context)
            except Refused as exc:
                return response_type(status=status(exc.code, exc.message))  # type: ignore[call-arg]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_disk_full(exc):  # expected while the disk is full: said plainly, no traceback
                    log.warning("gRPC %s refused, the disk is full: %s", method.__name__, exc)
                    return response_type(status=status(d.INTERNAL_ERROR, f"the broker's disk is full: {exc}"))  # type: ignore[call-arg]
                log.exception("gRPC %s failed", method.__name__)
                return response_type(status=status(d.INTERNAL_ERROR, f"txmq failed on this request: {exc}"))  # type: ignore[call-arg]

        return call

    return wrap


JAVA_LONG_MAX = 2**63 - 1


def _peer_ip(context: grpc.aio.ServicerContext) -> str:
    return peer_of(context.peer() or "")[0]


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _name(resource: d.Resource, what: str, code: int) -> str:
    name = resource.name
    if not name:
        raise Refused(code, f"the request names no {what}")
    return name


def _group_name(resource: d.Resource) -> str:
    """The consumer group a request names, refused unless it is a valid name: the group may be created
    (autoCreateSubscriptionGroup) and its retry topic written to the store, named after it."""
    group = _name(resource, "consumer group", d.ILLEGAL_CONSUMER_GROUP)
    problem = validate_group(group)
    if problem is not None:
        raise Refused(d.ILLEGAL_CONSUMER_GROUP, problem)
    return group


class MessagingDoor(service_pb2_grpc.MessagingServiceServicer):
    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        send: SendProcessor,
        schedule: ScheduleService,
        pop: PopService,
        transactions: TransactionService,
        clients: ClientRegistry,
        acl: AclService | None,
        delay_levels_ms: list[int],
        endpoints: Callable[[], tuple[str, int]],
        peers: Callable[[str], Awaitable[list[d.MessageQueue]]] | None = None,
        gate: ReplicaGate | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.send = send
        self.schedule = schedule
        self.pop = pop
        self.transactions = transactions
        self.clients = clients
        self.acl = acl
        self.store_host = (config.advertised_ip, config.listen_port)
        self._streams: dict[str, TelemetryStream] = {}  # client id -> its open Telemetry stream
        self.delay_levels_ms = delay_levels_ms
        self.endpoints = endpoints
        self.peers = peers
        self.gate = gate  # the broker's role: a slave or a fenced master refuses writes, a SYNC_MASTER waits

    # -- shared checks ------------------------------------------------------------------------------------------

    def _writable(self) -> None:
        """Refuse a call that writes (a send, a decision, a receipt) on a slave or a fenced master: RocketMQ's
        SLAVE_NOT_AVAILABLE, which the proxy answers as HA_NOT_AVAILABLE."""
        refusal = self.gate.refusal() if self.gate is not None else None
        if refusal is not None:
            raise Refused(d.HA_NOT_AVAILABLE, refusal[1])

    async def _replicated(self) -> d.Status | None:
        """A SYNC_MASTER's wait for its slave after an append: None once the slave has it, else the status to answer
        (the messages are stored on this master either way)."""
        gate = self.gate
        if gate is None or not gate.waits:
            return None
        outcome = await gate.replicated()
        if outcome is ReplicaWait.PUT_OK:
            return None
        if outcome is ReplicaWait.FLUSH_SLAVE_TIMEOUT:
            return status(
                d.SLAVE_PERSISTENCE_TIMEOUT,
                f"stored on the master, but no slave confirmed it within {self.config.sync_flush_timeout} ms",
            )
        if outcome is ReplicaWait.SLAVE_NOT_AVAILABLE:
            return status(d.HA_NOT_AVAILABLE, "stored on the master, but no slave is in sync (SYNC_MASTER)")
        refusal = gate.refusal()
        return status(d.HA_NOT_AVAILABLE, refusal[1] if refusal else "this master was fenced while it waited")

    def _authorize(self, context: grpc.aio.ServicerContext, rpc: str, needed: list[tuple[str, int]]) -> None:
        if self.acl is None:
            return
        try:
            denial = auth.check(self.acl.state, _peer_ip(context), _metadata(context), rpc, needed)
        except Exception as exc:  # a bad header must not take the call handler down
            log.exception("gRPC ACL check failed on %s", rpc)
            raise Refused(d.UNAUTHORIZED, f"access check failed: {exc}") from None
        if denial is not None:
            log.warning("ACL denied gRPC %s from %s: %s", rpc, _peer_ip(context) or "?", denial.reason)
            raise Refused(d.FORBIDDEN if denial.forbidden else d.UNAUTHORIZED, denial.remark)

    def _consume_needs(self, topic: str, group: str) -> list[tuple[str, int]]:
        return [(topic, perm.SUB), (retry_topic(group), perm.SUB)]

    def _broker(self) -> d.Broker:
        host, port = self.endpoints()
        scheme = d.IPv4
        if ":" in host:
            scheme = d.IPv6
        elif not host.replace(".", "").isdigit():
            scheme = d.DOMAIN_NAME
        return d.Broker(
            name=self.config.broker_name,
            id=0,
            endpoints=d.Endpoints(scheme=scheme, addresses=[d.Address(host=host, port=port)]),
        )

    def _topic_config(self, topic: str, *, create: bool) -> TopicConfig:
        problem = validate_topic(topic)
        if problem is not None:
            raise Refused(d.ILLEGAL_TOPIC, problem)
        cfg = self.topics.get(topic)
        if cfg is None and create and self.config.auto_create_topic_enable:
            try:
                cfg = self.send.check_topic(topic)
            except BrokerRefusal as refusal:
                raise Refused(_REFUSAL_CODES.get(refusal.code, d.BAD_REQUEST), refusal.remark) from None
        if cfg is None:
            raise Refused(d.TOPIC_NOT_FOUND, f"topic {topic} does not exist on broker {self.config.broker_name}")
        return cfg

    def _group(self, group: str) -> None:
        sub = self.subscriptions.get(group)
        if sub is None:
            raise Refused(d.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group} does not exist")

    # -- route, heartbeat, assignment, termination ------------------------------------------------------------

    @answering(s.QueryRouteResponse)
    async def QueryRoute(self, request: s.QueryRouteRequest, context: grpc.aio.ServicerContext) -> Any:
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        self._authorize(context, "QueryRoute", [])
        broker = self._broker()
        queues: list[d.MessageQueue] = []
        try:
            cfg = self._topic_config(topic, create=True)
        except Refused as refused:
            if refused.code != d.TOPIC_NOT_FOUND or self.peers is None:
                raise
        else:
            for queue_id in range(cfg.queue_count):
                permission = queue_permission(queue_id, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm)
                queues.append(
                    d.MessageQueue(
                        topic=d.Resource(name=topic, resource_namespace=request.topic.resource_namespace),
                        id=queue_id,
                        permission=permission,
                        broker=broker,
                        accept_message_types=ACCEPTED_TYPES,
                    )
                )
        if self.peers is not None:
            queues.extend(await self.peers(topic))
        if not queues:
            raise Refused(d.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        return s.QueryRouteResponse(status=status(), message_queues=queues)

    @answering(s.HeartbeatResponse)
    async def Heartbeat(self, request: s.HeartbeatRequest, context: grpc.aio.ServicerContext) -> Any:
        if request.group.name:
            _group_name(request.group)
        needed = [(retry_topic(request.group.name), perm.SUB)] if request.group.name else []
        self._authorize(context, "Heartbeat", needed)
        stream = self._streams.get(_metadata(context).get("x-mq-client-id", ""))
        if stream is not None and stream.topics and not stream.closed:
            self._register_producer(stream)
        return s.HeartbeatResponse(status=status())

    def _register_producer(self, stream: TelemetryStream) -> None:
        self.clients.heartbeat(
            stream,
            producer_heartbeat(stream.client_id, stream.topics),
            now=self.clock.monotonic(),
            language=stream.language,
        )

    @answering(s.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: s.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        self._authorize(context, "NotifyClientTermination", [])
        return s.NotifyClientTerminationResponse(status=status())

    @answering(s.QueryAssignmentResponse)
    async def QueryAssignment(self, request: s.QueryAssignmentRequest, context: grpc.aio.ServicerContext) -> Any:
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        group = _group_name(request.group)
        self._authorize(context, "QueryAssignment", self._consume_needs(topic, group))
        self._group(group)
        assignments: list[s.Assignment] = []
        queues: list[d.MessageQueue] = []
        try:
            cfg = self._topic_config(topic, create=False)
            if cfg.readable:
                queues.append(
                    d.MessageQueue(
                        topic=request.topic,
                        id=-1,
                        permission=d.READ_WRITE,
                        broker=self._broker(),
                        accept_message_types=ACCEPTED_TYPES,
                    )
                )
        except Refused as refused:
            if refused.code != d.TOPIC_NOT_FOUND or self.peers is None:
                raise
        if self.peers is not None:
            seen = {self.config.broker_name}
            for mq in await self.peers(topic):
                if mq.broker.name not in seen and mq.permission in (d.READ, d.READ_WRITE):
                    seen.add(mq.broker.name)
                    peer = d.MessageQueue()
                    peer.CopyFrom(mq)
                    peer.id = -1
                    queues.append(peer)
        if not queues:
            raise Refused(d.TOPIC_NOT_FOUND, f"topic {topic} has no readable queue")
        assignments = [d.Assignment(message_queue=mq) for mq in queues]
        return s.QueryAssignmentResponse(status=status(), assignments=assignments)

    # -- telemetry ----------------------------------------------------------------------------------------------

    def settings_for(self, client: d.Settings) -> d.Settings:
        """What the proxy answers to a client's Settings: the broker's limits and the group's retry policy."""
        reply = d.Settings()
        reply.CopyFrom(client)
        if client.WhichOneof("pub_sub") == "publishing":
            reply.publishing.max_body_size = self.config.max_message_size
            reply.publishing.validate_message_type = True
            reply.backoff_policy.CopyFrom(
                d.RetryPolicy(
                    max_attempts=3,
                    exponential_backoff=d.ExponentialBackoff(
                        initial=Duration(nanos=10_000_000), max=Duration(seconds=1), multiplier=2.0
                    ),
                )
            )
        elif client.WhichOneof("pub_sub") == "subscription":
            group = client.subscription.group.name
            policy = self.pop.retry_policy(group)
            reply.backoff_policy.CopyFrom(
                d.RetryPolicy(
                    max_attempts=policy.max_attempts,
                    customized_backoff=d.CustomizedBackoff(
                        next=[Duration(seconds=max(1, ms // 1000)) for ms in policy.backoff_ms]
                    ),
                )
            )
            sub = self.subscriptions.get(group)
            reply.subscription.fifo = bool(sub is not None and sub.consume_message_orderly)
            reply.subscription.receive_batch_size = MAX_BATCH
            if not client.subscription.HasField("long_polling_timeout"):
                millis = self.config.grpc_push_long_polling_mills
                reply.subscription.long_polling_timeout.CopyFrom(
                    Duration(seconds=millis // 1000, nanos=millis % 1000 * 1_000_000)
                )
        return reply

    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Answers the client's Settings and stays open: a producer's stream carries the broker's transaction checks
        (``recover_orphaned_transaction_command``), so it is registered as a producer of each topic it publishes."""
        try:
            self._authorize(context, "Telemetry", [])
        except Refused as refused:
            yield s.TelemetryCommand(status=status(refused.code, refused.message))
            return
        meta = _metadata(context)
        stream = TelemetryStream(
            meta.get("x-mq-client-id", "") or context.peer(),
            peer_of(context.peer() or ""),
            meta.get("x-mq-language", "") or "UNKNOWN",
            self.store_host,
        )
        self._streams[stream.client_id] = stream
        reader = asyncio.create_task(self._read_telemetry(request_iterator, stream), name="txmq-grpc-telemetry")
        try:
            while True:
                command = await stream.outbox.get()
                if command is None:
                    break
                yield command
        finally:
            stream.closed = True
            reader.cancel()
            self.clients.connection_closed(stream)
            if self._streams.get(stream.client_id) is stream:
                del self._streams[stream.client_id]

    @staticmethod
    def _settings_problem(settings: d.Settings) -> tuple[int, str] | None:
        """Why a client's Settings cannot be taken (a topic or group name that is not one), or None."""
        if settings.WhichOneof("pub_sub") == "publishing":
            for topic in settings.publishing.topics:
                problem = validate_topic(topic.name)
                if problem is not None:
                    return d.ILLEGAL_TOPIC, problem
        elif settings.WhichOneof("pub_sub") == "subscription":
            problem = validate_group(settings.subscription.group.name)
            if problem is not None:
                return d.ILLEGAL_CONSUMER_GROUP, problem
        return None

    async def _read_telemetry(self, request_iterator: AsyncIterator[Any], stream: TelemetryStream) -> None:
        try:
            async for command in request_iterator:
                if isinstance(command, Malformed):
                    stream.outbox.put_nowait(s.TelemetryCommand(status=status(d.BAD_REQUEST, command.problem)))
                    continue
                if command.WhichOneof("command") != "settings":
                    continue  # answers to commands txmq never sends (stack traces, message verification)
                settings = command.settings
                problem = self._settings_problem(settings)
                if problem is not None:
                    stream.outbox.put_nowait(s.TelemetryCommand(status=status(*problem)))
                    continue
                if settings.WhichOneof("pub_sub") == "publishing":
                    stream.topics = sorted({t.name for t in settings.publishing.topics if t.name})
                    if stream.topics:
                        self._register_producer(stream)
                stream.outbox.put_nowait(s.TelemetryCommand(status=status(), settings=self.settings_for(settings)))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading the Telemetry stream of %s failed", stream.client_id)
        finally:
            stream.close()

    # -- send -----------------------------------------------------------------------------------------------------

    @answering(s.SendMessageResponse)
    async def SendMessage(self, request: s.SendMessageRequest, context: grpc.aio.ServicerContext) -> Any:
        if not request.messages:
            raise Refused(d.BAD_REQUEST, "SendMessage carries no message")
        self._writable()
        if self.acl is not None:
            topics = {m.topic.name for m in request.messages}
            self._authorize(context, "SendMessage", [(t, perm.PUB) for t in topics])
        futures = []
        for message in request.messages:
            try:
                futures.append(self._store(message, context))
            except Refused as refused:
                futures.append(refused)
        entries = []
        for message, pending in zip(request.messages, futures, strict=True):
            message_id = message.system_properties.message_id
            if isinstance(pending, Refused):
                entries.append(s.SendResultEntry(status=status(pending.code, pending.message), message_id=message_id))
                continue
            result = await pending
            code = put_status_code(result)
            if code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
                tx_id = ""
                if message.system_properties.message_type == d.TRANSACTION:
                    tx_id = transaction_id(self.store_host, result.physical_offset, result.queue_offset)
                entries.append(
                    s.SendResultEntry(
                        status=status(), message_id=message_id, transaction_id=tx_id, offset=result.queue_offset
                    )
                )
            else:
                entries.append(
                    s.SendResultEntry(
                        status=status(
                            _REFUSAL_CODES.get(code, d.INTERNAL_SERVER_ERROR), f"storing failed: {result.status.value}"
                        ),
                        message_id=message_id,
                    )
                )
        if any(e.status.code == d.OK for e in entries):
            unreplicated = await self._replicated()
            if unreplicated is not None:
                for e in entries:
                    if e.status.code == d.OK:
                        e.status.CopyFrom(unreplicated)
        codes = {e.status.code for e in entries}
        overall = (
            entries[0].status if len(codes) == 1 else status(d.MULTIPLE_RESULTS, "the messages had different results")
        )
        return s.SendMessageResponse(status=overall, entries=entries)

    def _delay_level(self, delay_ms: int) -> int:
        """The smallest delay level that waits at least ``delay_ms`` (the last level when none does): delivery
        times map onto the broker's delay levels, never earlier than asked."""
        for level, level_ms in enumerate(self.delay_levels_ms, 1):
            if level_ms >= delay_ms:
                return level
        return len(self.delay_levels_ms)

    def _store(self, message: d.Message, context: grpc.aio.ServicerContext) -> Awaitable[Any]:
        topic = message.topic.name
        sp = message.system_properties
        transactional = sp.message_type == d.TRANSACTION
        if transactional and (sp.HasField("delivery_timestamp") or sp.message_group):
            raise Refused(
                d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                "a transactional message cannot have a delivery time or a message group",
            )
        if transactional and self.config.reject_transaction_message:
            raise Refused(
                d.FORBIDDEN,
                f"broker {self.config.broker_name} takes no transactional messages (rejectTransactionMessage=true)",
            )
        try:
            cfg = self.send.check_topic(topic)
        except BrokerRefusal as refusal:
            raise Refused(_REFUSAL_CODES.get(refusal.code, d.BAD_REQUEST), refusal.remark) from None
        try:
            body = body_of(message, self.config.max_message_size)
            props = record_properties(message)
        except MessageProblem as problem:
            raise Refused(problem.code, str(problem)) from None
        props[Prop.CLUSTER] = self.config.broker_cluster_name
        writable = max(1, cfg.write_queue_nums)
        group = props.get(PROP_MESSAGE_GROUP)
        if group:
            queue_id = (java_string_hash(group) & 0x7FFFFFFF) % writable  # one queue per message group
        elif 0 <= sp.queue_id < writable:
            queue_id = sp.queue_id
        else:
            queue_id = zlib.crc32(sp.message_id.encode()) % writable
        born_ms = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else self.clock.now_ms()
        if not 0 <= born_ms <= JAVA_LONG_MAX:
            raise Refused(d.BAD_REQUEST, f"born_timestamp ({born_ms} ms) is not a time a record can hold")
        record = MessageRecord(
            topic=topic,
            body=body,
            queue_id=queue_id,
            born_timestamp=born_ms,
            # The client's own address when it names none (the official clients name one).
            born_host=parse_host(sp.born_host or _peer_ip(context) or "127.0.0.1"),
            store_host=(self.config.advertised_ip, self.config.listen_port),
            properties=props,
        )
        if transactional:
            # As the proxy does: the topic is the producer group, which the broker's checks go to.
            props[Prop.TRAN_MSG] = "true"
            props[Prop.PGROUP] = topic
            immunity = sp.orphaned_transaction_recovery_duration.seconds
            if sp.HasField("orphaned_transaction_recovery_duration") and immunity > 0:
                props[Prop.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(immunity)
            try:
                return self.transactions.prepare(record)
            except BrokerRefusal as refusal:
                raise Refused(_REFUSAL_CODES.get(refusal.code, d.INTERNAL_SERVER_ERROR), refusal.remark) from None
        if sp.HasField("delivery_timestamp"):
            if group:
                raise Refused(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message cannot have a delivery time")
            deliver_ms = timestamp_ms(sp.delivery_timestamp)
            if deliver_ms > JAVA_LONG_MAX:  # TIMER_DELIVER_MS would be a number no client parses
                raise Refused(d.ILLEGAL_DELIVERY_TIME, f"delivery_timestamp ({deliver_ms} ms) is beyond any time")
            delay_ms = deliver_ms - self.clock.now_ms()
            if delay_ms > 0 and self.delay_levels_ms:
                props[PROP_DELIVER_MS] = str(deliver_ms)
                record = self.schedule.redirect(record, self._delay_level(delay_ms))
        return self.store.put_future(record)

    # -- consume ------------------------------------------------------------------------------------------------

    def _tags(self, expression: d.FilterExpression) -> frozenset[str] | None:
        if expression.type == d.SQL:
            raise Refused(d.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported by txmq's gRPC door yet")
        text = expression.expression.strip()
        if not text or text == "*":
            return None
        return frozenset(t.strip() for t in text.split("||") if t.strip())

    async def ReceiveMessage(
        self, request: s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[s.ReceiveMessageResponse]:
        try:
            if isinstance(request, Malformed):
                raise Refused(d.BAD_REQUEST, request.problem)
            received = await self._receive(request, context)
        except Refused as refused:
            yield s.ReceiveMessageResponse(status=status(refused.code, refused.message))
            return
        except PopError as exc:
            yield s.ReceiveMessageResponse(status=status(_POP_CODES[exc.problem], exc.message))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("gRPC ReceiveMessage failed")
            yield s.ReceiveMessageResponse(status=status(d.INTERNAL_ERROR, f"txmq failed on this request: {exc}"))
            return
        topic = request.message_queue.topic.name
        if not received:
            yield s.ReceiveMessageResponse(status=status(d.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield s.ReceiveMessageResponse(status=status())
        # When the broker handed them over: consumers measure their receive latency from it (the 5.x Python push
        # consumer fails on a batch without it).
        now_ms = self.clock.now_ms()
        yield s.ReceiveMessageResponse(
            delivery_timestamp=Timestamp(seconds=now_ms // 1000, nanos=now_ms % 1000 * 1_000_000)
        )
        for item in received:
            origin = item.record.properties.get(Prop.RETRY_TOPIC) or topic
            yield s.ReceiveMessageResponse(
                message=message_of(
                    item.record,
                    topic=origin,
                    receipt_handle=item.handle,
                    delivery_attempt=item.delivery_attempt,
                    invisible_ms=item.invisible_ms,
                )
            )

    async def _receive(self, request: s.ReceiveMessageRequest, context: grpc.aio.ServicerContext) -> list[Any]:
        topic = _name(request.message_queue.topic, "topic", d.ILLEGAL_TOPIC)
        group = _group_name(request.group)
        self._authorize(context, "ReceiveMessage", self._consume_needs(topic, group))
        self._writable()
        self._topic_config(topic, create=False)
        self._group(group)
        tags = self._tags(request.filter_expression)
        if request.HasField("invisible_duration"):
            invisible_ms = duration_ms(request.invisible_duration)
        elif request.auto_renew:
            invisible_ms = DEFAULT_AUTO_RENEW_INVISIBLE_MS
        else:
            raise Refused(d.ILLEGAL_INVISIBLE_TIME, "the request has no invisible_duration")
        low = self.config.min_invisible_time_mills_for_recv
        if not low <= invisible_ms <= MAX_INVISIBLE_MS:
            raise Refused(
                d.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration {invisible_ms} ms is outside [{low}, {MAX_INVISIBLE_MS}] ms",
            )
        wait_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        remaining = context.time_remaining()
        wait = wait_ms / 1000
        if remaining is not None:
            wait = min(wait, max(0.0, remaining - LONG_POLL_MARGIN_S))
        batch = min(max(1, request.batch_size or 1), MAX_BATCH)
        return await self.pop.receive(
            group, topic, tags=tags, batch=batch, invisible_ms=invisible_ms, wait_seconds=wait
        )

    @answering(s.AckMessageResponse)
    async def AckMessage(self, request: s.AckMessageRequest, context: grpc.aio.ServicerContext) -> Any:
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        group = _group_name(request.group)
        self._authorize(context, "AckMessage", self._consume_needs(topic, group))
        self._writable()
        if not request.entries:
            raise Refused(d.BAD_REQUEST, "AckMessage carries no entry")
        results = []
        for entry in request.entries:
            try:
                await self.pop.ack(group, entry.receipt_handle)
                result = status()
            except PopError as exc:
                result = status(_POP_CODES[exc.problem], exc.message)
            results.append(
                s.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=result)
            )
        codes = {r.status.code for r in results}
        overall = (
            results[0].status if len(codes) == 1 else status(d.MULTIPLE_RESULTS, "the entries had different results")
        )
        return s.AckMessageResponse(status=overall, entries=results)

    @answering(s.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: s.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        group = _group_name(request.group)
        self._authorize(context, "ChangeInvisibleDuration", self._consume_needs(topic, group))
        self._writable()
        invisible_ms = duration_ms(request.invisible_duration)
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise Refused(d.ILLEGAL_INVISIBLE_TIME, f"invisible_duration {invisible_ms} ms is out of range")
        try:
            handle = await self.pop.change_invisible(group, request.receipt_handle, invisible_ms)
        except PopError as exc:
            raise Refused(_POP_CODES[exc.problem], exc.message) from None
        return s.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)

    @answering(s.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: s.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        group = _group_name(request.group)
        self._authorize(context, "ForwardMessageToDeadLetterQueue", self._consume_needs(topic, group))
        self._writable()
        reason = (
            f"forwarded by the consumer after {request.delivery_attempt} of {request.max_delivery_attempts} attempts"
        )
        try:
            await self.pop.dead_letter(group, request.receipt_handle, reason)
        except PopError as exc:
            raise Refused(_POP_CODES[exc.problem], exc.message) from None
        return s.ForwardMessageToDeadLetterQueueResponse(status=status())

    # -- not served yet -----------------------------------------------------------------------------------------

    @answering(s.EndTransactionResponse)
    async def EndTransaction(self, request: s.EndTransactionRequest, context: grpc.aio.ServicerContext) -> Any:
        """COMMIT or ROLLBACK from the producer (SOURCE_CLIENT) or as a check's answer (SOURCE_SERVER_CHECK), decided
        by the transaction core under the same rules as the 4.x door: the first decision wins."""
        topic = _name(request.topic, "topic", d.ILLEGAL_TOPIC)
        self._authorize(context, "EndTransaction", [(topic, perm.PUB)])
        self._writable()
        try:
            phys, queue_offset = parse_transaction_id(request.transaction_id)
        except ValueError as exc:
            raise Refused(d.INVALID_TRANSACTION_ID, str(exc)) from None
        decision = _RESOLUTIONS.get(request.resolution)
        from_check = request.source == d.SOURCE_SERVER_CHECK
        group = topic  # the producer group of a 5.x transactional message (see _store)
        if from_check:
            self.transactions.note_answer(phys, group, decision.name if decision is not None else "UNKNOWN")
        if decision is None:
            return s.EndTransactionResponse(
                status=status(d.OK, "transaction state unknown; the broker will check it later")
            )
        req = DecisionRequest(
            phys,
            decision,
            By.CHECK if from_check else By.PRODUCER,
            group,
            queue_offset,
            request.message_id or request.transaction_id,
            request.transaction_id,
            _peer_ip(context),
        )
        outcome = self.transactions.decide(req)
        code, remark = outcome if isinstance(outcome, tuple) else await outcome
        if code == ResponseCode.SUCCESS:
            return s.EndTransactionResponse(status=status(d.OK, remark or "OK"))
        grpc_code = _REPLICA_CODES.get(code) or (d.INTERNAL_SERVER_ERROR if code in _SERVER_TROUBLE else d.BAD_REQUEST)
        return s.EndTransactionResponse(status=status(grpc_code, remark or f"refused ({code})"))

    @answering(s.UpdateOffsetResponse)
    async def UpdateOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Refused(d.NOT_IMPLEMENTED, "UpdateOffset is not served by txmq's gRPC door")

    @answering(s.GetOffsetResponse)
    async def GetOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Refused(d.NOT_IMPLEMENTED, "GetOffset is not served by txmq's gRPC door")

    @answering(s.QueryOffsetResponse)
    async def QueryOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Refused(d.NOT_IMPLEMENTED, "QueryOffset is not served by txmq's gRPC door")

    @answering(s.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Refused(d.NOT_IMPLEMENTED, "RecallMessage is not served by txmq's gRPC door")

    @answering(s.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Refused(d.NOT_IMPLEMENTED, "lite topics are not served by txmq's gRPC door")

    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        yield s.PullMessageResponse(status=status(d.NOT_IMPLEMENTED, "PullMessage is not served by txmq's gRPC door"))
