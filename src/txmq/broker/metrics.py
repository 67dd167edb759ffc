"""Prometheus metrics of one broker (issue 17): ``/metrics`` on ``metricsPort``.

Names and labels are RocketMQ 5's (``BrokerMetricsConstant``, ``DefaultStoreMetricsConstant``,
``RemotingMetricsConstant``) where RocketMQ has the metric, so its Grafana dashboards read them; txmq's own have the
``txmq_`` prefix. Almost everything is read at scrape time from counters and tables the broker keeps anyway (a
custom collector); the only work added to the request path is :class:`RpcLatency`'s timing of each request
(compiled, in :mod:`txmq.broker.rpc_latency`). Per-topic and per-group series are bounded: past
``metricsLabelLimit`` only the busiest keep their own series and the rest are summed into one series labelled
``topic="_others"`` (or ``consumer_group="_others"``), so sums stay true.
The core (store, txn) never imports this module: the broker's composition root wires it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from txmq.broker.rpc_latency import RPC_BUCKETS_MS, RpcLatency
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqRequestCode
from txmq.protocol.topics import (
    SCHEDULE_TOPIC,
    SYS_TRANS_GROUP,
    SYSTEM_TOPIC_PREFIX,
    TRANS_CHECK_MAX_TIME_TOPIC,
    is_dlq_topic,
    is_retry_topic,
)

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.runtime import BrokerStats
    from txmq.broker.txn import TransactionService
    from txmq.net import Server
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.metrics")

OTHERS = "_others"
# The store keeps flush times in power-of-two microsecond buckets; these are the bounds exported (64 us .. 16.8 s).
FLUSH_BUCKET_EXPONENTS = range(6, 25)
_SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})


def request_code_name(code: int) -> str:
    """RocketMQ's label value: the request code's constant name in lower case (the number when txmq has none)."""
    for enum in (RequestCode, TxmqRequestCode):
        try:
            return enum(code).name.lower()
        except ValueError:
            continue
    return str(code)


def response_code_name(code: int) -> str:
    try:
        return ResponseCode(code).name.lower()
    except ValueError:
        return str(code)


def is_system_topic(topic: str) -> bool:
    return topic.lower().startswith(SYSTEM_TOPIC_PREFIX) or topic in _SYSTEM_TOPICS


def _top(items: Iterable[tuple[Any, float]], limit: int) -> tuple[list[tuple[Any, float]], float, bool]:
    """The ``limit`` largest items, the sum of the others, and whether there were others."""
    items = list(items)
    if len(items) <= limit:
        return items, 0.0, False
    kept = heapq.nlargest(limit, items, key=itemgetter(1))
    return kept, sum(map(itemgetter(1), items)) - sum(map(itemgetter(1), kept)), True


class BrokerCollector(Collector):
    """Reads the broker's state at each scrape and yields RocketMQ-named metric families."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        stats: BrokerStats,
        offsets: ConsumerOffsetManager,
        clients: ClientRegistry,
        transactions: TransactionService,
        server: Server,
        rpc: RpcLatency | None,
    ) -> None:
        self.config = config
        self.store = store
        self.stats = stats
        self.offsets = offsets
        self.clients = clients
        self.transactions = transactions
        self.server = server
        self.rpc = rpc
        self.limit = max(1, config.metrics_label_limit)
        self.base_names = ["cluster", "node_type", "node_id"]
        self.base = [config.broker_cluster_name, "broker", config.broker_name]

    def _family(self, kind: type[Metric], name: str, doc: str, labels: list[str], **kw: Any) -> Any:
        return kind(name, doc, labels=self.base_names + labels, **kw)

    def collect(self) -> Iterator[Metric]:
        yield from self._messages_in()
        yield from self._messages_out()
        yield from self._consumers()
        yield from self._transactions()
        yield from self._storage()
        yield from self._connections()
        if self.rpc is not None:
            yield self._rpc_latency()

    # -- messages in and out ----------------------------------------------------------------------------------------

    def _messages_in(self) -> Iterator[Metric]:
        st = self.store.statistics
        puts = dict(st.topic_puts)  # copies: the writer thread may add a topic while we read
        sizes = dict(st.topic_bytes)
        labels = ["topic", "is_retry", "is_system"]
        messages = self._family(CounterMetricFamily, "rocketmq_messages_in_total", "Messages stored per topic.", labels)
        throughput = self._family(
            CounterMetricFamily, "rocketmq_throughput_in_total", "Record bytes stored per topic.", labels
        )
        dlq = self._family(
            CounterMetricFamily,
            "rocketmq_send_to_dlq_messages_total",
            "Messages sent to a consumer group's %DLQ% topic.",
            ["consumer_group"],
        )
        kept, rest, others = _top(puts.items(), self.limit)
        kept_bytes = 0
        for topic, n in kept:
            values = [*self.base, topic, _bool(is_retry_topic(topic)), _bool(is_system_topic(topic))]
            messages.add_metric(values, n)
            nbytes = sizes.get(topic, 0)
            kept_bytes += nbytes
            throughput.add_metric(values, nbytes)
        if others:
            values = [*self.base, OTHERS, "false", "false"]
            messages.add_metric(values, rest)
            throughput.add_metric(values, sum(sizes.values()) - kept_bytes)
        dlq_kept, dlq_rest, dlq_others = _top(((t[5:], n) for t, n in puts.items() if is_dlq_topic(t)), self.limit)
        for group, n in dlq_kept:
            dlq.add_metric([*self.base, group], n)
        if dlq_others:
            dlq.add_metric([*self.base, OTHERS], dlq_rest)
        yield messages
        yield throughput
        yield dlq

    def _messages_out(self) -> Iterator[Metric]:
        out = dict(self.stats.out)
        labels = ["topic", "consumer_group"]
        messages = self._family(
            CounterMetricFamily, "rocketmq_messages_out_total", "Messages handed out by pulls.", labels
        )
        throughput = self._family(
            CounterMetricFamily, "rocketmq_throughput_out_total", "Record bytes handed out by pulls.", labels
        )
        kept, rest, others = _top(((k, v[0]) for k, v in out.items()), self.limit)
        kept_bytes = 0
        for (topic, group), n in kept:
            messages.add_metric([*self.base, topic, group], n)
            nbytes = out[(topic, group)][1]
            kept_bytes += nbytes
            throughput.add_metric([*self.base, topic, group], nbytes)
        if others:
            messages.add_metric([*self.base, OTHERS, OTHERS], rest)
            throughput.add_metric([*self.base, OTHERS, OTHERS], sum(v[1] for v in out.values()) - kept_bytes)
        yield messages
        yield throughput

    # -- consumer lag ------------------------------------------------------------------------------------------------

    def consumer_state(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Per (group, topic): (lag, in flight, ready). Lag is the max offset less the committed offset over the
        queues; in flight what the last pull handed out past the committed offset; ready the rest."""
        pulled: dict[tuple[str, str], dict[int, int]] = {}
        for (group, topic, queue_id), offset in list(self.stats.pulled.items()):
            queues = pulled.get((group, topic))
            if queues is None:
                pulled[(group, topic)] = {queue_id: offset}
            else:
                queues[queue_id] = offset
        max_offset = self.store.max_offset
        state: dict[tuple[str, str], tuple[int, int, int]] = {}
        empty: dict[int, int] = {}
        for key, done in list(self.offsets.table.items()):
            topic, _, group = key.partition("@")
            if group == SYS_TRANS_GROUP:
                continue
            pair = (group, topic)
            taken = pulled.pop(pair, empty)
            lag = inflight = ready = 0
            for queue_id, c in list(done.items()):
                end = max_offset(topic, queue_id)
                p = taken.get(queue_id, c)
                if p < c:
                    p = c
                if end > c:
                    lag += end - c
                    inflight += (p if p < end else end) - c
                    if end > p:
                        ready += end - p
            for queue_id, p in taken.items():
                if queue_id not in done:  # pulled, nothing committed yet: in flight from the first pull on
                    end = max_offset(topic, queue_id)
                    if end > p:
                        lag += end - p
                        ready += end - p
            state[pair] = (lag, inflight, ready)
        for (group, topic), taken in pulled.items():  # groups that pulled and never committed
            lag = 0
            for queue_id, p in taken.items():
                end = max_offset(topic, queue_id)
                if end > p:
                    lag += end - p
            state[(group, topic)] = (lag, 0, lag)
        return state

    def _consumers(self) -> Iterator[Metric]:
        labels = ["topic", "consumer_group", "is_retry"]
        families = [
            self._family(
                GaugeMetricFamily,
                "rocketmq_consumer_lag_messages",
                "Messages of the topic not yet committed by the group.",
                labels,
            ),
            self._family(
                GaugeMetricFamily,
                "rocketmq_consumer_inflight_messages",
                "Messages pulled by the group and not yet committed.",
                labels,
            ),
            self._family(
                GaugeMetricFamily,
                "rocketmq_consumer_ready_messages",
                "Messages of the topic the group has not pulled yet.",
                labels,
            ),
        ]
        state = self.consumer_state()
        kept, _, others = _top(((pair, v[0]) for pair, v in state.items()), self.limit)
        kept_pairs = {pair for pair, _ in kept}
        for (group, topic), _lag in kept:
            for family, value in zip(families, state[(group, topic)], strict=True):
                family.add_metric([*self.base, topic, group, _bool(is_retry_topic(topic))], value)
        if others:
            for i, family in enumerate(families):
                total = sum(v[i] for pair, v in state.items() if pair not in kept_pairs)
                family.add_metric([*self.base, OTHERS, OTHERS, "false"], total)
        yield from families

    # -- transactions ------------------------------------------------------------------------------------------------

    def _transactions(self) -> Iterator[Metric]:
        values = self.transactions.counter_values()

        def counter(name: str, doc: str, key: str) -> Metric:
            family = self._family(CounterMetricFamily, name, doc, [])
            family.add_metric(self.base, values.get(key, 0))
            return family

        def gauge(name: str, doc: str, key: str) -> Metric:
            family = self._family(GaugeMetricFamily, name, doc, [])
            family.add_metric(self.base, values.get(key, 0))
            return family

        yield gauge("rocketmq_half_messages", "Transactions in doubt (prepared, not yet decided).", "inDoubt")
        yield counter("rocketmq_commit_messages_total", "Transactional messages committed.", "commits")
        yield counter("rocketmq_rollback_messages_total", "Transactional messages rolled back.", "rollbacks")
        yield counter("txmq_transaction_half_messages_total", "Half messages prepared.", "halfMessages")
        yield counter(
            "txmq_transaction_checks_total", "Check-backs sent to a live producer of the group.", "checksSent"
        )
        yield counter("txmq_transaction_check_answers_total", "Answers to check-backs.", "checkAnswers")
        yield counter(
            "txmq_transaction_discards_total",
            "Transactions discarded after transactionCheckMax checks (to TRANS_CHECK_MAX_TIME_TOPIC).",
            "discards",
        )
        yield gauge(
            "txmq_transaction_discarded", "Discarded transactions an operator may still resume.", "discardedNow"
        )
        yield counter(
            "txmq_transaction_operator_resolutions_total",
            "Transactions resolved by an operator.",
            "operatorResolutions",
        )
        yield counter(
            "txmq_transaction_refused_decisions_total",
            "Decisions refused because another one came first.",
            "refusedDecisions",
        )

    # -- storage -----------------------------------------------------------------------------------------------------

    def _storage(self) -> Iterator[Metric]:
        store = self.store
        labels = ["storage_type", "storage_medium"]
        where = [*self.base, "local", "disk"]
        size = self._family(
            GaugeMetricFamily, "rocketmq_storage_size", "Bytes of commit-log segment files on disk.", labels
        )
        size.add_metric(where, sum(seg.size for seg in store.commit_log.segments))
        yield size
        behind = self._family(
            GaugeMetricFamily,
            "rocketmq_storage_flush_behind_bytes",
            "Commit-log bytes written but not yet fsynced.",
            labels,
        )
        behind.add_metric(where, max(0, store.written_physical_offset() - store.flushed_physical_offset()))
        yield behind
        hist = store.statistics.flush_latency_us
        buckets: list[tuple[str, float]] = []
        counts = list(hist.buckets)
        running = 0
        exponents = list(FLUSH_BUCKET_EXPONENTS)
        # Store bucket i holds values below 2**i microseconds; cumulative counts up to it are "le 2**i us".
        for i, n in enumerate(counts):
            running += n
            if i in exponents:
                buckets.append((_float_text((1 << i) / 1e6), running))
        buckets.append(("+Inf", sum(counts)))
        flush = self._family(
            HistogramMetricFamily,
            "txmq_storage_flush_latency_seconds",
            "Time of each commit-log fdatasync.",
            [],
        )
        flush.add_metric(self.base, buckets, sum_value=hist.total / 1e6)
        yield flush
        waits = self._family(
            CounterMetricFamily,
            "txmq_storage_group_commit_waits_total",
            "Group-commit waits: the writer waited (groupCommitWaitMicros at most) for more requests to share a sync.",
            [],
        )
        waits.add_metric(self.base, store.statistics.group_waits)
        yield waits

    # -- connections -------------------------------------------------------------------------------------------------

    def _connections(self) -> Iterator[Metric]:
        producers: dict[tuple[str, str, str], int] = {}
        for channels in list(self.clients.producers.values()):
            for channel in list(channels.values()):
                key = (channel.language, str(channel.version), _door(channel.connection))
                producers[key] = producers.get(key, 0) + 1
        consumers: dict[tuple[str, str, str, str, str], int] = {}
        for group, info in list(self.clients.consumers.items()):
            mode = "push" if info.consume_type == "CONSUME_PASSIVELY" else "pull"
            for channel in list(info.channels.values()):
                key = (group, channel.language, str(channel.version), mode, _door(channel.connection))
                consumers[key] = consumers.get(key, 0) + 1
        pf = self._family(
            GaugeMetricFamily,
            "rocketmq_producer_connections",
            "Producer channels (one per producer group and connection).",
            ["language", "version", "protocol_type"],
        )
        for key, n in sorted(producers.items()):
            pf.add_metric([*self.base, *key], n)
        yield pf
        cf = self._family(
            GaugeMetricFamily,
            "rocketmq_consumer_connections",
            "Consumer channels per group.",
            ["consumer_group", "language", "version", "consume_mode", "protocol_type"],
        )
        kept, _, _ = _top(consumers.items(), self.limit)
        for key, n in sorted(kept):
            cf.add_metric([*self.base, *key], n)
        yield cf
        conns = self._family(
            GaugeMetricFamily, "txmq_connections", "Open client connections per door.", ["protocol_type"]
        )
        conns.add_metric([*self.base, "remoting"], len(self.server.connections))
        yield conns

    def _rpc_latency(self) -> Metric:
        assert self.rpc is not None
        family = self._family(
            HistogramMetricFamily,
            "rocketmq_rpc_latency",
            "Time from a request's arrival at its processor to its response, in milliseconds.",
            ["protocol_type", "request_code", "response_code", "is_long_polling", "result"],
        )
        for (code, response, long_polling, oneway), row in sorted(self.rpc.table.items()):
            running = 0.0
            buckets = []
            for bound, n in zip(RPC_BUCKETS_MS, row, strict=False):
                running += n
                buckets.append((_float_text(bound), running))
            buckets.append(("+Inf", running + row[len(RPC_BUCKETS_MS)]))
            family.add_metric(
                [
                    *self.base,
                    "remoting",
                    request_code_name(code),
                    "" if response < 0 else response_code_name(response),
                    _bool(long_polling),
                    "oneway" if oneway else ("success" if response >= 0 else "process_request_failed"),
                ],
                buckets,
                sum_value=row[-1],
            )
        return family


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _float_text(value: float) -> str:
    return repr(float(value))


def _door(connection: Any) -> str:
    return "grpc" if type(connection).__module__.startswith("txmq.door_grpc") else "remoting"


class MetricsServer:
    """``GET /metrics`` in Prometheus's text format (aiohttp, in the broker's event loop)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._runner: Any = None

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                exc.errno,
                f"the metrics port {self.host}:{self.port} cannot be bound ({exc.strerror}); "
                "set metricsPort to a free port, or 0 to turn /metrics off",
            ) from exc
        self._runner = runner
        if self.port == 0:
            self.port = runner.addresses[0][1]

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
