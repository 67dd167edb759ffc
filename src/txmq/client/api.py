"""Request builders and response parsers for every call the client makes (RocketMQ's MQClientAPIImpl).

Each method builds one remoting command, sends it through the owning :class:`~txmq.client.instance.ClientInstance`
(which signs it and picks the connection) and turns the answer into Python values or an
:class:`~txmq.errors.MQBrokerError` carrying the broker's code and remark. Sends and END_TRANSACTION, once per
message, are built and read by :mod:`txmq.client.wire` (compiled) and sent by the producer itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from txmq.client import fastjson
from txmq.client.message import (
    PULL_STATUS_BY_CODE,
    MessageExt,
    MessageQueue,
    PullResult,
    PullStatus,
)
from txmq.client.route import TopicRoute
from txmq.client.wire import send_v2_ext  # noqa: F401  (its home before wire.py; bench_tx_cpu imports it here)
from txmq.errors import MQBrokerError, MQClientError, NoRouteError, RecordDecodeError
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    ConsumerGroupHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueueHeader,
    SearchOffsetRequestHeader,
    TopicHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from txmq.protocol.record import Prop, decode_records

if TYPE_CHECKING:
    from txmq.client.instance import ClientInstance

log = logging.getLogger("txmq.client")

_SUCCESS = ResponseCode.SUCCESS


def _raise_for(resp: RemotingCommand, addr: str | None) -> None:
    raise MQBrokerError(resp.code, resp.remark, addr)


def _int(ext: dict[str, str], key: str, default: int = 0) -> int:
    try:
        return int(ext.get(key, default))
    except (TypeError, ValueError):
        return default


def decode_messages(body: bytes, broker_name: str | None = None) -> list[MessageExt]:
    """Records of a PULL / QUERY / VIEW body as :class:`MessageExt` objects."""
    if not body:
        return []
    try:
        records = decode_records(body, check_crc=False)
    except RecordDecodeError as exc:
        raise MQClientError(f"the broker sent message records that cannot be decoded: {exc}") from exc
    return [MessageExt.from_record(r, broker_name) for r in records]


def tags_match(tags: frozenset[str], message: MessageExt) -> bool:
    """Client-side tag re-filter: the broker filters by hash code, which can collide."""
    return not tags or (message.tags is not None and message.tags in tags)


class MQClientAPI:
    """All client RPCs, bound to one :class:`ClientInstance`."""

    def __init__(self, instance: ClientInstance) -> None:
        self._instance = instance

    async def _call(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        return await self._instance.invoke(addr, cmd, timeout)

    # -- name server --------------------------------------------------------------------------------------------

    async def get_topic_route(self, topic: str, timeout: float = 3.0) -> TopicRoute:
        ext = TopicHeader(topic=topic).to_ext()
        # We parse either form, but standard JSON is what a 4.9.4+ client asks for (wire §2.7).
        ext["acceptStandardJsonOnly"] = "true"
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext)
        resp = await self._instance.invoke_namesrv(cmd, timeout)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            raise NoRouteError(topic, resp.remark)
        if resp.code != _SUCCESS:
            _raise_for(resp, "name server")
        route = TopicRoute.parse(topic, resp.body)
        if not route.queue_datas or not route.broker_datas:
            raise NoRouteError(topic, "the name server returned an empty route")
        return route

    async def get_cluster_info(self, timeout: float = 3.0) -> dict[str, Any]:
        cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        resp = await self._instance.invoke_namesrv(cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, "name server")
        data = fastjson.loads(resp.body) if resp.body else {}
        return data if isinstance(data, dict) else {}

    async def get_topic_list(self, timeout: float = 3.0) -> list[str]:
        cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        resp = await self._instance.invoke_namesrv(cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, "name server")
        data = fastjson.loads(resp.body) if resp.body else {}
        return sorted(str(t) for t in (data.get("topicList") or []))

    # -- heartbeat ----------------------------------------------------------------------------------------------

    async def heartbeat(self, addr: str, body: bytes, timeout: float = 3.0) -> int:
        """Send HEART_BEAT; returns the broker's version from the response."""
        resp = await self._call(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return resp.version

    async def unregister_client(
        self,
        addr: str,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout: float = 3.0,
    ) -> None:
        ext = UnregisterClientRequestHeader(
            clientID=client_id, producerGroup=producer_group, consumerGroup=consumer_group
        ).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)

    # -- consumer -----------------------------------------------------------------------------------------------

    async def get_consumer_id_list(self, addr: str, group: str, timeout: float = 3.0) -> list[str]:
        ext = ConsumerGroupHeader(consumerGroup=group).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        data = fastjson.loads(resp.body) if resp.body else {}
        return sorted(str(c) for c in (data.get("consumerIdList") or []))

    async def pull_message(
        self,
        addr: str,
        broker_name: str,
        header: PullMessageRequestHeader,
        timeout: float,
        *,
        tags: frozenset[str] = frozenset(),
    ) -> PullResult:
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())
        resp = await self._call(addr, cmd, timeout)
        status = PULL_STATUS_BY_CODE.get(resp.code)
        if status is None:
            _raise_for(resp, addr)
        ext = resp.ext_fields
        result = PullResult(
            status=status,  # type: ignore[arg-type]
            next_begin_offset=_int(ext, "nextBeginOffset"),
            min_offset=_int(ext, "minOffset"),
            max_offset=_int(ext, "maxOffset"),
            suggest_which_broker_id=_int(ext, "suggestWhichBrokerId"),
        )
        if status is PullStatus.FOUND:
            messages = decode_messages(resp.body, broker_name)
            min_text, max_text = str(result.min_offset), str(result.max_offset)
            kept = []
            for m in messages:
                if tags_match(tags, m):
                    # Java clients stamp these on every pulled message; the lag is visible to listeners.
                    m.properties[Prop.MIN_OFFSET] = min_text
                    m.properties[Prop.MAX_OFFSET] = max_text
                    kept.append(m)
            result.messages = kept
        return result

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue, timeout: float = 3.0) -> int:
        """The committed offset, or -1 when the broker has none (QUERY_NOT_FOUND)."""
        ext = QueryConsumerOffsetRequestHeader(consumerGroup=group, topic=mq.topic, queueId=mq.queue_id).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext), timeout)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return _int(resp.ext_fields, "offset", -1)

    async def update_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, offset: int, *, oneway: bool = True, timeout: float = 3.0
    ) -> None:
        ext = UpdateConsumerOffsetRequestHeader(
            consumerGroup=group, topic=mq.topic, queueId=mq.queue_id, commitOffset=offset
        ).to_ext()
        cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        if oneway:
            await self._instance.invoke_oneway(addr, cmd)
            return
        resp = await self._call(addr, cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)

    async def _queue_offset_call(self, code: int, addr: str, ext: dict[str, str], key: str, timeout: float) -> int:
        resp = await self._call(addr, RemotingCommand.request(code, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return _int(resp.ext_fields, key)

    async def get_max_offset(self, addr: str, mq: MessageQueue, timeout: float = 3.0) -> int:
        ext = QueueHeader(topic=mq.topic, queueId=mq.queue_id).to_ext()
        return await self._queue_offset_call(RequestCode.GET_MAX_OFFSET, addr, ext, "offset", timeout)

    async def get_min_offset(self, addr: str, mq: MessageQueue, timeout: float = 3.0) -> int:
        ext = QueueHeader(topic=mq.topic, queueId=mq.queue_id).to_ext()
        return await self._queue_offset_call(RequestCode.GET_MIN_OFFSET, addr, ext, "offset", timeout)

    async def get_earliest_msg_store_time(self, addr: str, mq: MessageQueue, timeout: float = 3.0) -> int:
        ext = QueueHeader(topic=mq.topic, queueId=mq.queue_id).to_ext()
        return await self._queue_offset_call(RequestCode.GET_EARLIEST_MSG_STORETIME, addr, ext, "timestamp", timeout)

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int, timeout: float = 3.0) -> int:
        ext = SearchOffsetRequestHeader(topic=mq.topic, queueId=mq.queue_id, timestamp=timestamp_ms).to_ext()
        return await self._queue_offset_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, addr, ext, "offset", timeout)

    async def consumer_send_msg_back(
        self,
        addr: str,
        message: MessageExt,
        group: str,
        delay_level: int,
        max_reconsume_times: int,
        timeout: float = 5.0,
        reason: str | None = None,
    ) -> None:
        ext = ConsumerSendMsgBackRequestHeader(
            offset=message.commit_log_offset,
            group=group,
            delayLevel=delay_level,
            originMsgId=message.msg_id,
            originTopic=message.topic,
            unitMode=False,
            maxReconsumeTimes=max_reconsume_times,
        ).to_ext()
        cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, ext)
        cmd.remark = reason  # txmq brokers keep it with the message (shown by `txmq admin dlq list`)
        resp = await self._call(addr, cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)

    async def lock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue], timeout: float = 3.0
    ) -> set[MessageQueue]:
        body = _lock_body(group, client_id, mqs)
        resp = await self._call(addr, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=body), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        data = fastjson.loads(resp.body) if resp.body else {}
        return {MessageQueue.from_json(m) for m in (data.get("lockOKMQSet") or [])}

    async def unlock_batch_mq(
        self,
        addr: str,
        group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        *,
        oneway: bool = False,
        timeout: float = 3.0,
    ) -> None:
        cmd = RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=_lock_body(group, client_id, mqs))
        if oneway:
            await self._instance.invoke_oneway(addr, cmd)
            return
        resp = await self._call(addr, cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)

    # -- txmq's consumer-group admin requests (TxmqConsumerRequestCode) ------------------------------------------

    async def txmq_consumer_admin(
        self, addr: str, code: int, ext: dict[str, str], timeout: float = 10.0
    ) -> dict[str, Any]:
        resp = await self._call(addr, RemotingCommand.request(code, ext), timeout)
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise MQBrokerError(resp.code, f"broker {addr} does not support txmq consumer admin requests", addr)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        data = orjson.loads(resp.body) if resp.body else {}
        return data if isinstance(data, dict) else {}

    # -- queries and admin --------------------------------------------------------------------------------------

    async def query_message(
        self,
        addr: str,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int,
        end_ms: int,
        *,
        unique_key: bool = False,
        broker_name: str | None = None,
        timeout: float = 5.0,
    ) -> list[MessageExt]:
        ext = QueryMessageRequestHeader(
            topic=topic, key=key, maxNum=max_num, beginTimestamp=begin_ms, endTimestamp=end_ms
        ).to_ext()
        if unique_key:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        resp = await self._call(addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext), timeout)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return decode_messages(resp.body, broker_name)

    async def view_message(self, addr: str, commit_log_offset: int, timeout: float = 3.0) -> MessageExt:
        ext = ViewMessageRequestHeader(offset=commit_log_offset).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        messages = decode_messages(resp.body)
        if not messages:
            raise MQClientError(f"broker {addr} returned no message for commit-log offset {commit_log_offset}")
        return messages[0]

    async def create_topic(self, addr: str, header: CreateTopicRequestHeader, timeout: float = 5.0) -> None:
        cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
        resp = await self._call(addr, cmd, timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)

    async def get_broker_runtime_info(self, addr: str, timeout: float = 3.0) -> dict[str, str]:
        resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        data = fastjson.loads(resp.body) if resp.body else {}
        table = data.get("table") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in (table or {}).items()}

    async def get_topic_stats(self, addr: str, topic: str, timeout: float = 3.0) -> Any:
        ext = TopicHeader(topic=topic).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return fastjson.loads(resp.body) if resp.body else {}

    async def get_consume_stats(self, addr: str, group: str, topic: str | None, timeout: float = 3.0) -> Any:
        ext = GetConsumeStatsRequestHeader(consumerGroup=group, topic=topic).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return fastjson.loads(resp.body) if resp.body else {}

    async def get_consumer_connection_list(self, addr: str, group: str, timeout: float = 3.0) -> Any:
        ext = ConsumerGroupHeader(consumerGroup=group).to_ext()
        resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return fastjson.loads(resp.body) if resp.body else {}

    # -- txmq's own admin requests (docs/transactions.md) ---------------------------------------------------------

    async def txmq_admin(self, addr: str, code: TxmqRequestCode, body: dict[str, Any], timeout: float = 5.0) -> Any:
        """One JSON request of :class:`TxmqRequestCode`; the decoded JSON answer, or MQBrokerError."""
        cmd = RemotingCommand.request(code, {}, orjson.dumps(body))
        resp = await self._call(addr, cmd, timeout)
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise MQBrokerError(resp.code, f"broker {addr} is not a txmq broker with transaction admin requests", addr)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return orjson.loads(resp.body) if resp.body else {}

    # -- ACL (RocketMQ's codes 50-53) ------------------------------------------------------------------------------

    async def acl_request(self, addr: str, code: int, ext: dict[str, str], timeout: float = 5.0) -> RemotingCommand:
        """One ACL admin request; the response, or MQBrokerError with the broker's remark."""
        resp = await self._call(addr, RemotingCommand.request(code, ext), timeout)
        if resp.code != _SUCCESS:
            _raise_for(resp, addr)
        return resp


def _lock_body(group: str, client_id: str, mqs: Iterable[MessageQueue]) -> bytes:
    return orjson.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": [mq.to_json() for mq in mqs]})
