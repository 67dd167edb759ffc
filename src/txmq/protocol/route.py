"""The topic-route models of GET_ROUTEINFO_BY_TOPIC (``QueueData``, ``BrokerData``): what the name server
answers and what clients read, with their JSON form (wire reference §1, name-server bodies)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.topics import is_readable, is_writable

MASTER_ID = 0  # brokerId of a master; slaves have ids > 0


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def writable(self) -> bool:
        return is_writable(self.perm)

    @property
    def readable(self) -> bool:
        return is_readable(self.perm)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
            "topicSynFlag": self.topic_sys_flag,  # the pre-4.9 spelling, still read by older Java clients
        }

    @classmethod
    def from_json(cls, q: dict[str, Any]) -> QueueData:
        return cls(
            broker_name=str(q["brokerName"]),
            read_queue_nums=int(q.get("readQueueNums", 0)),
            write_queue_nums=int(q.get("writeQueueNums", 0)),
            perm=int(q.get("perm", 6)),
            # Pre-4.9.0 name servers spell it topicSynFlag.
            topic_sys_flag=int(q.get("topicSysFlag", q.get("topicSynFlag", 0)) or 0),
        )


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def any_addr(self) -> str | None:
        """The master if there is one, else some slave (consumers may read from slaves)."""
        master = self.master_addr()
        if master is not None:
            return master
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
        }

    @classmethod
    def from_json(cls, b: dict[str, Any]) -> BrokerData:
        addrs: dict[int, str] = {}
        for k, v in (b.get("brokerAddrs") or {}).items():
            try:
                addrs[int(k)] = str(v)
            except (TypeError, ValueError):
                continue
        return cls(str(b.get("cluster", "")), str(b["brokerName"]), addrs)
