"""Topic routes from the name server and the queues a producer or consumer derives from them (no IO)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from txmq.client import fastjson
from txmq.client.message import MessageQueue
from txmq.protocol.route import MASTER_ID, BrokerData, QueueData  # noqa: F401


@dataclass(slots=True)
class TopicRoute:
    """GET_ROUTEINFO_BY_TOPIC's answer, plus derived publish and subscribe queues."""

    topic: str
    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    order_topic_conf: str | None = None
    _publish: list[MessageQueue] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, topic: str, body: bytes) -> TopicRoute:
        data = fastjson.loads(body) if body else {}
        if not isinstance(data, dict):
            raise ValueError(f"route body of {topic} is not a JSON object")
        queues = [QueueData.from_json(q) for q in data.get("queueDatas") or []]
        brokers = [BrokerData.from_json(b) for b in data.get("brokerDatas") or []]
        order = data.get("orderTopicConf")
        return cls(topic, queues, brokers, str(order) if order else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [q.to_json() for q in self.queue_datas],
            "brokerDatas": [b.to_json() for b in self.broker_datas],
        }

    def broker(self, broker_name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None

    def as_topic(self, topic: str, max_queue_nums: int) -> TopicRoute:
        """This route (TBW102's) re-labelled for a new topic, with at most ``max_queue_nums`` queues per broker.

        RocketMQ producers send to an unknown topic through the auto-create template's brokers; the broker then
        creates the topic with ``min(defaultTopicQueueNums, template queues)`` queues.
        """
        queues = [
            QueueData(
                q.broker_name,
                min(max_queue_nums, q.read_queue_nums),
                min(max_queue_nums, q.write_queue_nums),
                q.perm,
                q.topic_sys_flag,
            )
            for q in self.queue_datas
        ]
        brokers = [BrokerData(b.cluster, b.broker_name, dict(b.broker_addrs)) for b in self.broker_datas]
        return TopicRoute(topic, queues, brokers, None)

    def publish_queues(self) -> list[MessageQueue]:
        """Writable queues on brokers that have a master, in (broker name, queue id) order.

        An ``orderTopicConf`` (``"broker-a:4;broker-b:4"``) fixes the queues of an ordered topic. Computed once
        (every send asks); a route object is replaced, never edited, when the name server's answer changes.
        """
        if self._publish is None:
            self._publish = self._compute_publish_queues()
        return list(self._publish)  # a copy: selectors may do what they like with it

    def _compute_publish_queues(self) -> list[MessageQueue]:
        if self.order_topic_conf:
            out = []
            for item in self.order_topic_conf.split(";"):
                name, _, nums = item.partition(":")
                if name and nums.strip().isdigit():
                    out.extend(MessageQueue(self.topic, name.strip(), i) for i in range(int(nums)))
            return out
        masters = {b.broker_name for b in self.broker_datas if b.master_addr() is not None}
        out = []
        for q in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if q.writable and q.broker_name in masters:
                out.extend(MessageQueue(self.topic, q.broker_name, i) for i in range(q.write_queue_nums))
        return out

    def subscribe_queues(self) -> list[MessageQueue]:
        """Readable queues, sorted the way rebalancing expects."""
        out = []
        for q in self.queue_datas:
            if q.readable:
                out.extend(MessageQueue(self.topic, q.broker_name, i) for i in range(q.read_queue_nums))
        return sorted(out)

    def master_addrs(self) -> list[str]:
        return sorted({a for b in self.broker_datas if (a := b.master_addr()) is not None})

    def random_broker_addr(self) -> str | None:
        """Any broker of the topic (for GET_CONSUMER_LIST_BY_GROUP, which every broker of the group can answer)."""
        candidates = [a for b in self.broker_datas if (a := b.any_addr()) is not None]
        return random.choice(candidates) if candidates else None
