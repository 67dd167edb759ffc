"""The name server's request processors and its service loop (broker expiry)."""

from __future__ import annotations

import asyncio
import logging
import zlib
from pathlib import Path
from typing import Any

import orjson

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import ProtocolError
from txmq.namesrv.route import KVConfig, RouteTable
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    KVConfigRequestHeader,
    RegisterBrokerRequestHeader,
    TopicHeader,
    UnregisterBrokerRequestHeader,
)

log = logging.getLogger("txmq.namesrv")

SCAN_INTERVAL_SECONDS = 10.0


def _json(value: Any) -> bytes:
    return orjson.dumps(value)


class NameServer:
    """Answers brokers and clients. ``handle`` is the connection handler given to :class:`txmq.net.Server`."""

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, kv_path: str | Path | None = None, expiry_seconds: float = 120.0
    ) -> None:
        self.clock = clock
        self.routes = RouteTable(expiry_seconds)
        self.kv = KVConfig(str(kv_path) if kv_path else None)
        self._server: Any = None
        self._scanner: asyncio.Task[None] | None = None
        self._handlers = {
            RequestCode.PUT_KV_CONFIG: self._put_kv,
            RequestCode.GET_KV_CONFIG: self._get_kv,
            RequestCode.DELETE_KV_CONFIG: self._delete_kv,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self._kv_list,
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._topic_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._topics_by_cluster,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self._system_topics,
            RequestCode.QUERY_DATA_VERSION: self._query_data_version,
        }

    # -- service

    async def start(self, host: str = "0.0.0.0", port: int = 9876) -> int:
        from txmq.net import Server

        self._server = await Server.start(host, port, self.handle, clock=self.clock)
        self._scanner = asyncio.create_task(self._scan_loop(), name="namesrv-expiry")
        log.info("name server listening on %s:%d", host, self._server.port)
        return int(self._server.port)

    @property
    def port(self) -> int:
        return int(self._server.port)

    async def close(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
        if self._server is not None:
            await self._server.close()

    async def _scan_loop(self) -> None:
        while True:
            await self.clock.sleep(SCAN_INTERVAL_SECONDS)
            self.routes.expire(self.clock.monotonic())

    # -- dispatch

    def handle(self, connection: Any, cmd: RemotingCommand) -> RemotingCommand | None:
        handler = self._handlers.get(cmd.code)  # type: ignore[call-overload]
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        if connection is not None and cmd.code == RequestCode.REGISTER_BROKER:
            self._watch(connection)
        try:
            return handler(connection, cmd)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))

    def _watch(self, connection: Any) -> None:
        attrs = getattr(connection, "attributes", None)
        if attrs is not None and not attrs.get("namesrv.watched"):
            attrs["namesrv.watched"] = True
            connection.add_close_callback(lambda *_: self.routes.connection_closed(connection))

    # -- KV

    def _put_kv(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = KVConfigRequestHeader.from_ext(cmd.ext_fields)
        if h.value is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "PUT_KV_CONFIG needs a value")
        self.kv.put(h.namespace, h.key, h.value)
        return cmd.response()

    def _get_kv(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = KVConfigRequestHeader.from_ext(cmd.ext_fields)
        value = self.kv.get(h.namespace, h.key)
        if value is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace} Key: {h.key}")
        return cmd.response(ext_fields={"value": value})

    def _delete_kv(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = KVConfigRequestHeader.from_ext(cmd.ext_fields)
        self.kv.delete(h.namespace, h.key)
        return cmd.response()

    def _kv_list(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        namespace = cmd.ext_fields.get("namespace", "")
        table = self.kv.namespace(namespace)
        if not table:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return cmd.response(body=_json({"table": table}))

    # -- brokers

    def _register_broker(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = RegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        if h.bodyCrc32 and zlib.crc32(cmd.body) & 0x7FFFFFFF != h.bodyCrc32:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if h.compressed:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "compressed broker registration bodies are not supported")
        wrapper: dict[str, Any] | None = None
        if cmd.body:
            try:
                parsed = orjson.loads(cmd.body)
            except orjson.JSONDecodeError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"register body is not JSON: {exc}")
            if not isinstance(parsed, dict):
                return cmd.response(ResponseCode.SYSTEM_ERROR, "register body must be a JSON object")
            # Senders at version >= 37 wrap the topic table; older ones send it bare.
            wrapper = parsed.get("topicConfigSerializeWrapper", parsed)
            if not isinstance(wrapper, dict):
                return cmd.response(ResponseCode.SYSTEM_ERROR, "topicConfigSerializeWrapper must be an object")
        result = self.routes.register_broker(
            cluster=h.clusterName,
            broker_addr=h.brokerAddr,
            broker_name=h.brokerName,
            broker_id=h.brokerId,
            ha_server_addr=h.haServerAddr,
            topic_config_wrapper=wrapper,
            now=self.clock.monotonic(),
            connection=conn,
        )
        order = self.kv.namespace("ORDER_TOPIC_CONFIG")
        body = _json({"table": order}) if order else b""
        return cmd.response(
            ext_fields={"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr}, body=body
        )

    def _unregister_broker(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        self.routes.unregister_broker(
            cluster=h.clusterName, broker_addr=h.brokerAddr, broker_name=h.brokerName, broker_id=h.brokerId
        )
        return cmd.response()

    def _query_data_version(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        addr = cmd.ext_fields.get("brokerAddr", "")
        stored = self.routes.data_version(addr)
        try:
            sent = orjson.loads(cmd.body) if cmd.body else None
        except orjson.JSONDecodeError:
            sent = None
        changed = stored is None or stored != sent
        if not changed:
            self.routes.touch(addr, self.clock.monotonic())
        return cmd.response(
            ext_fields={"changed": "true" if changed else "false"}, body=_json(stored) if stored else b""
        )

    # -- clients

    def _route(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicHeader.from_ext(cmd.ext_fields).topic
        route = self.routes.route(topic)
        if route is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        order = self.kv.get("ORDER_TOPIC_CONFIG", topic)
        if order:
            route["orderTopicConf"] = order
        return cmd.response(body=_json(route))

    def _cluster_info(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=_json(self.routes.cluster_info()))

    def _topic_list(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=_json({"topicList": self.routes.topics()}))

    def _delete_topic(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        # mqadmin deleteTopic sends this after deleting the topic on the brokers; a blank clusterName means all.
        topic = TopicHeader.from_ext(cmd.ext_fields).topic
        self.routes.delete_topic(topic, cmd.ext_fields.get("clusterName", ""))
        return cmd.response()

    def _topics_by_cluster(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        cluster = cmd.ext_fields.get("cluster", "")
        return cmd.response(body=_json({"topicList": self.routes.topics_of_cluster(cluster)}))

    def _system_topics(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        info = self.routes.cluster_info()
        names = list(info["clusterAddrTable"]) + list(info["brokerAddrTable"])
        return cmd.response(body=_json({"topicList": sorted(set(names))}))
