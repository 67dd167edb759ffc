"""``spark.read.format("txmq")`` and ``spark.readStream.format("txmq")``: topics read through the broker.

Planning (``partitions``, ``latestOffset``) asks the name server for routes and the broker for queue offsets over a
short-lived txmq client; ``read`` opens its own client inside the worker and pulls its queue's offset range with
PULL_MESSAGE (no consumer registration: the subscription travels with each pull). Readers hold only plain data, so
they pickle. Offsets are ``{"topic/queueId": next offset}`` dicts with sorted string keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from txmq.client.config import ClientConfig
from txmq.client.instance import ClientInstance, acquire_instance
from txmq.client.message import MessageQueue, PullStatus
from txmq.errors import ConnectError, MQBrokerError, MQClientError, NoRouteError, RemotingError
from txmq.protocol.headers import PullMessageRequestHeader
from txmq.spark.common import (
    MESSAGE_SCHEMA,
    bool_option,
    check_options,
    dumps_offsets,
    int_option,
    message_row,
    offsets_option,
    queue_key,
    topics_option,
)
from txmq.spark.errors import TxmqSparkError

log = logging.getLogger("txmq.spark")

T = TypeVar("T")

PULL_BATCH = 32  # the broker's per-pull cap (maxTransferCountOnMessageInMemory)
DEFAULT_GROUP = "txmq_spark_reader"
_FLAG_SUBSCRIPTION = 0x4
KNOWN_OPTIONS = {
    "namesrv",
    "topics",
    "topic",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "accessKey",
    "secretKey",
    "maxMessagesPerPartition",
    "maxMessagesPerTrigger",
    "maxOffsetsPerTrigger",  # the Kafka source's name for maxMessagesPerTrigger
    "consumerGroup",
    "commitConsumerGroup",
    "requestTimeout",
    "failOnDataLoss",  # as the Kafka source: fail (default) or skip with a warning when retention deleted messages
    "path",
}


@dataclass(frozen=True)
class BrokerOptions:
    namesrv: str
    topics: tuple[str, ...]
    access_key: str | None
    secret_key: str | None
    group: str
    timeout: float
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, fmt: str, raw: dict[str, str]) -> tuple[BrokerOptions, dict[str, str]]:
        opts = check_options(fmt, raw, KNOWN_OPTIONS)
        namesrv = opts.get("namesrv", "").strip()
        if not namesrv:
            raise TxmqSparkError(f"option namesrv is required for format {fmt!r} (the name server, host:port)")
        for addr in namesrv.replace(",", ";").split(";"):
            host, sep, port = addr.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise TxmqSparkError(f"option namesrv: {addr.strip()!r} is not host:port")
        access, secret = opts.get("accesskey"), opts.get("secretkey")
        if bool(access) != bool(secret):
            raise TxmqSparkError("options accessKey and secretKey must be given together")
        timeout = int_option(opts, "requestTimeout", 5000, minimum=1)
        assert timeout is not None
        return (
            cls(
                namesrv=namesrv,
                topics=tuple(topics_option(opts)),
                access_key=access or None,
                secret_key=secret or None,
                group=opts.get("consumergroup") or DEFAULT_GROUP,
                timeout=timeout / 1000,
                fail_on_data_loss=bool_option(opts, "failOnDataLoss", True),
            ),
            opts,
        )


# ---------------------------------------------------------------------------------------------------------------
# Talking to the cluster (each call opens and closes its own client on a private event loop)


def run_client(options: BrokerOptions, fn: Callable[[ClientInstance], Awaitable[T]]) -> T:
    """Run ``fn(instance)`` against the cluster, translating failures into one-line :class:`TxmqSparkError`."""

    async def main() -> T:
        config = ClientConfig.build(
            options.namesrv,
            access_key=options.access_key,
            secret_key=options.secret_key,
            request_timeout=options.timeout,
            instance_name=f"txmq-spark-{id(options)}",
        )
        instance = await acquire_instance(config)
        try:
            return await fn(instance)
        finally:
            await instance.release()

    try:
        return asyncio.run(main())
    except TxmqSparkError:
        raise
    except NoRouteError as exc:
        raise TxmqSparkError(
            f"unknown topic {exc.topic!r}: the name server at {options.namesrv} has no route for it"
        ) from None
    except (ConnectError, ConnectionError, TimeoutError) as exc:
        raise TxmqSparkError(f"name server or broker unreachable ({options.namesrv}): {exc}") from None
    except MQBrokerError as exc:
        raise TxmqSparkError(f"the broker refused: {exc}") from None
    except (RemotingError, MQClientError) as exc:
        raise TxmqSparkError(f"talking to the cluster at {options.namesrv} failed: {exc}") from None


@dataclass(frozen=True)
class QueueInfo:
    key: str
    topic: str
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int


async def list_queues(
    instance: ClientInstance, topics: tuple[str, ...], timestamps: tuple[int | None, int | None] = (None, None)
) -> tuple[list[QueueInfo], dict[str, tuple[int | None, int | None]]]:
    """Every readable queue of ``topics`` with its min and max offset (and offsets found by timestamp)."""
    out: list[QueueInfo] = []
    by_time: dict[str, tuple[int | None, int | None]] = {}
    for topic in topics:
        route = await instance.update_route(topic)
        queues = route.subscribe_queues()
        several = len({q.broker_name for q in queues}) > 1
        for mq in queues:
            addr = await instance.find_broker_addr_refreshing(mq.broker_name, topic)
            if addr is None:
                raise TxmqSparkError(f"broker {mq.broker_name} of topic {topic!r} has no master address")
            lo = await instance.api.get_min_offset(addr, mq)
            hi = await instance.api.get_max_offset(addr, mq)
            key = queue_key(topic, mq.queue_id, mq.broker_name if several else None)
            out.append(QueueInfo(key, topic, mq.broker_name, mq.queue_id, lo, hi))
            if timestamps != (None, None):
                start_ts, end_ts = timestamps
                s = await instance.api.search_offset(addr, mq, start_ts) if start_ts is not None else None
                e = await instance.api.search_offset(addr, mq, end_ts) if end_ts is not None else None
                by_time[key] = (s, e)
    return out, by_time


def resolve(spec: str | dict[str, int] | None, q: QueueInfo, default: str) -> int:
    """The offset ``spec`` names for queue ``q`` (clamped into the queue's range)."""
    if spec is None:
        spec = default
    if isinstance(spec, dict):
        value = spec.get(q.key, spec.get(f"{q.topic}/{q.queue_id}", -2 if default == "earliest" else -1))
    else:
        value = -2 if spec == "earliest" else -1
    if value == -2:
        return q.min_offset
    if value == -1:
        return q.max_offset
    return max(q.min_offset, min(value, q.max_offset))


def check_offset_keys(spec: Any, queues: list[QueueInfo], name: str) -> None:
    if isinstance(spec, dict):
        known = {q.key for q in queues} | {f"{q.topic}/{q.queue_id}" for q in queues}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise TxmqSparkError(f"option {name} names queue {unknown[0]!r}, which the topics do not have")


# ---------------------------------------------------------------------------------------------------------------
# Reading one queue range (in a worker)


@dataclass
class QueueRange(InputPartition):
    namesrv: str
    access_key: str | None
    secret_key: str | None
    group: str
    timeout: float
    fail_on_data_loss: bool
    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    def __init__(self, options: BrokerOptions, topic: str, broker: str, queue_id: int, start: int, end: int) -> None:
        self.namesrv = options.namesrv
        self.access_key = options.access_key
        self.secret_key = options.secret_key
        self.group = options.group
        self.timeout = options.timeout
        self.fail_on_data_loss = options.fail_on_data_loss
        self.topic = topic
        self.broker = broker
        self.queue_id = queue_id
        self.start = start
        self.end = end

    def options(self) -> BrokerOptions:
        return BrokerOptions(
            self.namesrv,
            (self.topic,),
            self.access_key,
            self.secret_key,
            self.group,
            self.timeout,
            self.fail_on_data_loss,
        )


def read_range(part: QueueRange) -> Iterator[tuple[Any, ...]]:
    """Rows of ``part``'s queue in ``[start, end)``, pulled in batches (the broker caps a pull at 32)."""
    if part.end <= part.start:
        return iter(())
    options = part.options()

    async def pull_all(instance: ClientInstance) -> list[tuple[Any, ...]]:
        await instance.update_route(part.topic)
        addr = await instance.find_broker_addr_refreshing(part.broker, part.topic)
        if addr is None:
            raise TxmqSparkError(f"broker {part.broker} of topic {part.topic!r} is not in the route any more")
        rows: list[tuple[Any, ...]] = []
        offset = part.start
        while offset < part.end:
            header = PullMessageRequestHeader(
                consumerGroup=part.group,
                topic=part.topic,
                queueId=part.queue_id,
                queueOffset=offset,
                maxMsgNums=min(PULL_BATCH, part.end - offset),
                sysFlag=_FLAG_SUBSCRIPTION,
                commitOffset=0,
                suspendTimeoutMillis=0,
                subscription="*",
                subVersion=0,
                expressionType="TAG",
            )
            result = await instance.api.pull_message(addr, part.broker, header, part.timeout)
            if result.status is PullStatus.FOUND:
                for m in result.messages:
                    if part.start <= m.queue_offset < part.end:
                        m.properties.pop("MIN_OFFSET", None)
                        m.properties.pop("MAX_OFFSET", None)
                        rows.append(_row_from_ext(m))
                nxt = result.next_begin_offset
            elif result.status is PullStatus.OFFSET_ILLEGAL and result.next_begin_offset > offset:
                nxt = result.next_begin_offset
                data_lost(f"{part.topic}/{part.queue_id}", offset, nxt, part.fail_on_data_loss)
            elif result.status is PullStatus.NO_MATCHED_MSG:
                nxt = result.next_begin_offset
            else:
                break  # nothing more below the queue's end
            if nxt <= offset:
                break
            offset = nxt
        return rows

    return iter(run_client(options, pull_all))


def data_lost(queue: str, lo: int, hi: int, fail: bool) -> None:
    """Messages ``[lo, hi)`` of ``queue`` are gone before they were read (deleted by retention): an error by
    default, a warning naming the range with ``failOnDataLoss=false`` (the Kafka source's rule)."""
    what = f"{queue}: messages at offsets [{lo}, {hi}) were deleted (retention) before they were read"
    if fail:
        raise TxmqSparkError(f"{what}; set option failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", what)


def _row_from_ext(m: Any) -> tuple[Any, ...]:
    from txmq.protocol.record import MessageRecord

    record = MessageRecord(
        topic=m.topic,
        body=m.body,
        queue_id=m.queue_id,
        flag=m.flag,
        queue_offset=m.queue_offset,
        physical_offset=m.commit_log_offset,
        sys_flag=m.sys_flag,
        born_timestamp=m.born_timestamp,
        born_host=m.born_host,
        store_timestamp=m.store_timestamp,
        store_host=m.store_host,
        reconsume_times=m.reconsume_times,
        prepared_transaction_offset=m.prepared_transaction_offset,
        properties=m.properties,
    )
    return message_row(record)


def split_ranges(options: BrokerOptions, q: QueueInfo, start: int, end: int, chunk: int) -> list[QueueRange]:
    out = []
    pos = start
    while pos < end:
        nxt = min(end, pos + chunk)
        out.append(QueueRange(options, q.topic, q.broker, q.queue_id, pos, nxt))
        pos = nxt
    return out


# ---------------------------------------------------------------------------------------------------------------
# The data source


class TxmqDataSource(DataSource):
    """Format ``txmq``: topics through the broker, batch and streaming."""

    @classmethod
    def name(cls) -> str:
        return "txmq"

    def schema(self) -> str:
        BrokerOptions.parse("txmq", dict(self.options))  # bad options fail at load(), before any query runs
        return MESSAGE_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return TxmqBatchReader(dict(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TxmqStreamReader(dict(self.options))


def _timestamps(opts: dict[str, str]) -> tuple[int | None, int | None]:
    return (
        int_option(opts, "startingTimestamp", None),
        int_option(opts, "endingTimestamp", None),
    )


class TxmqBatchReader(DataSourceReader):
    def __init__(self, raw: dict[str, str]) -> None:
        self.options, opts = BrokerOptions.parse("txmq", raw)
        self.starting = offsets_option(opts, "startingOffsets")
        self.ending = offsets_option(opts, "endingOffsets")
        self.timestamps = _timestamps(opts)
        if self.starting is not None and self.timestamps[0] is not None:
            raise TxmqSparkError("give startingOffsets or startingTimestamp, not both")
        if self.ending is not None and self.timestamps[1] is not None:
            raise TxmqSparkError("give endingOffsets or endingTimestamp, not both")
        self.chunk = int_option(opts, "maxMessagesPerPartition", 100_000, minimum=1)

    def partitions(self) -> list[QueueRange]:
        queues, by_time = run_client(self.options, lambda inst: list_queues(inst, self.options.topics, self.timestamps))
        check_offset_keys(self.starting, queues, "startingOffsets")
        check_offset_keys(self.ending, queues, "endingOffsets")
        parts: list[QueueRange] = []
        for q in queues:
            start_ts, end_ts = by_time.get(q.key, (None, None))
            start = start_ts if start_ts is not None else resolve(self.starting, q, "earliest")
            end = end_ts if end_ts is not None else resolve(self.ending, q, "latest")
            assert self.chunk is not None
            parts.extend(split_ranges(self.options, q, start, end, self.chunk))
        return parts

    def read(self, partition: QueueRange) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        return read_range(partition)


class TxmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over per-queue offsets. Queues that appear later start at their first offset."""

    def __init__(self, raw: dict[str, str]) -> None:
        self.options, opts = BrokerOptions.parse("txmq", raw)
        self.starting = offsets_option(opts, "startingOffsets")
        if self.starting is None:
            self.starting = "earliest"
        if opts.get("endingoffsets") or opts.get("endingtimestamp"):
            raise TxmqSparkError("endingOffsets/endingTimestamp are for batch reads; a stream has no end")
        self.start_ts = int_option(opts, "startingTimestamp", None)
        self.max_per_trigger = int_option(opts, "maxMessagesPerTrigger", None, minimum=1)
        kafka_name = int_option(opts, "maxOffsetsPerTrigger", None, minimum=1)
        if kafka_name is not None:
            if self.max_per_trigger is not None:
                raise TxmqSparkError("give maxMessagesPerTrigger or maxOffsetsPerTrigger (the same limit), not both")
            self.max_per_trigger = kafka_name
        self.commit_group = opts.get("commitconsumergroup") or None  # lag of this group shows in txmq admin
        self._target: dict[str, int] | None = None
        self._stored: dict[str, int] | None = None  # the offsets last stored on the broker for commit_group

    def _queues(self) -> list[QueueInfo]:
        return run_client(self.options, lambda inst: list_queues(inst, self.options.topics))[0]

    def initialOffset(self) -> dict[str, int]:
        if self.start_ts is not None:
            queues, by_time = run_client(
                self.options, lambda inst: list_queues(inst, self.options.topics, (self.start_ts, None))
            )
            return dumps_offsets({q.key: by_time[q.key][0] or q.min_offset for q in queues})
        queues = self._queues()
        check_offset_keys(self.starting, queues, "startingOffsets")
        return dumps_offsets({q.key: resolve(self.starting, q, "earliest") for q in queues})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {q.key: q.max_offset for q in self._queues()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        # Spark plans a batch only once the one before is committed (or replays an uncommitted one without asking):
        # ``start`` is what the sink holds. Storing it here, not only in commit(), which Spark calls one batch late
        # and never for a run's last batch, keeps the broker's offsets for commitConsumerGroup up to date.
        self._store_group_offsets(start)
        target = self._target
        latest = dict(target) if target is not None else {q.key: q.max_offset for q in self._queues()}
        begin = {k: int(start.get(k, 0)) for k in latest}
        for k, v in start.items():  # a queue that vanished keeps its offset
            latest.setdefault(k, int(v))
            begin.setdefault(k, int(v))
        end = {k: max(begin[k], latest[k]) for k in latest}
        budget = getattr(limit, "max_rows", None)
        if isinstance(limit, ReadMaxRows) and budget is not None:
            end = _cap(begin, end, int(budget))
        return dumps_offsets(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueRange]:
        queues = {q.key: q for q in self._queues()}
        parts = []
        for key in sorted(end):
            lo, hi = int(start.get(key, 0)), int(end[key])
            if hi <= lo:
                continue
            q = queues.get(key)
            if q is None:
                raise TxmqSparkError(f"queue {key} is in the offsets but no longer in the topic's route")
            if lo < q.min_offset:  # retention got there first (a checkpoint older than the broker's reserve time)
                data_lost(key, lo, min(hi, q.min_offset), self.options.fail_on_data_loss)
                lo = q.min_offset
                if hi <= lo:
                    continue
            parts.append(QueueRange(self.options, q.topic, q.broker, q.queue_id, lo, hi))
        return parts

    def read(self, partition: QueueRange) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        return read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._store_group_offsets(end)

    def _store_group_offsets(self, offsets: dict[str, Any]) -> None:
        group = self.commit_group
        if group is None or not offsets:
            return
        end = {k: int(v) for k, v in offsets.items()}
        if end == self._stored or (self._stored is not None and all(end[k] <= self._stored.get(k, -1) for k in end)):
            return  # already there (latestOffset runs at every trigger; commit() repeats it one batch late)
        queues = {q.key: q for q in self._queues()}

        async def update(instance: ClientInstance) -> None:
            for key, offset in sorted(end.items()):
                q = queues.get(key)
                if q is None:
                    continue
                mq = MessageQueue(q.topic, q.broker, q.queue_id)
                addr = await instance.find_broker_addr_refreshing(q.broker, q.topic)
                if addr is not None:
                    await instance.api.update_consumer_offset(addr, group, mq, int(offset), oneway=False)

        try:
            run_client(self.options, update)
        except TxmqSparkError as exc:  # the checkpoint is the truth; the broker's copy is for lag display only
            log.warning("committing consumer group %s offsets to the broker failed: %s", group, exc)
            return
        self._stored = end


def _cap(begin: dict[str, int], end: dict[str, int], budget: int) -> dict[str, int]:
    """Spread ``budget`` messages over the queues with a backlog, round-robin in key order (deterministic)."""
    out = dict(begin)
    remaining = {k: end[k] - begin[k] for k in sorted(end) if end[k] > begin[k]}
    while budget > 0 and remaining:
        share = max(1, budget // len(remaining))
        for k in list(remaining):
            take = min(share, remaining[k], budget)
            out[k] += take
            remaining[k] -= take
            budget -= take
            if remaining[k] == 0:
                del remaining[k]
            if budget == 0:
                break
    return out


__all__ = ["KNOWN_OPTIONS", "TxmqDataSource"]
