"""The name server's route table: clusters, brokers, topics' queues, live brokers and their expiry (no IO)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from txmq.protocol.route import MASTER_ID, BrokerData, QueueData
from txmq.util import atomic_write_json

log = logging.getLogger("txmq.namesrv")

BROKER_EXPIRY_SECONDS = 120.0


@dataclass(slots=True)
class LiveBroker:
    last_update: float
    data_version: dict[str, Any]
    ha_server_addr: str
    connection: Any = None  # the registering connection: its close expires the broker at once


@dataclass(slots=True)
class RegisterResult:
    ha_server_addr: str = ""
    master_addr: str = ""


class RouteTable:
    """What every name server knows. All times come from the caller (its clock's monotonic seconds)."""

    def __init__(self, expiry_seconds: float = BROKER_EXPIRY_SECONDS) -> None:
        self.expiry_seconds = expiry_seconds
        self.cluster_addr: dict[str, set[str]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.topic_queues: dict[str, dict[str, QueueData]] = {}
        self.live: dict[str, LiveBroker] = {}

    def register_broker(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_config_wrapper: dict[str, Any] | None,
        now: float,
        connection: Any = None,
    ) -> RegisterResult:
        self.cluster_addr.setdefault(cluster, set()).add(broker_name)
        data = self.brokers.get(broker_name)
        first = data is None
        if data is None:
            data = self.brokers[broker_name] = BrokerData(cluster=cluster, broker_name=broker_name)
        # The same address under another id means the broker changed role: drop the old entry.
        for other_id, addr in list(data.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del data.broker_addrs[other_id]
        first = first or broker_id not in data.broker_addrs
        data.broker_addrs[broker_id] = broker_addr

        wrapper = topic_config_wrapper or {}
        version = wrapper.get("dataVersion") or {}
        previous = self.live.get(broker_addr)
        changed = previous is None or previous.data_version != version
        if broker_id == MASTER_ID and (changed or first):
            self._update_queues(broker_name, wrapper.get("topicConfigTable") or {})
        self.live[broker_addr] = LiveBroker(now, version, ha_server_addr, connection)
        if previous is None:
            log.info("broker registered: %s %s (%s, id %d)", broker_name, broker_addr, cluster, broker_id)
        result = RegisterResult()
        if broker_id != MASTER_ID:
            master = data.broker_addrs.get(MASTER_ID)
            if master and master in self.live:
                result.master_addr = master
                result.ha_server_addr = self.live[master].ha_server_addr
        return result

    def _update_queues(self, broker_name: str, topic_table: dict[str, Any]) -> None:
        seen = set()
        for topic, cfg in topic_table.items():
            if not isinstance(cfg, dict):
                continue
            seen.add(topic)
            self.topic_queues.setdefault(topic, {})[broker_name] = QueueData(
                broker_name=broker_name,
                read_queue_nums=int(cfg.get("readQueueNums", 16)),
                write_queue_nums=int(cfg.get("writeQueueNums", 16)),
                perm=int(cfg.get("perm", 6)),
                topic_sys_flag=int(cfg.get("topicSysFlag", 0)),
            )
        # Topics the broker no longer has lose this broker's queues.
        for topic in list(self.topic_queues):
            if topic not in seen:
                self._drop_topic_broker(topic, broker_name)

    def _drop_topic_broker(self, topic: str, broker_name: str) -> None:
        queues = self.topic_queues.get(topic)
        if queues is not None and queues.pop(broker_name, None) is not None and not queues:
            del self.topic_queues[topic]

    def unregister_broker(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.live.pop(broker_addr, None)
        data = self.brokers.get(broker_name)
        removed_name = False
        if data is not None:
            if data.broker_addrs.get(broker_id) == broker_addr:
                del data.broker_addrs[broker_id]
            if not data.broker_addrs:
                del self.brokers[broker_name]
                removed_name = True
        if removed_name:
            names = self.cluster_addr.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr[cluster]
            for topic in list(self.topic_queues):
                self._drop_topic_broker(topic, broker_name)
        log.info("broker unregistered: %s %s", broker_name, broker_addr)

    def _remove_addr(self, broker_addr: str, reason: str) -> None:
        for name, data in list(self.brokers.items()):
            for bid, addr in list(data.broker_addrs.items()):
                if addr == broker_addr:
                    log.warning("broker %s (%s) removed: %s", name, broker_addr, reason)
                    self.unregister_broker(cluster=data.cluster, broker_addr=addr, broker_name=name, broker_id=bid)
                    return
        self.live.pop(broker_addr, None)

    def expire(self, now: float) -> list[str]:
        """Drop brokers not heard from for ``expiry_seconds``; return their addresses."""
        dead = [addr for addr, info in self.live.items() if now - info.last_update > self.expiry_seconds]
        for addr in dead:
            self._remove_addr(addr, f"no registration for over {self.expiry_seconds:.0f} s")
        return dead

    def connection_closed(self, connection: Any) -> None:
        for addr, info in list(self.live.items()):
            if info.connection is connection:
                self._remove_addr(addr, "its connection closed")

    def route(self, topic: str) -> dict[str, Any] | None:
        """The TopicRouteData of a topic, or None when no live broker serves it."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        broker_datas = [self.brokers[name].to_json() for name in sorted(queues) if name in self.brokers]
        if not broker_datas:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": [queues[name].to_json() for name in sorted(queues)],
            "brokerDatas": broker_datas,
            "filterServerTable": {},
        }

    def cluster_info(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: data.to_json() for name, data in sorted(self.brokers.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr.items())},
        }

    def topics(self) -> list[str]:
        return sorted(self.topic_queues)

    def delete_topic(self, topic: str, cluster: str = "") -> None:
        """Forget a topic's queues: on the cluster's brokers only, or everywhere when no cluster is given."""
        if not cluster:
            self.topic_queues.pop(topic, None)
            return
        for broker_name in self.cluster_addr.get(cluster, set()):
            self._drop_topic_broker(topic, broker_name)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names = self.cluster_addr.get(cluster, set())
        return sorted(t for t, queues in self.topic_queues.items() if names & queues.keys())

    def data_version(self, broker_addr: str) -> dict[str, Any] | None:
        info = self.live.get(broker_addr)
        return None if info is None else info.data_version

    def touch(self, broker_addr: str, now: float) -> None:
        info = self.live.get(broker_addr)
        if info is not None:
            info.last_update = now


class KVConfig:
    """Namespaced key/value settings (ORDER_TOPIC_CONFIG and the like), kept in memory and in a JSON file."""

    def __init__(self, path: str | None = None) -> None:
        self._path = path
        self.table: dict[str, dict[str, str]] = {}
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    loaded = json.load(f)
                self.table = {str(ns): {str(k): str(v) for k, v in kv.items()} for ns, kv in loaded.items()}
            except (OSError, ValueError, AttributeError) as exc:
                log.error("KV config %s is unreadable (%s); starting empty", path, exc)

    def _persist(self) -> None:
        if not self._path:
            return
        atomic_write_json(self._path, self.table)

    def put(self, namespace: str, key: str, value: str) -> None:
        self.table.setdefault(namespace, {})[key] = value
        self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        ns = self.table.get(namespace)
        if ns is not None and ns.pop(key, None) is not None:
            if not ns:
                del self.table[namespace]
            self._persist()

    def namespace(self, namespace: str) -> dict[str, str]:
        return dict(self.table.get(namespace, {}))
