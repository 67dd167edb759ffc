"""txmq.testing's in-process broker with raw send / send-back helpers."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from txmq.broker.broker import Broker
from txmq.net import Connection
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import MessageRecord, decode_offset_msg_id, encode_properties
from txmq.testing import InProcessBroker

_uniq = itertools.count(1)


class Harness(InProcessBroker):
    """A broker plus one raw client connection (``conn``), reopened on every restart."""

    conn: Connection | None = None

    async def start(self, **overrides: Any) -> Broker:
        broker = await super().start(**overrides)
        self.conn = await self.connect()
        return broker

    async def stop(self) -> None:
        self.conn = None
        await super().stop()

    @property
    def svc(self) -> Any:
        assert self.broker is not None
        return self.broker.schedule

    async def request(self, cmd: RemotingCommand) -> RemotingCommand:
        assert self.conn is not None
        return await self.conn.request(cmd, timeout=10)

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        **props: str,
    ) -> RemotingCommand:
        all_props = {"UNIQ_KEY": f"UNIQ{next(_uniq):028d}", **props}
        header = SendMessageRequestHeader(
            producerGroup="PG",
            topic=topic,
            queueId=queue_id,
            bornTimestamp=self.clock.now_ms(),
            properties=encode_properties(all_props),
            reconsumeTimes=reconsume_times,
            maxReconsumeTimes=max_reconsume_times,
        )
        return await self.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body))

    async def send_back(
        self,
        record: MessageRecord,
        group: str,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        version: int | None = None,
        reason: str | None = None,
    ) -> RemotingCommand:
        header = ConsumerSendMsgBackRequestHeader(
            offset=record.physical_offset,
            group=group,
            delayLevel=delay_level,
            originMsgId=record.uniq_key,
            originTopic=record.topic,
            maxReconsumeTimes=max_reconsume_times,
        )
        cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext())
        if version is not None:
            cmd.version = version
        cmd.remark = reason
        return await self.request(cmd)

    async def create_group(self, group: str, retry_max_times: int) -> None:
        body = orjson.dumps({"groupName": group, "retryMaxTimes": retry_max_times})
        resp = await self.request(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body))
        assert resp.code == 0, resp.remark

    def messages(self, topic: str, queue_id: int = 0) -> list[MessageRecord]:
        assert self.broker is not None and self.broker.store is not None
        store = self.broker.store
        out = []
        for phys, size, _ in store.read_consume_queue(topic, queue_id, 0, 100_000):
            record = store.read_message(phys, size)
            assert record is not None
            out.append(record)
        return out

    def all_messages(self, topic: str) -> list[MessageRecord]:
        assert self.broker is not None and self.broker.store is not None
        out: list[MessageRecord] = []
        for t, q in self.broker.store.queues():
            if t == topic:
                out.extend(self.messages(t, q))
        return sorted(out, key=lambda r: r.physical_offset)


def phys_of(resp: RemotingCommand) -> int:
    assert resp.code == 0, resp.remark
    return decode_offset_msg_id(resp.ext_fields["msgId"])[1]
