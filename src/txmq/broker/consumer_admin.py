"""Operator requests for consumer groups (txmq codes 1320..1322): offset reset, dead-letter listing and resending.

A reset sets the group's committed offsets and tells the group's online consumers (RESET_CONSUMER_CLIENT_OFFSET,
220, with RocketMQ's ResetOffsetBody) to drop what they hold for those queues and pull from the new offsets.

Resent dead letters are remembered per group in ``config/dlqResent.json`` (DLQ queue offsets), written right after
each copy is stored; a second resend of the same message is reported as already resent, not stored again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.fastjson import mq_key, with_object_map
from txmq.broker.schedule import (
    PROP_DELAY_FROM,
    PROP_DLQ_REASON,
    PROP_LAST_FAILURE,
    PROP_RESENT_FROM_DLQ,
)
from txmq.broker.stored import put_status_code
from txmq.broker.topics import PERM_READ, PERM_WRITE, dlq_topic, retry_topic
from txmq.errors import ConfigError, RecordDecodeError
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqConsumerRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import MessageRecord, Prop
from txmq.util import atomic_write_json

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

DEFAULT_LIST_MAX = 1000
LOCK_LIFETIME_KEY = "txmqLockMaxLiveTimeMills"


def lock_lifetime_seconds(config: BrokerConfig) -> float:
    """Queue-lock lifetime: RocketMQ's 60 s, or broker.conf ``txmqLockMaxLiveTimeMills`` (shorter in tests)."""
    raw = config.extra.get(LOCK_LIFETIME_KEY, "60000")
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{LOCK_LIFETIME_KEY}={raw!r} must be a positive number of milliseconds")
    return value / 1000


RESET_NOTIFY_TIMEOUT = 5.0


class ConsumerAdminProcessor:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_host: tuple[str, int],
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        clients: ClientRegistry,
        offsets: ConsumerOffsetManager,
        config_dir: Path,
    ) -> None:
        self.config = config
        self.store_host = store_host
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.clients = clients
        self.offsets = offsets
        self._resent_path = config_dir / "dlqResent.json"
        self._lock = threading.Lock()
        self._resend_lock = asyncio.Lock()
        self._random = random.Random()
        self.resent: dict[str, set[int]] = {}
        if self._resent_path.exists():
            try:
                raw = orjson.loads(self._resent_path.read_bytes())
                self.resent = {g: {int(o) for o in offs} for g, offs in raw.get("resent", {}).items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                log.error("resent dead letters %s are unreadable (%s); starting empty", self._resent_path, exc)

    def handlers(self) -> dict[int, Any]:
        return {
            TxmqConsumerRequestCode.RESET_CONSUMER_OFFSET: self.reset_offset,
            TxmqConsumerRequestCode.LIST_DEAD_LETTERS: self.list_dead_letters,
            TxmqConsumerRequestCode.RESEND_DEAD_LETTERS: self.resend_dead_letters,
        }

    @staticmethod
    def _group(cmd: RemotingCommand) -> str | None:
        group = (cmd.ext_fields.get("consumerGroup") or "").strip()
        return group or None

    # -- reset offset -------------------------------------------------------------------------------------------

    def offset_for(self, topic: str, queue_id: int, to: str) -> int:
        """The queue offset for ``to``: "earliest", "latest" or epoch ms (the first message stored at or after)."""
        store = self.store
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        if to == "earliest":
            return low
        if to == "latest":
            return high
        ts = int(to)
        # The first message stored at or after ts (the store's search returns the nearest one).
        offset = min(max(store.search_offset_by_timestamp(topic, queue_id, ts), low), high)
        while offset > low and (store.store_time_at(topic, queue_id, offset - 1) or 0) >= ts:
            offset -= 1
        while offset < high and (store.store_time_at(topic, queue_id, offset) or 0) < ts:
            offset += 1
        return offset

    async def reset_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = self._group(cmd)
        topic = (cmd.ext_fields.get("topic") or "").strip()
        to = (cmd.ext_fields.get("to") or "").strip().lower()
        if group is None or not topic:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "consumerGroup and topic are required")
        if to not in ("earliest", "latest") and not (to.isdigit() and len(to) <= 18):
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"'to' must be earliest, latest or a timestamp in ms, got {to!r}"
            )
        cfg = self.topics.get(topic)
        if cfg is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        if self.subscriptions.get(group) is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        offsets = {qid: self.offset_for(topic, qid, to) for qid in range(cfg.read_queue_nums)}
        notified = await self.apply_reset(group, topic, offsets, to if to.isdigit() else "-1")
        log.info("offsets of %s on %s reset to %s (%s); %d consumer(s) told", group, topic, to, offsets, notified)
        name = self.config.broker_name
        out = {
            "offsets": [
                {"topic": topic, "brokerName": name, "queueId": q, "offset": o} for q, o in sorted(offsets.items())
            ],
            "notifiedConsumers": notified,
        }
        return cmd.response(body=orjson.dumps(out))

    async def apply_reset(self, group: str, topic: str, offsets: dict[int, int], timestamp: str) -> int:
        """Commit ``offsets`` and send RESET_CONSUMER_CLIENT_OFFSET to the group's online consumers; return how many."""
        self.offsets.reset(group, topic, offsets)
        await asyncio.get_running_loop().run_in_executor(None, self.offsets.persist)
        name = self.config.broker_name
        body = with_object_map("offsetTable", [(mq_key(topic, name, q), o) for q, o in sorted(offsets.items())], {})
        notified = 0
        for conn in self.clients.consumer_connections(group):
            if conn.closed:
                continue
            request = RemotingCommand.request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                {"topic": topic, "group": group, "timestamp": timestamp, "isForce": "true"},
                body,
            )
            try:
                conn.send_oneway(request)
                notified += 1
            except Exception as exc:  # a dying connection must not fail the reset
                log.info("telling consumer %r of %s about the reset failed: %s", conn, group, exc)
        return notified

    # -- dead letters -------------------------------------------------------------------------------------------

    def _dead_letters(self, group: str, limit: int) -> list[tuple[int, MessageRecord]]:
        store = self.store
        topic = dlq_topic(group)
        out: list[tuple[int, MessageRecord]] = []
        offset, high = store.min_offset(topic, 0), store.max_offset(topic, 0)
        while offset < high and len(out) < limit:
            entries = store.read_consume_queue(topic, 0, offset, min(256, high - offset))
            if not entries:
                break
            for phys, size, _ in entries:
                try:
                    record = store.read_message(phys, size)
                except RecordDecodeError:
                    record = None
                if record is not None:
                    out.append((offset, record))
                offset += 1
        return out[:limit]

    def _describe(self, group: str, queue_offset: int, record: MessageRecord) -> dict[str, Any]:
        props = record.properties
        return {
            "queueOffset": queue_offset,
            "offsetMsgId": record.offset_msg_id,
            "msgId": props.get(Prop.UNIQ_KEY) or record.offset_msg_id,
            "originTopic": props.get(Prop.RETRY_TOPIC) or record.topic,
            "originMsgId": props.get(Prop.ORIGIN_MESSAGE_ID) or "",
            "reconsumeTimes": record.reconsume_times,
            "storeTimestamp": record.store_timestamp,
            "reason": props.get(PROP_DLQ_REASON) or "",
            "lastFailure": props.get(PROP_LAST_FAILURE) or "",
            "tags": props.get(Prop.TAGS) or "",
            "keys": props.get(Prop.KEYS) or "",
            "bodySize": len(record.body),
            "resent": queue_offset in self.resent.get(group, set()),
        }

    def list_dead_letters(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = self._group(cmd)
        if group is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "consumerGroup is required")
        try:
            limit = int(cmd.ext_fields.get("maxNum") or DEFAULT_LIST_MAX)
        except ValueError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "maxNum must be an integer")
        letters = self._dead_letters(group, max(1, limit))
        body = {"messages": [self._describe(group, off, rec) for off, rec in letters]}
        return cmd.response(body=orjson.dumps(body))

    def _persist_resent(self) -> None:
        with self._lock:
            snapshot = {g: sorted(offs) for g, offs in self.resent.items()}
        atomic_write_json(self._resent_path, {"resent": snapshot})

    def _resend_copy(self, group: str, record: MessageRecord) -> MessageRecord | None:
        """A dead letter's copy for ``%RETRY%<group>`` only: the group that gave up on it consumes it again (its
        consumers subscribe to their retry topic and see the original topic from RETRY_TOPIC); other groups
        subscribed to the original topic do not get it a second time."""
        props = dict(record.properties)
        if not props.get(Prop.RETRY_TOPIC):
            return None  # without its original topic the group's consumers could not tell where it came from
        topic = retry_topic(group)
        cfg, _ = self.topics.ensure(topic, 1, PERM_READ | PERM_WRITE)
        if cfg is None or not cfg.writable or cfg.write_queue_nums <= 0:
            return None
        for key in (Prop.DELAY, Prop.REAL_TOPIC, Prop.REAL_QID, PROP_DELAY_FROM, PROP_DLQ_REASON):
            props.pop(key, None)
        props[PROP_RESENT_FROM_DLQ] = record.offset_msg_id
        return MessageRecord(
            topic=topic,
            body=record.body,
            queue_id=self._random.randrange(cfg.write_queue_nums),
            flag=record.flag,
            sys_flag=record.sys_flag,
            born_timestamp=record.born_timestamp,
            born_host=record.born_host,
            store_host=self.store_host,
            reconsume_times=0,
            properties=props,
        )

    async def resend_dead_letters(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = self._group(cmd)
        if group is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "consumerGroup is required")
        want_all = (cmd.ext_fields.get("all") or "").lower() == "true"
        ids = [i.strip() for i in (cmd.ext_fields.get("msgIds") or "").split(",") if i.strip()]
        if not want_all and not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "give msgIds or all=true")
        store = self.store
        report: dict[str, list[str]] = {"resent": [], "alreadyResent": [], "notFound": [], "failed": []}
        async with self._resend_lock:  # two operators resending at once must not both store a copy
            letters = self._dead_letters(group, 10**9)
            chosen: list[tuple[int, MessageRecord, str]] = []
            if want_all:
                chosen = [(o, r, r.properties.get(Prop.UNIQ_KEY) or r.offset_msg_id) for o, r in letters]
            else:
                for wanted in ids:
                    match = [
                        (o, r)
                        for o, r in letters
                        if wanted.upper() in (r.offset_msg_id.upper(), (r.properties.get(Prop.UNIQ_KEY) or "").upper())
                        or wanted.upper() == (r.properties.get(Prop.ORIGIN_MESSAGE_ID) or "").upper()
                    ]
                    if not match:
                        report["notFound"].append(wanted)
                    chosen.extend((o, r, wanted) for o, r in match)
            done = self.resent.setdefault(group, set())
            for offset, record, label in chosen:
                if offset in done:
                    report["alreadyResent"].append(label)
                    continue
                copy = self._resend_copy(group, record)
                if copy is None:
                    report["failed"].append(
                        f"{label}: {retry_topic(group)} is not writable here, or the message has no RETRY_TOPIC"
                    )
                    continue
                result = await store.put(copy)
                if put_status_code(result) not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
                    report["failed"].append(f"{label}: {result.status.value}")
                    continue
                with self._lock:
                    done.add(offset)
                await asyncio.get_running_loop().run_in_executor(None, self._persist_resent)
                report["resent"].append(label)
        log.info("dead letters of %s resent: %s", group, report)
        return cmd.response(body=orjson.dumps(report))
