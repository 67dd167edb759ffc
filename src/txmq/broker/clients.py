"""Who is connected: producer groups, consumer groups, their channels and subscriptions (fed by HEART_BEAT).

The registry stores connections opaquely; it never talks to them. The broker turns the changes it reports into
NOTIFY_CONSUMER_IDS_CHANGED requests and picks producer channels for transaction checks from it.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.record import java_string_hash

log = logging.getLogger("txmq.broker")

CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}
CONSUME_FROM = {
    0: "CONSUME_FROM_LAST_OFFSET",
    1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    2: "CONSUME_FROM_MIN_OFFSET",
    3: "CONSUME_FROM_MAX_OFFSET",
    4: "CONSUME_FROM_FIRST_OFFSET",
    5: "CONSUME_FROM_TIMESTAMP",
}
SUB_ALL = "*"


def _enum_name(value: Any, table: dict[int, str], default: str) -> str:
    """Java sends enum names, C++ sends ordinals: accept both."""
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return table.get(value, default)
    text = str(value)
    if text.isdigit():
        return table.get(int(text), default)
    return text if text in table.values() else default


@dataclass(slots=True)
class Subscription:
    topic: str
    expression: str = SUB_ALL
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def parse(
        cls, topic: str, expression: str | None, sub_version: int = 0, expression_type: str = "TAG"
    ) -> Subscription:
        """Build a TAG subscription from ``A || B``; ``*`` or blank means everything.

        Any other expression type (SQL92) keeps its expression whole and has no tags: the broker's
        property filter decides (``txmq.broker.filters``)."""
        if expression_type not in ("", "TAG"):
            return cls(topic, expression or "", frozenset(), frozenset(), sub_version, expression_type)
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return cls(topic, SUB_ALL, frozenset(), frozenset(), sub_version, expression_type or "TAG")
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        return cls(
            topic, expr, tags, frozenset(java_string_hash(t) for t in tags), sub_version, expression_type or "TAG"
        )

    @property
    def matches_all(self) -> bool:
        return self.expression == SUB_ALL or not self.tags

    def matches_code(self, tags_code: int) -> bool:
        return self.matches_all or tags_code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        return self.matches_all or (tag is not None and tag in self.tags)


@dataclass(slots=True)
class ClientChannel:
    client_id: str
    connection: Any
    language: str = "JAVA"
    version: int = 0
    last_update: float = 0.0

    def connection_row(self) -> dict[str, Any]:
        """One entry of RocketMQ's ConsumerConnection/ProducerConnection ``connectionSet``."""
        return {
            "clientId": self.client_id,
            "clientAddr": ":".join(map(str, getattr(self.connection, "peer", ("", 0)))),
            "language": self.language,
            "version": self.version,
        }


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Any, ClientChannel] = field(default_factory=dict)  # connection -> channel
    subscriptions: dict[str, Subscription] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values()})


@dataclass(slots=True)
class HeartbeatResult:
    changed_groups: list[str]  # consumer groups whose members or subscriptions changed
    new_consumer_groups: list[str]
    producer_groups: list[str]


MAX_REQUESTERS = 10_000


class ClientRegistry:
    """Producer and consumer channels with their last heartbeat; times are the caller's monotonic seconds."""

    def __init__(self, expiry_seconds: float = 120.0) -> None:
        self.expiry_seconds = expiry_seconds
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[Any, ClientChannel]] = {}
        self._rr = itertools.count()
        # Request-reply: the connection each requesting client last sent a request on (REPLY_TO_CLIENT), so that a
        # reply finds it before the client's first heartbeat; bounded, oldest dropped first.
        self.requesters: dict[str, Any] = {}

    def heartbeat(
        self, connection: Any, data: dict[str, Any], *, now: float, language: str = "JAVA", version: int = 0
    ) -> HeartbeatResult:
        client_id = str(data.get("clientID") or "")
        changed: list[str] = []
        new_groups: list[str] = []
        for cdata in data.get("consumerDataSet") or []:
            group = str(cdata.get("groupName") or "")
            if not group:
                continue
            info = self.consumers.get(group)
            if info is None:
                info = self.consumers[group] = ConsumerGroupInfo(group)
                new_groups.append(group)
            info.consume_type = _enum_name(cdata.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY")
            info.message_model = _enum_name(cdata.get("messageModel"), MESSAGE_MODELS, "CLUSTERING")
            info.consume_from_where = _enum_name(
                cdata.get("consumeFromWhere"), CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"
            )
            joined = connection not in info.channels
            if joined:
                info.channels[connection] = ClientChannel(client_id, connection, language, version, now)
            else:
                info.channels[connection].last_update = now
            subs_changed = self._update_subscriptions(info, cdata.get("subscriptionDataSet") or [])
            if joined or subs_changed:
                changed.append(group)
        producer_groups = []
        for pdata in data.get("producerDataSet") or []:
            group = str(pdata.get("groupName") or "")
            if not group:
                continue
            producer_groups.append(group)
            channels = self.producers.setdefault(group, {})
            chan = channels.get(connection)
            if chan is None:
                channels[connection] = ClientChannel(client_id, connection, language, version, now)
            else:
                chan.last_update = now
        return HeartbeatResult(changed, new_groups, producer_groups)

    @staticmethod
    def _update_subscriptions(info: ConsumerGroupInfo, sub_list: list[dict[str, Any]]) -> bool:
        changed = False
        seen = set()
        for raw in sub_list:
            topic = str(raw.get("topic") or "")
            if not topic:
                continue
            seen.add(topic)
            try:
                version = int(raw.get("subVersion") or 0)
            except (TypeError, ValueError):
                version = 0
            sub = Subscription.parse(topic, raw.get("subString"), version, raw.get("expressionType") or "TAG")
            old = info.subscriptions.get(topic)
            if old is None:
                info.subscriptions[topic] = sub
                changed = True
            elif version > old.sub_version:
                info.subscriptions[topic] = sub
                changed = changed or old.expression != sub.expression
        for topic in list(info.subscriptions):
            if topic not in seen:
                del info.subscriptions[topic]
                changed = True
        return changed

    def unregister(
        self, connection: Any, *, producer_group: str | None = None, consumer_group: str | None = None
    ) -> list[str]:
        """Remove one client's membership; return the consumer groups that changed."""
        changed = []
        if producer_group and producer_group in self.producers:
            self.producers[producer_group].pop(connection, None)
            if not self.producers[producer_group]:
                del self.producers[producer_group]
        if consumer_group:
            info = self.consumers.get(consumer_group)
            if info is not None and info.channels.pop(connection, None) is not None:
                changed.append(consumer_group)
        return changed

    def connection_closed(self, connection: Any) -> list[str]:
        """Forget a closed connection everywhere; return the consumer groups that lost a member."""
        changed = []
        for group, info in self.consumers.items():
            if info.channels.pop(connection, None) is not None:
                changed.append(group)
        for group in list(self.producers):
            self.producers[group].pop(connection, None)
            if not self.producers[group]:
                del self.producers[group]
        return changed

    def expire(self, now: float) -> tuple[list[str], list[Any]]:
        """Drop channels idle for longer than the expiry; return changed groups and the dropped connections."""
        dead = set()
        for info in self.consumers.values():
            dead.update(c for c, ch in info.channels.items() if now - ch.last_update > self.expiry_seconds)
        for channels in self.producers.values():
            dead.update(c for c, ch in channels.items() if now - ch.last_update > self.expiry_seconds)
        changed: set[str] = set()
        for conn in dead:
            changed.update(self.connection_closed(conn))
        return sorted(changed), list(dead)

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return [] if info is None else info.client_ids()

    def consumer_connections(self, group: str) -> list[Any]:
        info = self.consumers.get(group)
        return [] if info is None else list(info.channels)

    def subscription(self, group: str, topic: str) -> Subscription | None:
        info = self.consumers.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def producer_channels(self, group: str) -> list[ClientChannel]:
        return list(self.producers.get(group, {}).values())

    def note_requester(self, client_id: str, connection: Any) -> None:
        """``client_id`` sent a request (a message carrying REPLY_TO_CLIENT) on ``connection``."""
        requesters = self.requesters
        if requesters.get(client_id) is connection:
            return
        requesters.pop(client_id, None)
        if len(requesters) >= MAX_REQUESTERS:
            del requesters[next(iter(requesters))]
        requesters[client_id] = connection

    def find_producer(self, client_id: str) -> ClientChannel | None:
        """Request-reply's requester: the connection ``client_id`` last sent a request on (one lookup), else its
        producer channel in any group (a scan, for a request that reached another broker)."""
        connection = self.requesters.get(client_id)
        if connection is not None:
            if not getattr(connection, "closed", False):
                return ClientChannel(client_id, connection)
            del self.requesters[client_id]
        for channels in self.producers.values():
            for channel in channels.values():
                if channel.client_id == client_id:
                    return channel
        return None

    def pick_producer(self, group: str, is_usable: Any = None) -> ClientChannel | None:
        """Round-robin over the live producer channels of ``group`` (for transaction checks)."""
        channels = self.producer_channels(group)
        if is_usable is not None:
            channels = [c for c in channels if is_usable(c.connection)]
        if not channels:
            return None
        return channels[next(self._rr) % len(channels)]
