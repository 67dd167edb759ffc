"""Scriptable fake brokers for client unit tests: real sockets and a real name server, broker logic by hand.

A :class:`FakeBroker` records every request, answers the ones a client needs with canned replies (overridable
per request code), and registers its topics with an in-process :class:`~txmq.namesrv.server.NameServer` through a
real REGISTER_BROKER request, so the client under test resolves routes exactly as it would in production.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from txmq.net import Connection, Server, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import MessageRecord, Prop, encode_record


def stored(topic: str, queue_id: int, offset: int, body: bytes, tags: str | None = None, **props: str) -> MessageRecord:
    """A record as a broker would return it from queue ``queue_id`` at ``offset``."""
    properties = {Prop.UNIQ_KEY: f"UNIQ{topic}{queue_id:04d}{offset:08d}", **props}
    if tags:
        properties[Prop.TAGS] = tags
    return MessageRecord(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=offset,
        physical_offset=100_000 + queue_id * 10_000 + offset * 100,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_timestamp=2,
        store_host=("127.0.0.1", 10911),
        properties=properties,
    )


Handler = Callable[[Connection, RemotingCommand], Any]


class FakeBroker:
    def __init__(self, name: str, cluster: str = "C") -> None:
        self.name = name
        self.cluster = cluster
        self.requests: list[RemotingCommand] = []
        self.connections: set[Connection] = set()
        self.consumer_ids: list[str] = []
        self.max_offset = 7
        self.topics: dict[str, tuple[int, int, int]] = {}
        self._offsets = itertools.count()
        self.server: Server | None = None
        self._ns_conn: Connection | None = None
        self._closing = asyncio.Event()
        self.handlers: dict[int, Handler] = {
            RequestCode.HEART_BEAT: self._ok,
            RequestCode.UNREGISTER_CLIENT: self._ok,
            RequestCode.SEND_MESSAGE_V2: self._send,
            RequestCode.SEND_BATCH_MESSAGE: self._send,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._ok,
            RequestCode.GET_MAX_OFFSET: lambda c, cmd: cmd.response(ext_fields={"offset": str(self.max_offset)}),
            RequestCode.PULL_MESSAGE: self._pull_forever,
            RequestCode.LOCK_BATCH_MQ: self._lock_all,
            RequestCode.UNLOCK_BATCH_MQ: self._ok,
        }
        self.stored_offsets: dict[tuple[str, int], int] = {}
        # Scripted PULL answers per (topic, queueId): (code, records, nextBeginOffset); when a script runs out,
        # pulls are held forever like an idle long poll.
        self.pull_script: dict[tuple[str, int], list[tuple[int, list[MessageRecord], int] | asyncio.Event]] = {}

    @property
    def addr(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    async def start(self) -> FakeBroker:
        self.server = await Server.start("127.0.0.1", 0, self._handle)
        return self

    async def close(self, *, keep_route: bool = False) -> None:
        """Stop serving. ``keep_route`` leaves the registration in place, so clients still try this broker."""
        self._closing.set()
        if self.server is not None:
            await self.server.close()
        if self._ns_conn is not None and not keep_route:
            self._ns_conn.close()

    async def register(self, namesrv_addr: str, topics: dict[str, tuple[int, int, int]] | None = None) -> None:
        """REGISTER_BROKER with ``{topic: (read queues, write queues, perm)}`` (added to earlier topics)."""
        self.topics.update(topics or {})
        table = {
            t: {"topicName": t, "readQueueNums": r, "writeQueueNums": w, "perm": p, "topicFilterType": "SINGLE_TAG"}
            for t, (r, w, p) in self.topics.items()
        }
        body = orjson.dumps(
            {
                "topicConfigSerializeWrapper": {
                    "topicConfigTable": table,
                    "dataVersion": {"timestamp": 1, "counter": next(self._offsets) + 1},
                },
                "filterServerList": [],
            }
        )
        ext = {
            "brokerName": self.name,
            "brokerAddr": self.addr,
            "clusterName": self.cluster,
            "haServerAddr": "",
            "brokerId": "0",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        }
        # The name server forgets a broker when its registration connection closes, so keep it open.
        if self._ns_conn is None or self._ns_conn.closed:
            host, _, port = namesrv_addr.rpartition(":")
            self._ns_conn = await connect(host, int(port))
        resp = await self._ns_conn.request(RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body), 5)
        assert resp.code == 0, resp.remark

    def of_code(self, code: int) -> list[RemotingCommand]:
        return [c for c in self.requests if c.code == code]

    async def notify_consumer_ids_changed(self, group: str) -> None:
        for conn in list(self.connections):
            if not conn.closed:
                conn.send_oneway(
                    RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
                )

    # -- handlers

    def _handle(self, conn: Connection, cmd: RemotingCommand) -> Any:
        self.requests.append(cmd)
        self.connections.add(conn)
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        return handler(conn, cmd)

    @staticmethod
    def _ok(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response()

    def _send(self, _conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        offset = next(self._offsets)
        return cmd.response(
            ext_fields={
                "msgId": f"7F000001{self.server.port if self.server else 0:08X}{offset:016X}",
                "queueId": str(h.queueId),
                "queueOffset": str(offset),
                "MSG_REGION": "DefaultRegion",
                "TRACE_ON": "true",
            }
        )

    def _consumer_list(self, _conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if not self.consumer_ids:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {cmd.ext_fields.get('consumerGroup')}"
            )
        return cmd.response(body=orjson.dumps({"consumerIdList": self.consumer_ids}))

    def _query_offset(self, _conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        key = (cmd.ext_fields["topic"], int(cmd.ext_fields["queueId"]))
        if key in self.stored_offsets:
            return cmd.response(ext_fields={"offset": str(self.stored_offsets[key])})
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
        )

    async def _pull_forever(self, _conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        script = self.pull_script.get((cmd.ext_fields["topic"], int(cmd.ext_fields["queueId"])))
        while script and isinstance(script[0], asyncio.Event):
            await script.pop(0).wait()  # a gate: the test decides when this pull is answered
        if script:
            code, records, next_offset = script.pop(0)  # type: ignore[misc]
            body = b"".join(bytes(encode_record(r)) for r in records)
            ext = {
                "suggestWhichBrokerId": "0",
                "nextBeginOffset": str(next_offset),
                "minOffset": "0",
                "maxOffset": str(next_offset),
            }
            return cmd.response(code, "FOUND" if code == 0 else "scripted", ext, body)
        # A long poll that never finds anything: the client's request stays parked until either side closes.
        await self._closing.wait()
        return None

    def _lock_all(self, _conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        data = orjson.loads(cmd.body)
        return cmd.response(body=orjson.dumps({"lockOKMQSet": data["mqSet"]}))
