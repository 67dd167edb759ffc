"""Requests only RocketMQ's operator tools send (mqadmin, the dashboard), answered the way the Java broker answers.

GET_BROKER_CONFIG (26), GET_PRODUCER_CONNECTION_LIST (204), INVOKE_BROKER_TO_RESET_OFFSET (222) and
QUERY_TOPIC_CONSUME_BY_WHO (300), with the reply shapes of RocketMQ 4.9's ``AdminBrokerProcessor``; the put/get TPS
samples that GET_BROKER_RUNTIME_INFO reports (``StoreStatsService``); and a clear refusal for the tool requests txmq
does not serve.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections import deque
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.fastjson import mq_key, with_object_map
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import parse_bool

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.consumer_admin import ConsumerAdminProcessor
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.runtime import BrokerStats
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.config import StoreConfig
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

# Java field names whose camelCase is not the plain conversion of ours.
_JAVA_NAMES = {"broker_ip1": "brokerIP1"}

# Tool requests txmq answers with REQUEST_CODE_NOT_SUPPORTED and a reason (mqadmin prints the remark).
UNSUPPORTED_TOOL_REQUESTS = {
    RequestCode.UPDATE_BROKER_CONFIG: "updating the broker configuration at runtime (edit broker.conf and restart)",
}

# Java's StoreStatsService keeps one sample a second for ten minutes and reports TPS over 10 s, 60 s and 600 s.
TPS_WINDOWS = (10, 60, 600)


def java_name(field_name: str) -> str:
    """``broker_cluster_name`` -> ``brokerClusterName``: the key RocketMQ uses in broker.conf."""
    if field_name in _JAVA_NAMES:
        return _JAVA_NAMES[field_name]
    head, *rest = field_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _property_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):  # an Enum: RocketMQ writes its name
        return str(getattr(value, "name", value.value))
    return str(value)


def _escape(text: str, *, key: bool) -> str:
    """java.util.Properties escaping: the reply is read with ``Properties.load`` (ISO-8859-1, so \\uXXXX)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif (ch in "=:#!" and key) or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        elif ord(ch) > 0x7E or ord(ch) < 0x20:
            units = ch.encode("utf-16-be")
            out.extend(f"\\u{units[j : j + 2].hex()}" for j in range(0, len(units), 2))
        else:
            out.append(ch)
    return "".join(out)


def properties_text(props: dict[str, str]) -> str:
    return "".join(f"{_escape(k, key=True)}={_escape(v, key=False)}\n" for k, v in sorted(props.items()))


class TpsSampler:
    """Counters sampled once a second (the broker's timer calls :meth:`sample`); no IO, no clock of its own."""

    def __init__(self, keep: int = max(TPS_WINDOWS) + 1) -> None:
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=keep)

    def sample(self, now: float, put_total: int, get_total: int) -> None:
        self._samples.append((now, put_total, get_total))

    def _rate(self, index: int, window: int) -> str:
        # RocketMQ leaves a window blank until it has that many samples, and clusterList then fails to parse it;
        # txmq reports the rate over the samples it has instead (0.00 with fewer than two).
        if len(self._samples) < 2:
            return "0.00"
        first, last = self._samples[-min(window + 1, len(self._samples))], self._samples[-1]
        elapsed = last[0] - first[0]
        return f"{(last[index] - first[index]) / elapsed:.2f}" if elapsed > 0 else "0.00"

    def tps(self, index: int) -> str:
        """``"t10 t60 t600"``: put TPS for index 1, transferred-message TPS for index 2."""
        return " ".join(self._rate(index, w) for w in TPS_WINDOWS)

    def runtime_info(self) -> dict[str, str]:
        put = self.tps(1)
        get = self.tps(2)
        return {
            "putTps": put,
            "getTransferedTps": get,  # sic: RocketMQ's spelling
            "getTotalTps": get,
            "getFoundTps": get,
            "getMissTps": " ".join("0.00" for _ in TPS_WINDOWS),
        }


class ToolsAdminProcessor:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_config: StoreConfig,
        clock: Clock,
        started_at_ms: int,
        store: MessageStore,
        topics: TopicConfigManager,
        clients: ClientRegistry,
        offsets: ConsumerOffsetManager,
        stats: BrokerStats,
        consumer_admin: ConsumerAdminProcessor,
    ) -> None:
        self.config = config
        self.store_config = store_config
        self.clock = clock
        self.started_at_ms = started_at_ms
        self.store = store
        self.topics = topics
        self.clients = clients
        self.offsets = offsets
        self.stats = stats
        self.consumer_admin = consumer_admin
        self.tps = TpsSampler()
        self.config_version = {"counter": 1, "timestamp": 0}

    def handlers(self) -> dict[int, Any]:
        table: dict[int, Any] = {
            RequestCode.GET_BROKER_CONFIG: self.get_broker_config,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.invoke_reset_offset,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.topic_consumed_by_who,
        }
        for code in UNSUPPORTED_TOOL_REQUESTS:
            table[code] = self.not_supported
        return table

    # -- runtime statistics

    def sample(self) -> None:
        store = self.store
        puts = store.statistics.put_messages
        self.tps.sample(self.clock.monotonic(), puts, self.stats.get_messages)

    def runtime_info(self) -> dict[str, str]:
        """The GET_BROKER_RUNTIME_INFO keys mqadmin's clusterList and brokerStatus read that txmq can report."""
        store = self.store
        info = self.tps.runtime_info()
        earliest = store.earliest_message_time()
        root = self.store_config.store_path_root_dir
        try:
            usage = shutil.disk_usage(root)
            ratio = str(usage.used / usage.total) if usage.total else "-1"
            capacity = f"Total : {_human(usage.total)}, Free : {_human(usage.free)}."
        except OSError:
            ratio, capacity = "-1", ""
        info.update(
            {
                # txmq serves requests on its event loop: no send/pull thread-pool queues build up.
                "sendThreadPoolQueueSize": "0",
                "sendThreadPoolQueueCapacity": "0",
                "pullThreadPoolQueueSize": "0",
                "pullThreadPoolQueueCapacity": "0",
                "queryThreadPoolQueueSize": "0",
                "queryThreadPoolQueueCapacity": "0",
                "sendThreadPoolQueueHeadWaitTimeMills": "0",
                "pullThreadPoolQueueHeadWaitTimeMills": "0",
                "queryThreadPoolQueueHeadWaitTimeMills": "0",
                "pageCacheLockTimeMills": "0",
                "earliestMessageTimeStamp": str(earliest if earliest is not None else 0),
                "commitLogDiskRatio": ratio,
                "consumeQueueDiskRatio": ratio,
                # txmq keeps no per-day counters: "today" counts from the broker's start.
                "msgPutTotalYesterdayMorning": "0",
                "msgPutTotalTodayMorning": "0",
                "msgGetTotalYesterdayMorning": "0",
                "msgGetTotalTodayMorning": "0",
            }
        )
        if capacity:
            info["commitLogDirCapacity"] = capacity
        return info

    # -- handlers

    def not_supported(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        what = UNSUPPORTED_TOOL_REQUESTS.get(cmd.code, f"request code {cmd.code}")  # type: ignore[call-overload]
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"not supported by txmq: {what}")

    def config_properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        for f in dataclasses.fields(self.store_config):
            props[java_name(f.name)] = _property_text(getattr(self.store_config, f.name))
        for f in dataclasses.fields(self.config):
            if f.name != "extra":
                props[java_name(f.name)] = _property_text(getattr(self.config, f.name))
        props.update({k: str(v) for k, v in self.config.extra.items()})
        props["brokerIP1"] = self.config.advertised_ip
        return props

    def get_broker_config(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        # Java: the properties text of every config object; header ``version`` is the configuration's DataVersion.
        if not self.config_version["timestamp"]:
            self.config_version["timestamp"] = self.started_at_ms
        body = properties_text(self.config_properties()).encode("ascii")
        return cmd.response(ext_fields={"version": orjson.dumps(self.config_version).decode()}, body=body)

    def producer_connections(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("producerGroup", "")
        channels = self.clients.producers.get(group)
        if not channels:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": [ch.connection_row() for ch in channels.values()]}
        return cmd.response(body=orjson.dumps(body))

    def topic_consumed_by_who(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.ext_fields.get("topic", "")
        groups = {g for g, info in self.clients.consumers.items() if topic in info.subscriptions and info.channels}
        groups.update(self.offsets.groups_of_topic(topic))
        return cmd.response(body=orjson.dumps({"groupList": sorted(groups)}))

    async def invoke_reset_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """Java's ``Broker2Client.resetOffset``: compute the offsets, tell the online consumers, reply with them.

        Unlike RocketMQ, txmq also commits the new offsets at once, so the reset holds even if a consumer dies before
        it persists them.
        """
        ext = cmd.ext_fields
        topic, group = ext.get("topic", ""), ext.get("group", "")
        try:
            timestamp = int(ext.get("timestamp", ""))
            force = parse_bool(ext.get("isForce", "false"))
        except ValueError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "timestamp must be epoch milliseconds or -1")
        cfg = self.topics.get(topic)
        if cfg is None:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}"
            )
        committed = self.offsets.offsets_of(group, topic)
        offsets: dict[int, int] = {}
        for qid in range(cfg.write_queue_nums):
            current = committed.get(qid)
            if current is None or current < 0:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
            target = self.consumer_admin.offset_for(topic, qid, "latest" if timestamp == -1 else str(timestamp))
            offsets[qid] = target if force or target < current else current
        if not self.clients.consumer_connections(group):
            return cmd.response(
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} Timestamp: {timestamp}",
            )
        await self.consumer_admin.apply_reset(group, topic, offsets, str(timestamp))
        name = self.config.broker_name
        body = with_object_map("offsetTable", [(mq_key(topic, name, q), o) for q, o in sorted(offsets.items())], {})
        return cmd.response(body=body)


def _human(size: int) -> str:
    """MixAll.humanReadableByteCount(bytes, si=false)."""
    if size < 1024:
        return f"{size} B"
    units = "KMGTPE"
    value = float(size)
    exp = 0
    while value >= 1024 and exp < len(units):
        value /= 1024
        exp += 1
    return f"{value:.1f} {units[exp - 1]}iB"
