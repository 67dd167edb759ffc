"""The asyncio :class:`Admin`: topics, cluster and broker info, message lookups, topic and consumer statistics."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from txmq.client import fastjson
from txmq.client.lifecycle import ClientLifecycle
from txmq.client.message import MessageExt, MessageQueue, retry_topic
from txmq.client.producer import check_topic
from txmq.client.route import TopicRoute
from txmq.errors import MQBrokerError, MQClientError, NoRouteError, RecordDecodeError, RemotingError
from txmq.protocol.codes import ResponseCode, TxmqReplicaRequestCode, TxmqRequestCode
from txmq.protocol.headers import CreateTopicRequestHeader
from txmq.protocol.record import Prop, decode_offset_msg_id

log = logging.getLogger("txmq.client")


@dataclass(slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: broker name -> {broker id: address}, cluster name -> broker names."""

    broker_addrs: dict[str, dict[int, str]] = field(default_factory=dict)
    broker_clusters: dict[str, str] = field(default_factory=dict)
    clusters: dict[str, list[str]] = field(default_factory=dict)

    def master_addrs(self, cluster: str | None = None) -> list[str]:
        names = self.clusters.get(cluster, []) if cluster is not None else list(self.broker_addrs)
        return sorted(a for n in names if (a := self.broker_addrs.get(n, {}).get(0)) is not None)


@dataclass(slots=True)
class TopicOffset:
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(slots=True)
class OffsetWrapper:
    broker_offset: int
    consumer_offset: int
    last_timestamp: int


@dataclass(slots=True)
class ConsumeStats:
    offset_table: dict[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    @property
    def diff_total(self) -> int:
        """Messages not yet consumed (the group's lag), summed over queues."""
        return sum(max(0, w.broker_offset - w.consumer_offset) for w in self.offset_table.values())


def _mq_from_key(key: Any) -> MessageQueue | None:
    if isinstance(key, str):
        try:
            key = fastjson.loads(key)
        except ValueError:
            return None
    if isinstance(key, Mapping):
        try:
            return MessageQueue.from_json(key)
        except (KeyError, TypeError, ValueError):
            return None
    return None


def parse_mq_table(table: Any) -> dict[MessageQueue, Any]:
    """A map keyed by MessageQueue in any of the shapes brokers write.

    fastjson's object keys (``{{"brokerName":..}:{..}}``), standard JSON with the key object as a string
    (``{"{\\"brokerName\\":..}":{..}}``), or a list of ``[key, value]`` / ``{"key":..,"value":..}`` entries.
    Entries whose key is not a queue are skipped.
    """
    pairs: list[tuple[Any, Any]] = []
    if isinstance(table, Mapping):
        pairs = list(table.items())
    elif isinstance(table, list):
        for entry in table:
            if isinstance(entry, list | tuple) and len(entry) == 2:
                pairs.append((entry[0], entry[1]))
            elif isinstance(entry, Mapping) and "key" in entry and "value" in entry:
                pairs.append((entry["key"], entry["value"]))
    out: dict[MessageQueue, Any] = {}
    for key, value in pairs:
        mq = _mq_from_key(key)
        if mq is None:
            log.debug("skipping a stats entry whose key is not a message queue: %r", key)
            continue
        out[mq] = value
    return out


def parse_consume_stats(body: bytes | str | Any) -> ConsumeStats:
    data = fastjson.loads(body) if isinstance(body, bytes | str) else body
    stats = ConsumeStats(consume_tps=float((data or {}).get("consumeTps") or 0.0))
    for mq, w in parse_mq_table((data or {}).get("offsetTable") or {}).items():
        stats.offset_table[mq] = OffsetWrapper(
            int(w.get("brokerOffset", 0)), int(w.get("consumerOffset", 0)), int(w.get("lastTimestamp", 0))
        )
    return stats


def parse_topic_stats(body: bytes | str | Any) -> dict[MessageQueue, TopicOffset]:
    data = fastjson.loads(body) if isinstance(body, bytes | str) else body
    return {
        mq: TopicOffset(int(v.get("minOffset", 0)), int(v.get("maxOffset", 0)), int(v.get("lastUpdateTimestamp", 0)))
        for mq, v in parse_mq_table((data or {}).get("offsetTable") or {}).items()
    }


def looks_like_offset_msg_id(msg_id: str) -> bool:
    """Whether ``msg_id`` decodes as an offsetMsgId with a plausible port and offset.

    A UNIQ_KEY has the same length; its bytes 4..7 are a pid and a random token, which almost never form a port
    (the top two bytes of an offsetMsgId's port field are zero).
    """
    try:
        (_, port), offset = decode_offset_msg_id(msg_id)
    except RecordDecodeError:
        return False
    return 0 < port < 65536 and offset >= 0


class Admin(ClientLifecycle):
    """Administration calls against the name servers and brokers of a cluster."""

    _what = "admin client"

    def __init__(self, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(namesrv_addr, **options)

    # -- cluster and topics ---------------------------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        data = await self.instance.api.get_cluster_info()
        info = ClusterInfo()
        for name, b in (data.get("brokerAddrTable") or {}).items():
            addrs = {}
            for k, v in (b.get("brokerAddrs") or {}).items():
                try:
                    addrs[int(k)] = str(v)
                except (TypeError, ValueError):
                    continue
            info.broker_addrs[str(name)] = addrs
            info.broker_clusters[str(name)] = str(b.get("cluster", ""))
        for cluster, names in (data.get("clusterAddrTable") or {}).items():
            info.clusters[str(cluster)] = sorted(str(n) for n in names)
        return info

    async def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's version, offsets, put/get counters (all values are strings)."""
        return await self.instance.api.get_broker_runtime_info(broker_addr)

    async def cluster_runtime_info(self) -> dict[str, dict[str, str]]:
        """Runtime info of every broker the name server knows, keyed by address (what ``mqadmin clusterList`` shows).

        A broker that does not answer maps to ``{"error": ...}`` instead of failing the whole listing.
        """
        info = await self.cluster_info()
        out: dict[str, dict[str, str]] = {}
        for addrs in info.broker_addrs.values():
            for addr in sorted(addrs.values()):
                try:
                    out[addr] = await self.broker_runtime_info(addr)
                except (RemotingError, MQClientError) as exc:
                    out[addr] = {"error": str(exc)}
        return out

    async def topic_list(self) -> list[str]:
        return await self.instance.api.get_topic_list()

    async def topic_route(self, topic: str) -> TopicRoute:
        return await self.instance.api.get_topic_route(topic)

    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        order: bool = False,
        topic_filter_type: str = "SINGLE_TAG",
    ) -> list[str]:
        """Create or update ``topic`` on one broker or on every master of a cluster; returns the addresses."""
        check_topic(topic)
        if (cluster is None) == (broker_addr is None):
            raise MQClientError("give exactly one of cluster= or broker_addr=")
        if broker_addr is not None:
            addrs = [broker_addr]
        else:
            info = await self.cluster_info()
            if cluster not in info.clusters:
                raise MQClientError(
                    f"cluster {cluster!r} is unknown to the name server (known: {sorted(info.clusters)})"
                )
            addrs = info.master_addrs(cluster)
            if not addrs:
                raise MQClientError(f"cluster {cluster!r} has no master broker online")
        header = CreateTopicRequestHeader(
            topic=topic,
            readQueueNums=read_queue_nums,
            writeQueueNums=write_queue_nums,
            perm=perm,
            topicFilterType=topic_filter_type,
            topicSysFlag=0,
            order=order,
        )
        for addr in addrs:
            await self.instance.api.create_topic(addr, header)
        return addrs

    async def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        """Min/max offsets and last store time of every queue of ``topic`` (GET_TOPIC_STATS_INFO per broker)."""
        route = await self.topic_route(topic)
        out: dict[MessageQueue, TopicOffset] = {}
        for addr in route.master_addrs():
            out.update(parse_topic_stats(await self.instance.api.get_topic_stats(addr, topic)))
        return dict(sorted(out.items()))

    # -- consumers ------------------------------------------------------------------------------------------------

    async def _group_broker_addrs(self, group: str, topic: str | None) -> list[str]:
        addrs: set[str] = set()
        for t in (retry_topic(group), topic):
            if t is None:
                continue
            try:
                addrs.update((await self.topic_route(t)).master_addrs())
            except NoRouteError:
                continue
        if not addrs:
            raise NoRouteError(topic or retry_topic(group), f"no broker knows consumer group {group}")
        return sorted(addrs)

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """Committed vs. broker offsets of ``group`` per queue (GET_CONSUME_STATS on each broker of the group)."""
        total = ConsumeStats()
        for addr in await self._group_broker_addrs(group, topic):
            stats = parse_consume_stats(await self.instance.api.get_consume_stats(addr, group, topic))
            total.offset_table.update(stats.offset_table)
            total.consume_tps += stats.consume_tps
        total.offset_table = dict(sorted(total.offset_table.items()))
        return total

    async def consumer_ids(self, group: str) -> list[str]:
        """Client ids of the group's online consumers (GET_CONSUMER_LIST_BY_GROUP), merged over its brokers."""
        ids: set[str] = set()
        errors: list[BaseException] = []
        for addr in await self._group_broker_addrs(group, None):
            try:
                ids.update(await self.instance.api.get_consumer_id_list(addr, group))
            except MQBrokerError as exc:
                errors.append(exc)
        if not ids and errors:
            raise errors[0]
        return sorted(ids)

    async def consumer_connections(self, group: str) -> dict[str, Any]:
        """The broker's ConsumerConnection view (GET_CONSUMER_CONNECTION_LIST) from the first broker that has it."""
        last: BaseException | None = None
        for addr in await self._group_broker_addrs(group, None):
            try:
                return dict(await self.instance.api.get_consumer_connection_list(addr, group))
            except MQBrokerError as exc:
                last = exc
        assert last is not None
        raise last

    async def reset_offset(self, group: str, topic: str, to: str | int) -> list[dict[str, Any]]:
        """Move ``group``'s offsets on ``topic`` to ``"earliest"``, ``"latest"`` or the first message stored at or
        after a timestamp (epoch ms), on every broker of the topic; online consumers restart from there."""
        from txmq.protocol.codes import TxmqConsumerRequestCode

        check_topic(topic)
        target = str(to).strip().lower()
        if target not in ("earliest", "latest") and not target.isdigit():
            raise MQClientError(f"reset target must be earliest, latest or a timestamp in ms, got {to!r}")
        rows: list[dict[str, Any]] = []
        for addr in (await self.topic_route(topic)).master_addrs():
            data = await self.instance.api.txmq_consumer_admin(
                addr,
                TxmqConsumerRequestCode.RESET_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic, "to": target},
            )
            for row in data.get("offsets") or []:
                row["notifiedConsumers"] = data.get("notifiedConsumers", 0)
                rows.append(row)
        return sorted(rows, key=lambda r: (r.get("brokerName", ""), int(r.get("queueId", 0))))

    async def _dlq_brokers(self, group: str) -> list[str]:
        try:
            return (await self.topic_route(f"%DLQ%{group}")).master_addrs()
        except NoRouteError:
            return []

    async def dead_letters(self, group: str, max_num: int = 1000) -> list[dict[str, Any]]:
        """The messages in ``%DLQ%<group>``: origin topic and id, reconsume times, store time, reason, resent."""
        from txmq.protocol.codes import TxmqConsumerRequestCode

        rows: list[dict[str, Any]] = []
        for addr in await self._dlq_brokers(group):
            data = await self.instance.api.txmq_consumer_admin(
                addr, TxmqConsumerRequestCode.LIST_DEAD_LETTERS, {"consumerGroup": group, "maxNum": str(max_num)}
            )
            for row in data.get("messages") or []:
                row["brokerAddr"] = addr
                rows.append(row)
        return sorted(rows, key=lambda r: (int(r.get("storeTimestamp", 0)), r.get("offsetMsgId", "")))[:max_num]

    async def resend_dead_letters(
        self, group: str, msg_ids: Sequence[str] | None = None, *, all_messages: bool = False
    ) -> dict[str, list[str]]:
        """Put dead letters back on ``%RETRY%<group>`` (only that group consumes them again; other groups of the
        original topic do not) with the reconsume count reset. Ids are offsetMsgIds,
        UNIQ_KEYs or ORIGIN_MESSAGE_IDs. A message already resent is reported under ``alreadyResent``."""
        from txmq.protocol.codes import TxmqConsumerRequestCode

        if not all_messages and not msg_ids:
            raise MQClientError("give message ids or all_messages=True")
        ext = {"consumerGroup": group}
        if all_messages:
            ext["all"] = "true"
        else:
            ext["msgIds"] = ",".join(msg_ids or [])
        report: dict[str, list[str]] = {"resent": [], "alreadyResent": [], "notFound": [], "failed": []}
        brokers = await self._dlq_brokers(group)
        for addr in brokers:
            data = await self.instance.api.txmq_consumer_admin(addr, TxmqConsumerRequestCode.RESEND_DEAD_LETTERS, ext)
            for key in report:
                report[key].extend(str(v) for v in data.get(key) or [])
        # With several brokers an id is "not found" only if no broker had it.
        found = set(report["resent"]) | set(report["alreadyResent"]) | {f.split(":")[0] for f in report["failed"]}
        report["notFound"] = sorted(set(report["notFound"]) - found) if brokers else list(msg_ids or [])
        return report

    # -- messages -------------------------------------------------------------------------------------------------

    async def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """Find a message by id: an offsetMsgId is read from the broker it names (VIEW_MESSAGE_BY_ID); a
        UNIQ_KEY (the id producers report) is searched in ``topic``'s index (QUERY_MESSAGE)."""
        if looks_like_offset_msg_id(msg_id):
            (host, port), offset = decode_offset_msg_id(msg_id)
            try:
                msg = await self.instance.api.view_message(f"{host}:{port}", offset)
                if msg.offset_msg_id.upper() == msg_id.upper():
                    return msg
            except (RemotingError, MQClientError) as exc:
                if topic is None:
                    raise
                log.debug("%s is not a readable offsetMsgId (%s); trying it as a UNIQ_KEY", msg_id, exc)
        if topic is None:
            raise MQClientError(f"{msg_id} is not an offsetMsgId; pass topic= to look it up as a UNIQ_KEY")
        found = await self.query_message_by_uniq_key(topic, msg_id)
        if not found:
            raise MQClientError(f"no message with id {msg_id} in topic {topic}")
        return found[0]

    async def query_message_by_uniq_key(
        self, topic: str, uniq_key: str, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[MessageExt]:
        """Every stored copy of the message with this UNIQ_KEY (retries and transactions can store several)."""
        return await self._query(topic, uniq_key, 32, begin_ms, end_ms, unique=True)

    async def query_message_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS contain ``key`` (QUERY_MESSAGE on every broker, filtered here)."""
        return await self._query(topic, key, max_num, begin_ms, end_ms, unique=False)

    async def _query(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int | None, *, unique: bool
    ) -> list[MessageExt]:
        instance = self.instance
        route = await self.topic_route(topic)
        end = end_ms if end_ms is not None else instance.clock.now_ms() + 60_000
        found: dict[tuple[str, int], MessageExt] = {}
        for b in route.broker_datas:
            addr = b.master_addr() or b.any_addr()
            if addr is None:
                continue
            msgs = await instance.api.query_message(
                addr, topic, key, max_num, begin_ms, end, unique_key=unique, broker_name=b.broker_name
            )
            for m in msgs:
                # The index matches on hash codes, so collisions come back too: keep exact matches only.
                ok = m.properties.get(Prop.UNIQ_KEY) == key if unique else key in m.keys
                if ok and m.topic == topic:
                    found[(b.broker_name, m.commit_log_offset)] = m
        return sorted(found.values(), key=lambda m: (m.store_timestamp, m.commit_log_offset))[: max(1, max_num)]

    # -- transactions (txmq's own admin requests; docs/transactions.md) --------------------------------------------

    async def _master_addrs(self) -> list[str]:
        addrs = (await self.cluster_info()).master_addrs()
        if not addrs:
            raise MQClientError("no master broker is registered with the name server")
        return addrs

    async def list_transactions(
        self,
        group: str | None = None,
        topic: str | None = None,
        older_than_ms: int | None = None,
        limit: int = 100,
        states: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """In-doubt transactions (PREPARED and DISCARDED unless ``states`` says otherwise) of every master broker,
        oldest first, at most ``limit``. Each row carries ``brokerName`` and ``brokerAddr``."""
        if limit < 0:
            raise MQClientError(f"limit must be >= 0, got {limit}")
        body: dict[str, Any] = {"limit": limit}
        if group:
            body["group"] = group
        if topic:
            body["topic"] = topic
        if older_than_ms is not None:
            body["olderThanMs"] = older_than_ms
        if states:
            body["states"] = [s.upper() for s in states]
        rows: list[dict[str, Any]] = []
        for addr in await self._master_addrs():
            data = await self.instance.api.txmq_admin(addr, TxmqRequestCode.TXMQ_LIST_TRANSACTIONS, body)
            for row in data.get("transactions") or []:
                row.setdefault("brokerName", data.get("brokerName"))
                row.setdefault("brokerAddr", addr)
                rows.append(row)
        rows.sort(key=lambda r: (int(r.get("preparedAt") or 0), str(r.get("brokerAddr"))))
        return rows[:limit]

    async def _on_owner(self, code: TxmqRequestCode, body: dict[str, Any]) -> dict[str, Any]:
        """Send ``body`` to each master until one knows the transaction (QUERY_NOT_FOUND means: ask the next)."""
        ident = body["id"]
        not_found: list[str] = []
        for addr in await self._master_addrs():
            try:
                data = await self.instance.api.txmq_admin(addr, code, body)
            except MQBrokerError as exc:
                if exc.code == ResponseCode.QUERY_NOT_FOUND:
                    not_found.append(addr)
                    continue
                raise
            out = dict(data.get("transaction") or {})
            out.setdefault("brokerName", data.get("brokerName"))
            out.setdefault("brokerAddr", addr)
            return out
        raise MQBrokerError(
            ResponseCode.QUERY_NOT_FOUND,
            f"no broker knows transaction {ident} (asked {', '.join(not_found)}); give a transaction id, UNIQ_KEY, "
            "or the msgId of its half, delivered or discarded message",
        )

    async def transaction(self, ident: str) -> dict[str, Any]:
        """One transaction's history by transaction id, UNIQ_KEY or msgId (half, delivered or discarded copy)."""
        return await self._on_owner(TxmqRequestCode.TXMQ_GET_TRANSACTION, {"id": ident})

    async def resolve_transaction(self, ident: str, decision: str) -> dict[str, Any]:
        """Commit or roll back an in-doubt transaction by hand ("commit" or "rollback"). Refused (MQBrokerError,
        TRANSACTION_FAILED) once anything decided it; returns the transaction afterwards."""
        normalized = decision.strip().upper()
        if normalized not in ("COMMIT", "ROLLBACK"):
            raise MQClientError(f'decision must be "commit" or "rollback", got {decision!r}')
        return await self._on_owner(TxmqRequestCode.TXMQ_RESOLVE_TRANSACTION, {"id": ident, "decision": normalized})

    async def resume_transaction(self, ident: str) -> dict[str, Any]:
        """Put a DISCARDED transaction back in its broker's pending table: checks start again from zero."""
        return await self._on_owner(TxmqRequestCode.TXMQ_RESUME_TRANSACTION, {"id": ident})

    async def promote_broker(self, broker_addr: str, role: str = "ASYNC_MASTER", *, force: bool = False) -> Any:
        """Make the slave at ``broker_addr`` its brokerName's master (manual failover, as RocketMQ 4.x without a
        controller). Refused while the name server still lists a master, unless ``force``."""
        body = {"brokerRole": role, "force": force}
        return await self.instance.api.txmq_admin(
            broker_addr,
            TxmqReplicaRequestCode.TXMQ_PROMOTE_BROKER,  # type: ignore[arg-type]
            body,
            timeout=30.0,
        )

    async def transaction_counters(self) -> dict[str, dict[str, int]]:
        """The transaction counters of every master broker, keyed by address."""
        out: dict[str, dict[str, int]] = {}
        for addr in await self._master_addrs():
            data = await self.instance.api.txmq_admin(addr, TxmqRequestCode.TXMQ_TRANSACTION_COUNTERS, {})
            out[addr] = {str(k): int(v) for k, v in (data.get("counters") or {}).items()}
        return out

    # -- ACL (codes 50-53 on each broker; docs in README "Access control") -----------------------------------------

    async def master_broker_addrs(self, cluster: str | None = None) -> list[str]:
        """Master addresses of ``cluster`` (every cluster when None), from the name server."""
        info = await self.cluster_info()
        if cluster is not None and cluster not in info.clusters:
            raise MQClientError(f"cluster {cluster!r} is unknown to the name server (known: {sorted(info.clusters)})")
        return info.master_addrs(cluster)

    async def acl_info(self, broker_addr: str) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_ACL_INFO: RocketMQ's version fields plus txmq's body (accounts with masked secrets,
        global whitelist, per-file digests and whether each file's content is in force)."""
        from txmq.protocol.codes import RequestCode

        resp = await self.instance.api.acl_request(broker_addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {})
        info: dict[str, Any] = dict(resp.ext_fields)
        if resp.body:
            info.update(fastjson.loads(resp.body))
        return info

    async def update_acl_account(
        self,
        broker_addr: str,
        access_key: str,
        *,
        secret_key: str | None = None,
        white_remote_address: str | None = None,
        admin: bool | None = None,
        default_topic_perm: str | None = None,
        default_group_perm: str | None = None,
        topic_perms: Sequence[str] | None = None,
        group_perms: Sequence[str] | None = None,
    ) -> str:
        """UPDATE_AND_CREATE_ACL_CONFIG. None leaves a field as it is; ``topic_perms`` / ``group_perms``
        (``name=PERM`` items) replace the account's whole list. Returns the broker's remark (the file written)."""
        from txmq.protocol.codes import RequestCode

        ext = {"accessKey": access_key}
        optional = {
            "secretKey": secret_key,
            "whiteRemoteAddress": white_remote_address,
            "admin": None if admin is None else ("true" if admin else "false"),
            "defaultTopicPerm": default_topic_perm,
            "defaultGroupPerm": default_group_perm,
            "topicPerms": None if topic_perms is None else ",".join(topic_perms),
            "groupPerms": None if group_perms is None else ",".join(group_perms),
        }
        ext.update({k: v for k, v in optional.items() if v is not None})
        resp = await self.instance.api.acl_request(broker_addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ext)
        return resp.remark or ""

    async def delete_acl_account(self, broker_addr: str, access_key: str) -> str:
        """DELETE_ACL_CONFIG."""
        from txmq.protocol.codes import RequestCode

        ext = {"accessKey": access_key}
        resp = await self.instance.api.acl_request(broker_addr, RequestCode.DELETE_ACL_CONFIG, ext)
        return resp.remark or ""

    async def update_global_white_addrs(
        self, broker_addr: str, addresses: Sequence[str], acl_file: str | None = None
    ) -> str:
        """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: replace the global whitelist of the broker's main ACL file (or of
        ``acl_file``, one of its files). An empty list clears it."""
        from txmq.protocol.codes import RequestCode

        ext = {"globalWhiteAddrs": ",".join(addresses)}
        if acl_file:
            ext["aclFileFullPath"] = acl_file
        resp = await self.instance.api.acl_request(broker_addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, ext)
        return resp.remark or ""
